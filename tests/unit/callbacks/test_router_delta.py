"""RouterDelta end to end: a short Lightning fit with an adapter, scores, then ExpertPruning's plan and Export's
checkpoint of the original.

The adapters are built with peft directly (LoRA on the router weight or on attention) inside a
minimal LightningModule, so these tests need nothing from lightprune.finetune; the IA3 / Houlsby
case uses ``lightprune.finetune.adapters`` when it is there.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import lightprune as lp
from lightprune.callbacks import ExpertPruning, Export, RouterDelta
from lightprune.data import SyntheticTokens
from lightprune.experts.sensitivity import router_row_norms
from lightprune.models import find_moe_layers


class AdaptedLM(pl.LightningModule):
    """Next-token loss on ``self.model`` (an adapted model); only trainable parameters are optimised."""

    def __init__(self, model: torch.nn.Module, lr: float = 5e-2):
        super().__init__()
        self.model, self.lr = model, lr
        self.source = "tiny:test"

    def training_step(self, batch, batch_idx):
        logits = self.model(**batch).logits[:, :-1]
        labels = batch["input_ids"][:, 1:]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=self.lr)


def _peft(model, *, router: bool):
    from peft import LoraConfig, get_peft_model

    if router:
        names = [f"{layer.name}.gate.weight" for layer in find_moe_layers(model)]
        config = LoraConfig(r=4, lora_alpha=4, target_modules=[], target_parameters=names)
    else:
        config = LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    return get_peft_model(model, config)


def _fit(tmp_path: Path, model, callback: RouterDelta | list, steps: int = 4) -> AdaptedLM:
    module = AdaptedLM(model)
    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                         callbacks=callback if isinstance(callback, list) else [callback], num_sanity_val_steps=0,
                         limit_val_batches=0)
    trainer.fit(module, datamodule=SyntheticTokens(num_samples=8, seq_len=12, batch_size=2, high=100))
    return module


def _pipeline(score: str = "auto", holdout_batches: int = 1, export: bool = True,
              **select) -> tuple[RouterDelta, ExpertPruning, list]:
    """(the scorer, the ExpertPruning that selects by its scores, the callbacks: both and, with ``export``, an
    Export)."""
    scorer = RouterDelta(score=score, holdout_batches=holdout_batches)
    pruning = ExpertPruning(criterion="router_delta", **select)
    return scorer, pruning, [scorer, pruning, *([Export()] if export else [])]


def _probe():
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(3, 100, (2, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _check_export(tmp_path: Path, original, callback: RouterDelta, pruning: ExpertPruning, criterion: str) -> None:
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert list(scores) == [criterion]
    entry = scores[criterion]
    assert set(entry) >= {"importance", "raw"}
    assert set(entry["importance"]) == {str(l.index) for l in find_moe_layers(original)}
    plan = lp.ExpertPlan.load(tmp_path / "plan.json")
    assert plan.criterion == criterion and plan.allocation == "uniform"
    assert plan.keep == pruning.plan.keep
    for layer, values in callback.scores.items():
        pruned = plan.pruned()[layer]
        kept = plan.keep[layer]
        assert max(float(values[e]) for e in pruned) <= min(float(values[e]) for e in kept), "smallest pruned"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["criterion"] == criterion and report["experts_after"] < report["experts_before"]
    assert (tmp_path / "kept_experts.png").stat().st_size > 0

    loaded = lp.load_pruned(tmp_path / "model")
    bad = [k for k in loaded.state_dict() if any(m in k.lower() for m in ("lora", "ia3", "adapter", "houlsby"))]
    assert not bad, bad
    assert [l.num_experts for l in find_moe_layers(loaded)] == [len(plan.keep[l]) for l in sorted(plan.keep)]
    probe = _probe()
    with torch.no_grad(), lp.mask_experts(original, plan):
        reference = original(**probe).logits
    with torch.no_grad():
        got = loaded(**probe).logits
    keep = probe["attention_mask"].bool()
    torch.testing.assert_close(got[keep], reference[keep], rtol=0, atol=1e-5)


def test_router_lora_fit_scores_by_weight_delta_and_exports_the_original(tiny, tmp_path: Path) -> None:
    model = tiny("mixtral")
    original = copy.deepcopy(model)
    before = router_row_norms(model)
    callback, pruning, callbacks = _pipeline(ratio=0.5)
    module = _fit(tmp_path, _peft(model, router=True), callbacks)

    assert callback.resolved == "weight"
    for layer, norms in callback.before.items():
        assert torch.equal(norms, before[layer]), "snapshot is the original router"
    assert all((s > 0).any() for s in callback.scores.values()), "the fit moved router rows"
    assert all(len(ids) == 4 for ids in pruning.plan.keep.values())
    assert not any("lora" in k for k in module.model.state_dict()), "the adapter is discarded"
    _check_export(tmp_path, original, callback, pruning, "router_delta:weight")


def test_frozen_router_auto_uses_the_logit_delta_with_n_per_layer(tiny, tmp_path: Path) -> None:
    model = tiny("qwen2_moe")
    original = copy.deepcopy(model)
    callback, pruning, callbacks = _pipeline(score="auto", holdout_batches=2, ratio=None, n_per_layer=3)
    _fit(tmp_path, _peft(model, router=False), callbacks)
    assert callback.resolved == "logit"
    assert all(len(ids) == 5 for ids in pruning.plan.keep.values())
    assert pruning.plan.metadata["n_per_layer"] == 3
    _check_export(tmp_path, original, callback, pruning, "router_delta:logit")


def test_signed_weight_score_and_state_round_trip(tiny, tmp_path: Path) -> None:
    model = tiny("mixtral")
    callback, pruning, callbacks = _pipeline(score="signed_weight", export=False, ratio=0.25)
    module = _fit(tmp_path, _peft(model, router=True), callbacks)
    assert pruning.plan.criterion == "router_delta:signed_weight"
    assert (tmp_path / "plan.json").is_file() and not (tmp_path / "model").exists()
    assert any((s < 0).any() or (s > 0).any() for s in callback.scores.values())
    # no Export: the un-adapted, unpruned base model is left
    assert [l.num_experts for l in find_moe_layers(module.model)] == [8, 8]
    restored = RouterDelta(score="signed_weight")
    restored.load_state_dict(json.loads(json.dumps(callback.state_dict())))
    assert restored.resolved == "signed_weight"
    for layer in callback.before:
        assert torch.equal(restored.before[layer], callback.before[layer])
    restored_pruning = ExpertPruning(criterion="router_delta", ratio=0.25)
    restored_pruning.load_state_dict(json.loads(json.dumps(pruning.state_dict())))
    assert restored_pruning.plan.keep == pruning.plan.keep


def test_weight_score_on_a_frozen_router_is_vacuous(tiny, tmp_path: Path) -> None:
    _, _, callbacks = _pipeline(score="weight", ratio=0.5)
    with pytest.raises(ValueError, match="score='logit'"):
        _fit(tmp_path, _peft(tiny("mixtral"), router=False), callbacks, steps=2)


def test_trained_base_weights_cannot_be_pruned_as_the_original(tiny, tmp_path: Path) -> None:
    model = tiny("mixtral")          # no adapter: every weight trains
    _, _, callbacks = _pipeline(score="weight", ratio=0.5)
    with pytest.raises(RuntimeError, match="base weights were trained"):
        _fit(tmp_path, model, callbacks, steps=2)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="score must be one of"):
        RouterDelta(score="norm")
    with pytest.raises(ValueError, match="exactly one of ratio"):
        _pipeline(ratio=0.5, n_per_layer=2)
    with pytest.raises(ValueError, match="ratio must be in"):
        _pipeline(ratio=1.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'ratio'"):  # it scores; ExpertPruning selects
        RouterDelta(score="weight", ratio=0.5)


def test_n_per_layer_below_the_floor_fails_at_fit_start(tiny, tmp_path: Path) -> None:
    _, _, callbacks = _pipeline(ratio=None, n_per_layer=7)   # top_k = 2 of 8
    with pytest.raises(ValueError, match="n_per_layer=7 .* floor of 2"):
        _fit(tmp_path, _peft(tiny("mixtral"), router=True), callbacks, steps=1)


@pytest.mark.parametrize("kind", ["ia3", "houlsby"])
def test_ia3_and_houlsby_fit_and_score_by_logits(tiny, tmp_path: Path, kind: str) -> None:
    adapters = pytest.importorskip("lightprune.finetune.adapters")
    model = tiny("mixtral")
    original = copy.deepcopy(model)
    adapted = adapters.apply_adapter(model, adapters.AdapterSpec(kind=kind))
    callback, pruning, callbacks = _pipeline(ratio=0.5)
    _fit(tmp_path, adapted, callbacks)
    assert callback.resolved == "logit"
    assert all((s > 0).any() for s in callback.scores.values())
    _check_export(tmp_path, original, callback, pruning, "router_delta:logit")


def test_scorer_expert_pruning_and_export_listed_in_any_order_write_the_same_files(tiny, tmp_path: Path) -> None:
    """RouterDelta only scores; ExpertPruning(criterion='router_delta') and Export, listed in reverse phase order,
    write the same plan.json and scores.json bytes (and export the same checkpoint) as listed in phase order."""
    model = _peft(tiny("mixtral"), router=True)
    pl.seed_everything(0)
    first = ExpertPruning(criterion="router_delta", ratio=0.5)
    _fit(tmp_path / "in_order", copy.deepcopy(model), [RouterDelta(score="weight"), first, Export(summary=False)])
    pl.seed_everything(0)
    pruning = ExpertPruning(criterion="router_delta", ratio=0.5)
    _fit(tmp_path / "reversed", copy.deepcopy(model), [Export(summary=False), pruning, RouterDelta(score="weight")])
    for name in ("plan.json", "scores.json"):
        assert (tmp_path / "reversed" / name).read_bytes() == (tmp_path / "in_order" / name).read_bytes()
    assert pruning.plan.criterion == "router_delta:weight" and pruning.plan.keep == first.plan.keep
    got = lp.load_pruned(tmp_path / "reversed" / "model").state_dict()
    want = lp.load_pruned(tmp_path / "in_order" / "model").state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_scorer_alone_says_that_nothing_is_pruned(tiny, tmp_path: Path) -> None:
    callback = RouterDelta(score="weight")
    with pytest.warns(UserWarning, match="RouterDelta only scores: add ExpertPruning"):
        _fit(tmp_path, _peft(tiny("mixtral"), router=True), callback, steps=1)
    assert callback.scores is not None and not (tmp_path / "plan.json").exists()
