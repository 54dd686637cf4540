"""2-rank DDP (ddp_fork) and DeepSpeed ZeRO-2 / ZeRO-3 (CPU, gloo) runs equal the single-process run.

Each strategy runs the callbacks as a user would, in forked worker processes, and the test
compares what rank 0 wrote (scores.json, plan.json, calibration.json, the exported checkpoint)
and what every rank computed (its plan, its model's expert counts afterwards) with one
in-process run of the same job:

- calibrate (from a checkpoint, which under ZeRO-3 is loaded inside Lightning's ``zero.Init``):
  ExpertStats + ExpertPruning("aimer", uniform; weights, gathered one layer at a time under ZeRO-3) + ExpertPruning("reap", global; statistics summed across ranks) + Export of the
  AIMER plan (ZeRO-3: the model un-partitioned module by module onto rank 0 first);
- fit: router LoRA for a few steps, then RouterDelta (weight delta), prune and export (ZeRO-3 also with
  DeepSeek-V3, whose MoE block, unlike Qwen3-MoE's, is not one of DeepSpeed's leaf modules);
- fit under a ZeRO-3 training engine (every weight trains), then AIMER and Export;
- the shipped configs/deepspeed files build Lightning's DeepSpeedStrategy from the command line.

Tolerances: AIMER reads bit-identical weights (a ZeRO-3 gather copies the partitions back) and
reduces them in float64, so its scores must agree to 1e-12 relative. REAP sums fp32 forwards over
differently composed batches (the distributed sampler interleaves the ranks): ~1e-7 relative, so
rtol 1e-6 as in test_calibrate_ddp. The router weight delta comes out of 3 AdamW steps whose
gradients are averaged over 2 ranks of 2 sequences instead of one batch of 4: fp32 rounding in
the gradient sums, amplified by AdamW's normalisation on near-zero LoRA factors, stays below
1e-5 relative and 1e-7 absolute on these scores (|delta| ~1e-3). Plans must be equal exactly and
exported weights bit for bit (the base weights are never trained).
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from fixtures import REPO
from fixtures.cpu_deepspeed import CPUDeepSpeedStrategy
from safetensors.torch import load_file

import lightprune as lp
from lightprune.callbacks import ExpertPruning, ExpertStats, Export, RouterDelta
from lightprune.cli.trainer import PruneTrainer
from lightprune.core.distributed import has_partitioned
from lightprune.data import SyntheticTokens
from lightprune.finetune import MoECausalLM
from lightprune.models import find_moe_layers

# exhaustive tier: two processes per test (DDP, DeepSpeed ZeRO on CPU)
pytestmark = [pytest.mark.distributed, pytest.mark.exhaustive]

DATA = {"num_samples": 8, "seq_len": 10, "batch_size": 2, "seed": 7}
LORA = {"kind": "lora", "targets": ["router"], "r": 4, "alpha": 4, "dropout": 0.0}
STRATEGIES = ("ddp", "zero2", "zero3")


def _strategy(name: str):
    if name == "ddp":
        return "ddp_fork"
    return CPUDeepSpeedStrategy(stage={"zero2": 2, "zero3": 3}[name])


class _PerRank(pl.Callback):
    """Last in the list: every rank records its plans and what its model looks like after the job."""

    def __init__(self, out: Path):
        self.out = out

    def _write(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        plans = {type(cb).__name__ + str(i): cb.plan.keep for i, cb in enumerate(trainer.callbacks)
                 if getattr(cb, "plan", None) is not None}
        model = pl_module.model
        record = {"plans": {k: {str(l): ids for l, ids in v.items()} for k, v in plans.items()},
                  "experts": {str(l.index): l.num_experts for l in find_moe_layers(model)},
                  "partitioned": has_partitioned(model),
                  "devices": sorted({p.device.type for p in model.parameters()})}
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))

    def on_calibrate_end(self, trainer, pl_module):
        self._write(trainer, pl_module)

    def on_fit_end(self, trainer, pl_module):
        self._write(trainer, pl_module)


def _trainer(run: Path, devices: int, strategy, callbacks, **kw) -> PruneTrainer:
    return PruneTrainer(accelerator="cpu", devices=devices, strategy=strategy, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(run), callbacks=[*callbacks, _PerRank(run)], **kw)


def _calibrate(run: Path, checkpoint: Path, devices: int = 1, strategy="auto", sequential: bool = False) -> Path:
    """From a checkpoint: under ZeRO-3 it is loaded inside Lightning's zero.Init (load_pruned keeps it whole)."""
    run.mkdir(parents=True)
    pl.seed_everything(0, verbose=False)
    callbacks = [ExpertStats(subsets=["all"]), ExpertPruning("aimer", ratio=0.5),
                 ExpertPruning("reap", ratio=0.5, allocation="global", output_dir=str(run / "reap")),
                 Export(overwrite=True, summary=False)]
    module = MoECausalLM(checkpoint=str(checkpoint), sequential=sequential)
    _trainer(run, devices, strategy, callbacks).calibrate(module, datamodule=SyntheticTokens(**DATA))
    return run


def _fit(run: Path, devices: int = 1, strategy="auto", family: str = "qwen3_moe") -> Path:
    run.mkdir(parents=True)
    pl.seed_everything(0, verbose=False)
    # one global batch of 4 sequences per step: the distributed sampler shuffles, so only a batch that is the
    # whole data set is the same set of sequences in both runs
    data = dict(DATA, num_samples=4, batch_size=4 // devices)
    callbacks = [RouterDelta(score="weight"), ExpertPruning(criterion="router_delta", ratio=0.5),
                 Export(overwrite=True, summary=False)]
    trainer = _trainer(run, devices, strategy, callbacks, max_steps=3, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(MoECausalLM(tiny=family, adapter=LORA, learning_rate=5e-2, scheduler="constant"),
                datamodule=SyntheticTokens(**data))
    return run


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict[str, Path]:
    from lightprune.testing.tiny import tiny_model

    base = tmp_path_factory.mktemp("single")
    tiny_model("qwen3_moe").save_pretrained(base / "ckpt")
    return {"ckpt": base / "ckpt", "calibrate": _calibrate(base / "calibrate", base / "ckpt"), "fit": _fit(base / "fit")}


def _scores(path: Path) -> dict[str, dict[str, torch.Tensor]]:
    data = json.loads(path.read_text())
    return {name: {l: torch.tensor(v, dtype=torch.float64) for l, v in entry["raw"].items()}
            for name, entry in data.items()}


def _assert_scores(got: Path, want: Path, rtol: float, atol: float) -> None:
    got, want = _scores(got), _scores(want)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].keys() == want[name].keys()
        for layer in want[name]:
            torch.testing.assert_close(got[name][layer], want[name][layer], rtol=rtol, atol=atol)


def _assert_weights(got: Path, want: Path) -> None:
    a = {k: v for f in sorted(got.glob("*.safetensors")) for k, v in load_file(f).items()}
    b = {k: v for f in sorted(want.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert a.keys() == b.keys()
    for key in b:
        assert torch.equal(a[key], b[key]), key


def _assert_ranks(run: Path, want_plans: dict, want_experts: dict, stage3: bool) -> None:
    ranks = [json.loads((run / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r, record in enumerate(ranks):
        assert record["plans"] == want_plans, f"rank {r}"
        assert record["experts"] == want_experts, f"rank {r}"  # the same pruned architecture everywhere
        assert not record["partitioned"]
    if stage3:  # values on rank 0 only; the other rank keeps shapes on the meta device
        assert ranks[0]["devices"] == ["cpu"] and ranks[1]["devices"] == ["meta"]
    else:
        assert ranks[0]["devices"] == ranks[1]["devices"] == ["cpu"]


@pytest.mark.parametrize("name", STRATEGIES)
def test_calibrate_aimer_reap_export_equal_single_process(name: str, single, tmp_path: Path) -> None:
    want = single["calibrate"]
    run = _calibrate(tmp_path / "run", single["ckpt"], devices=2, strategy=_strategy(name))
    assert lp.ExpertPlan.load(run / "plan.json").keep == lp.ExpertPlan.load(want / "plan.json").keep
    assert lp.ExpertPlan.load(run / "reap" / "plan.json").keep == lp.ExpertPlan.load(want / "reap" / "plan.json").keep
    _assert_scores(run / "scores.json", want / "scores.json", rtol=1e-12, atol=0.0)
    _assert_scores(run / "reap" / "scores.json", want / "reap" / "scores.json", rtol=1e-6, atol=1e-9)
    calib, calib_want = (json.loads((p / "calibration.json").read_text()) for p in (run, want))
    assert calib["tokens"] == calib_want["tokens"]
    _assert_weights(run / "model", want / "model")  # rank 0 streamed it from the source checkpoint
    assert json.loads((run / "report.json").read_text())["streamed"] is True
    expected = json.loads((want / "rank0.json").read_text())
    if name != "zero3":
        _assert_ranks(run, expected["plans"], expected["experts"], stage3=False)
        return
    # ZeRO-3: nothing was gathered; every rank's model is as the engine partitioned it, unpruned
    unpruned = {str(l.index): l.num_experts for l in find_moe_layers(lp.load_pruned(single["ckpt"]))}
    for rank in (0, 1):
        record = json.loads((run / f"rank{rank}.json").read_text())
        assert record["plans"] == expected["plans"] and record["partitioned"], rank
        assert record["experts"] == unpruned, rank


def _calibrate_merge(run: Path, checkpoint: Path, devices: int = 1, strategy="auto") -> Path:
    run.mkdir(parents=True)
    pl.seed_everything(0, verbose=False)
    callbacks = [ExpertStats(subsets=["all"], criteria=["frequency", "router_logits"]),
                 ExpertPruning("m_smoe", ratio=0.5), Export(overwrite=True, summary=False)]
    module = MoECausalLM(checkpoint=str(checkpoint))
    _trainer(run, devices, strategy, callbacks).calibrate(module, datamodule=SyntheticTokens(**DATA))
    return run


@pytest.mark.parametrize("name", ["ddp", "zero3"])
def test_m_smoe_merge_across_ranks_equals_single_process(name: str, single, tmp_path: Path) -> None:
    """The router-logit Gram matrices summed across ranks give the single process's merge plan, and rank 0 exports
    the same merged checkpoint bit for bit (the merge is written from the gathered model, never streamed)."""
    want = _calibrate_merge(tmp_path / "single", single["ckpt"])
    run = _calibrate_merge(tmp_path / "run", single["ckpt"], devices=2, strategy=_strategy(name))
    got, expected = (lp.MergePlan.load(p / "merge_plan.json") for p in (run, want))
    assert got.clusters == expected.clusters and got.dominant == expected.dominant
    _assert_weights(run / "model", want / "model")
    assert "streamed" not in json.loads((run / "report.json").read_text())
    records = [json.loads((run / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert records[0]["experts"] == records[1]["experts"] == {str(l): 4 for l in got.clusters}


def test_two_rank_sequential_calibration_streams_the_same_export(single, tmp_path: Path) -> None:
    """MoECausalLM(sequential=True) under DDP: each rank streams the checkpoint layer by layer over its share of
    the batches, the statistics are summed, rank 0 prunes the source checkpoint shard by shard; plans, statistics
    and the exported weights equal the single-process in-memory run, every rank's skeleton takes the pruned
    architecture."""
    want = single["calibrate"]
    run = _calibrate(tmp_path / "run", single["ckpt"], devices=2, strategy="ddp_fork", sequential=True)
    assert lp.ExpertPlan.load(run / "plan.json").keep == lp.ExpertPlan.load(want / "plan.json").keep
    assert lp.ExpertPlan.load(run / "reap" / "plan.json").keep == lp.ExpertPlan.load(want / "reap" / "plan.json").keep
    _assert_scores(run / "reap" / "scores.json", want / "reap" / "scores.json", rtol=1e-6, atol=1e-9)
    _assert_weights(run / "model", want / "model")
    expected = json.loads((want / "rank0.json").read_text())
    for rank in (0, 1):
        record = json.loads((run / f"rank{rank}.json").read_text())
        assert record["experts"] == expected["experts"] and record["devices"] == ["meta"], rank


def test_sequential_is_refused_under_deepspeed(single, tmp_path: Path) -> None:
    # raised in the strategy's process (Lightning hands it back wrapped), before any batch
    with pytest.raises(Exception, match="sequential=True keeps one decoder layer in memory per process; DeepSpeed"):
        _calibrate(tmp_path / "run", single["ckpt"], devices=1, strategy=CPUDeepSpeedStrategy(stage=3),
                   sequential=True)


@pytest.mark.parametrize("name", STRATEGIES)
def test_router_lora_fit_router_delta_equal_single_process(name: str, single, tmp_path: Path) -> None:
    want = single["fit"]
    run = _fit(tmp_path / "run", devices=2, strategy=_strategy(name))
    assert lp.ExpertPlan.load(run / "plan.json").keep == lp.ExpertPlan.load(want / "plan.json").keep
    _assert_scores(run / "scores.json", want / "scores.json", rtol=1e-5, atol=1e-7)
    _assert_weights(run / "model", want / "model")
    expected = json.loads((want / "rank0.json").read_text())
    _assert_ranks(run, expected["plans"], expected["experts"], stage3=name == "zero3")


def test_router_lora_zero3_outside_a_leaf_moe_block_equal_single_process(tmp_path: Path) -> None:
    """DeepSeek-V3's MoE block is not one of DeepSpeed's leaf modules (Qwen3-MoE's is): ZeRO-3 gathers the router
    and each LoRA factor by itself (peft reads the factors in the wrapper's forward: DeepSpeed's external
    parameters), and the fit still equals one process."""
    want = _fit(tmp_path / "single", family="deepseek_v3")
    run = _fit(tmp_path / "zero3", devices=2, strategy=_strategy("zero3"), family="deepseek_v3")
    assert lp.ExpertPlan.load(run / "plan.json").keep == lp.ExpertPlan.load(want / "plan.json").keep
    _assert_scores(run / "scores.json", want / "scores.json", rtol=1e-5, atol=1e-7)
    _assert_weights(run / "model", want / "model")
    expected = json.loads((want / "rank0.json").read_text())
    _assert_ranks(run, expected["plans"], expected["experts"], stage3=True)


@pytest.mark.parametrize("name, stage, offload", [("stage2", 2, False), ("stage3", 3, False),
                                                   ("stage3_offload", 3, True)])
def test_deepspeed_configs_build_the_strategy_from_the_command_line(name: str, stage: int, offload: bool,
                                                                   tmp_path: Path) -> None:
    """``--trainer.strategy configs/deepspeed/<name>.yaml`` gives Lightning's DeepSpeedStrategy (built, not launched)."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from lightprune.cli.app import LightpruneCLI

    root = REPO
    cli = LightpruneCLI(MoECausalLM, None, trainer_class=PruneTrainer, subclass_mode_model=True,
                        subclass_mode_data=True, run=False, auto_configure_optimizers=False,
                        args=["--config", str(root / "configs" / "aimer_tiny.yaml"),
                              "--trainer.default_root_dir", str(tmp_path / "run"),
                              "--trainer.strategy", str(root / "configs" / "deepspeed" / f"{name}.yaml")])
    strategy = cli.trainer.strategy
    assert type(strategy) is DeepSpeedStrategy
    zero = strategy.config["zero_optimization"]
    assert zero["stage"] == stage
    assert ("offload_param" in zero and "offload_optimizer" in zero) == offload
    if offload:  # the LightningModule's torch optimizer is kept (no DeepSpeedCPUAdam build needed)
        assert strategy.config["zero_force_ds_cpu_optimizer"] is False


_FULL_FIT_LR = 1e-3  # the full fit's learning rate: AdamW moves a weight by at most about this per step


def _fit_full(run: Path, devices: int = 1, strategy="auto") -> Path:
    run.mkdir(parents=True)
    pl.seed_everything(0, verbose=False)
    data = dict(DATA, num_samples=4, batch_size=4 // devices)
    callbacks = [ExpertPruning("aimer", ratio=0.5), Export(overwrite=True, summary=False, atol=1e-4)]
    trainer = _trainer(run, devices, strategy, callbacks, max_steps=2, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(MoECausalLM(tiny="qwen3_moe", learning_rate=_FULL_FIT_LR, scheduler="constant"),
                datamodule=SyntheticTokens(**data))
    return run


def test_zero3_full_fit_then_aimer_export_equal_single_process(tmp_path: Path) -> None:
    """A ZeRO-3 training engine (optimizer and partitions live): the job end un-partitions, prunes and exports.

    Every weight trains, so the exported weights carry 2 AdamW steps of fp32 gradients averaged over 2 ranks:
    equal to the single process to ~1e-6 (lr 1e-3 times a rounding-level difference in Adam's normalised step).
    Where a gradient is within a few eps (1e-8) of zero, the step g / (|g| + eps) moves with the gradient's last
    bits, so a few elements may differ by a few percent of a step; a lost partition or a wrong gradient moves
    whole tensors by steps of 1e-3.
    """
    want = _fit_full(tmp_path / "single")
    run = _fit_full(tmp_path / "zero3", devices=2, strategy=_strategy("zero3"))
    assert lp.ExpertPlan.load(run / "plan.json").keep == lp.ExpertPlan.load(want / "plan.json").keep
    _assert_scores(run / "scores.json", want / "scores.json", rtol=1e-5, atol=0.0)
    a = {k: v for f in sorted((run / "model").glob("*.safetensors")) for k, v in load_file(f).items()}
    b = {k: v for f in sorted((want / "model").glob("*.safetensors")) for k, v in load_file(f).items()}
    assert a.keys() == b.keys()
    differ = 0
    for key in b:
        torch.testing.assert_close(a[key], b[key], rtol=0.0, atol=0.05 * _FULL_FIT_LR, msg=key)  # 5% of one step
        differ += int(((a[key].float() - b[key].float()).abs() > 1e-6).sum())
    assert differ <= 1e-3 * sum(v.numel() for v in b.values()), f"{differ} weights differ by more than 1e-6"
    expected = json.loads((want / "rank0.json").read_text())
    _assert_ranks(run, expected["plans"], expected["experts"], stage3=True)


def test_one_process_helpers_are_plain_and_surgery_refuses_a_partitioned_model(tiny) -> None:
    """Without a process group or partitions nothing changes; a (faked) ZeRO-3 parameter is refused by surgery
    with an error that names it and the way out, and the router's full ``ds_shape`` gives the expert count."""
    from lightprune.core.distributed import PartitionedModelError, gathered, materialize, same_on_every_rank

    model = tiny("qwen3_moe")
    layer = find_moe_layers(model)[0]
    before = layer.router.weight.detach().clone()
    with gathered(model.parameters()):
        assert torch.equal(layer.router.weight, before)
    assert same_on_every_rank({0: [1, 2]}, "a plan") == {0: [1, 2]}
    assert materialize(model) == 0
    full = layer.router.weight.shape
    layer.router.weight.data = torch.empty(0)  # what ZeRO-3 leaves outside a gather
    layer.router.weight.ds_id, layer.router.weight.ds_shape = 0, full
    assert find_moe_layers(model)[0].num_experts == full[0]
    plan = lp.select_experts(lp.score_weights(tiny("qwen3_moe"), "magnitude"), 0.25)
    with pytest.raises(PartitionedModelError, match=r"partitioned.*mlp\.gate\.weight.*materialize"):
        lp.prune_experts(model, plan)
