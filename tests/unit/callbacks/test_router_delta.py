"""RouterDelta end to end: a short Lightning fit with an adapter, scores, plan, export of the original.

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
from lightprune.callbacks import RouterDelta
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


def _probe():
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(3, 100, (2, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _check_export(tmp_path: Path, original, callback: RouterDelta, criterion: str) -> None:
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert list(scores) == [criterion]
    entry = scores[criterion]
    assert set(entry) >= {"importance", "raw"}
    assert set(entry["importance"]) == {str(l.index) for l in find_moe_layers(original)}
    plan = lp.ExpertPlan.load(tmp_path / "plan.json")
    assert plan.criterion == criterion and plan.allocation == "uniform"
    assert plan.keep == callback.plan.keep
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
    callback = RouterDelta(ratio=0.5)
    module = _fit(tmp_path, _peft(model, router=True), callback)

    assert callback.resolved == "weight"
    for layer, norms in callback.before.items():
        assert torch.equal(norms, before[layer]), "snapshot is the original router"
    assert all((s > 0).any() for s in callback.scores.values()), "the fit moved router rows"
    assert all(len(ids) == 4 for ids in callback.plan.keep.values())
    assert not any("lora" in k for k in module.model.state_dict()), "the adapter is discarded"
    _check_export(tmp_path, original, callback, "router_delta:weight")


def test_frozen_router_auto_uses_the_logit_delta_with_n_per_layer(tiny, tmp_path: Path) -> None:
    model = tiny("qwen2_moe")
    original = copy.deepcopy(model)
    callback = RouterDelta(score="auto", ratio=None, n_per_layer=3, holdout_batches=2)
    _fit(tmp_path, _peft(model, router=False), callback)
    assert callback.resolved == "logit"
    assert all(len(ids) == 5 for ids in callback.plan.keep.values())
    assert callback.plan.metadata["n_per_layer"] == 3
    _check_export(tmp_path, original, callback, "router_delta:logit")


def test_signed_weight_score_and_state_round_trip(tiny, tmp_path: Path) -> None:
    model = tiny("mixtral")
    callback = RouterDelta(score="signed_weight", ratio=0.25, export=False)
    module = _fit(tmp_path, _peft(model, router=True), callback)
    assert callback.plan.criterion == "router_delta:signed_weight"
    assert (tmp_path / "plan.json").is_file() and not (tmp_path / "model").exists()
    assert any((s < 0).any() or (s > 0).any() for s in callback.scores.values())
    # export=False leaves the un-adapted, unpruned base model
    assert [l.num_experts for l in find_moe_layers(module.model)] == [8, 8]
    restored = RouterDelta(score="signed_weight", ratio=0.25)
    restored.load_state_dict(json.loads(json.dumps(callback.state_dict())))
    assert restored.plan.keep == callback.plan.keep and restored.resolved == "signed_weight"
    for layer in callback.before:
        assert torch.equal(restored.before[layer], callback.before[layer])


def test_weight_score_on_a_frozen_router_is_vacuous(tiny, tmp_path: Path) -> None:
    callback = RouterDelta(score="weight", ratio=0.5)
    with pytest.raises(ValueError, match="score='logit'"):
        _fit(tmp_path, _peft(tiny("mixtral"), router=False), callback, steps=2)


def test_trained_base_weights_cannot_be_pruned_as_the_original(tiny, tmp_path: Path) -> None:
    model = tiny("mixtral")          # no adapter: every weight trains
    callback = RouterDelta(score="weight", ratio=0.5)
    with pytest.raises(RuntimeError, match="base weights were trained"):
        _fit(tmp_path, model, callback, steps=2)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="score must be one of"):
        RouterDelta(score="norm")
    with pytest.raises(ValueError, match="exactly one of ratio"):
        RouterDelta(ratio=0.5, n_per_layer=2)
    with pytest.raises(ValueError, match="ratio must be in"):
        RouterDelta(ratio=1.0)


def test_n_per_layer_below_the_floor_fails_at_fit_start(tiny, tmp_path: Path) -> None:
    callback = RouterDelta(ratio=None, n_per_layer=7)   # top_k = 2 of 8
    with pytest.raises(ValueError, match="n_per_layer=7 .* floor of 2"):
        _fit(tmp_path, _peft(tiny("mixtral"), router=True), callback, steps=1)


@pytest.mark.parametrize("kind", ["ia3", "houlsby"])
def test_ia3_and_houlsby_fit_and_score_by_logits(tiny, tmp_path: Path, kind: str) -> None:
    adapters = pytest.importorskip("lightprune.finetune.adapters")
    model = tiny("mixtral")
    original = copy.deepcopy(model)
    adapted = adapters.apply_adapter(model, adapters.AdapterSpec(kind=kind))
    callback = RouterDelta(ratio=0.5)
    _fit(tmp_path, adapted, callback)
    assert callback.resolved == "logit"
    assert all((s > 0).any() for s in callback.scores.values())
    _check_export(tmp_path, original, callback, "router_delta:logit")


def test_scorer_then_expert_pruning_then_export_equals_the_legacy_arguments(tiny, tmp_path: Path) -> None:
    """RouterDelta only scores; ExpertPruning(criterion='router_delta') and Export, listed in any order, write the
    same plan.json and scores.json bytes (and export the same checkpoint) as 0.1's RouterDelta(ratio=...)."""
    from lightprune import _compat
    from lightprune.callbacks import ExpertPruning, Export

    _compat._WARNED.clear()  # the deprecation warns once per process
    model = _peft(tiny("mixtral"), router=True)
    pl.seed_everything(0)
    with pytest.warns(FutureWarning, match="RouterDelta\\(ratio="):
        legacy = RouterDelta(score="weight", ratio=0.5, summary=False)
    _fit(tmp_path / "legacy", copy.deepcopy(model), legacy)
    pl.seed_everything(0)
    scorer = RouterDelta(score="weight")
    pruning = ExpertPruning(criterion="router_delta", ratio=0.5)
    _fit(tmp_path / "new", copy.deepcopy(model), [Export(summary=False), pruning, scorer])
    for name in ("plan.json", "scores.json"):
        assert (tmp_path / "new" / name).read_bytes() == (tmp_path / "legacy" / name).read_bytes()
    assert pruning.plan.criterion == "router_delta:weight" and pruning.plan.keep == legacy.plan.keep
    assert scorer.plan is None and scorer.report is None  # a scorer: no plan, nothing written by it
    new_model = lp.load_pruned(tmp_path / "new" / "model")
    old_model = lp.load_pruned(tmp_path / "legacy" / "model")
    assert new_model.state_dict().keys() == old_model.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(new_model.state_dict().values(), old_model.state_dict().values()))


def test_a_scorer_alone_says_that_nothing_is_pruned(tiny, tmp_path: Path) -> None:
    callback = RouterDelta(score="weight")
    with pytest.warns(UserWarning, match="RouterDelta only scores: add ExpertPruning"):
        _fit(tmp_path, _peft(tiny("mixtral"), router=True), callback, steps=1)
    assert callback.scores is not None and not (tmp_path / "plan.json").exists()
