"""The calibration statistics as redesigned (one ObservedBatch per layer and batch, one Statistic per module) give
exactly what the accumulators they replaced gave: every criterion, every subset, every layer and the merging
statistics, bit for bit, and the same saved sums.

The reference is the pre-redesign code kept verbatim in ``fixtures/legacy_calibration.py``, run on the same model
and batches in the same process (so both see the same floating-point environment). The cases cover each family of
removal effect (renormalised and plain softmax top-k, group-limited sigmoid with re-runs and closed-form group swaps,
group-limited greedy softmax), padded batches (a fully padded sample included), a router that does not return its
logits (Gemma 4: recomputed), the vision and attention subsets of an MLLM, and the promoted Delta-H.
"""

from __future__ import annotations

import pytest
import torch
from fixtures.legacy_calibration import LegacyObserver

from lightprune.experts.calibration import ExpertObserver
from lightprune.experts.criteria.registry import CALIBRATION_CRITERIA, MERGE_STATISTICS
from lightprune.testing.batches import tiny_multimodal_batch, tiny_text_batch

EVERY = list(CALIBRATION_CRITERIA) + list(MERGE_STATISTICS)

CASES = [
    pytest.param("qwen3_moe", dict(norm_topk_prob=True), ("all", "text"), id="qwen3_moe-renorm"),
    pytest.param("olmoe", dict(norm_topk_prob=False), ("all",), id="olmoe-no-renorm"),
    pytest.param("deepseek_v3", dict(n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=3), ("all",),
                 id="deepseek_v3-4groups"),
    pytest.param("deepseek_v3", dict(n_routed_experts=64, n_group=8, topk_group=4, num_experts_per_tok=8), ("all",),
                 id="deepseek_v3-64-8groups"),
    pytest.param("deepseek_v2", dict(n_routed_experts=32, n_group=8, topk_group=3, num_experts_per_tok=4), ("all",),
                 id="deepseek_v2-group-limited"),
    pytest.param("gemma4", {}, ("all", "text", "vision", "vision_low_attn", "vision_high_attn"), id="gemma4-mllm"),
    pytest.param("qwen3_vl_moe", {}, ("all", "text", "vision", "vision_low_attn"), id="qwen3_vl_moe"),
]


def _batches(model, subsets) -> list[dict[str, torch.Tensor]]:
    if "vision" in subsets:
        return [tiny_multimodal_batch(model, seed=s) for s in (1, 2)]
    return [tiny_text_batch(model, batch_size=3, seq_len=10, seed=1),
            tiny_text_batch(model, batch_size=2, seq_len=7, seed=2, padding_side="left"),
            tiny_text_batch(model, batch_size=2, seq_len=6, seed=3, pad=False)]


def _observe(cls, model, batches, subsets, criteria):
    observer = cls(model, subsets, criteria, low_attn_quantile=0.25)
    with observer, torch.no_grad():
        for batch in batches:
            observer.begin_batch(batch)
            model(**batch)
    return observer


@pytest.mark.parametrize("family,overrides,subsets", CASES)
def test_every_value_equals_the_replaced_accumulators_bit_for_bit(tiny, family, overrides, subsets) -> None:
    model = tiny(family, **overrides).eval()
    batches = _batches(model, subsets)
    new = _observe(ExpertObserver, model, batches, subsets, EVERY)
    old = _observe(LegacyObserver, model, batches, subsets, EVERY)
    got, want = new.result(), old.result()
    assert got._values.keys() == want._values.keys() and len(want._values) == len(CALIBRATION_CRITERIA) * len(subsets)
    for key, per_layer in want._values.items():
        assert per_layer.keys() == got._values[key].keys()
        for layer, value in per_layer.items():
            assert torch.equal(got._values[key][layer], value), (key, layer)
    assert got._merging.keys() == want._merging.keys() == set(MERGE_STATISTICS)
    for name, per_layer in want._merging.items():
        assert all(torch.equal(got._merging[name][layer], value) for layer, value in per_layer.items()), name
    assert (got.tokens, got.samples, got.metadata) == (want.tokens, want.samples, want.metadata)
    # the saved sums too: a state saved by the old code resumes in the new
    saved, legacy = new.state_dict(), old.state_dict()
    assert saved.keys() == legacy.keys() == {"batches_seen", "layers", "merging"}
    for group in ("layers", "merging"):
        for layer, sums in saved[group].items():
            assert sums.keys() <= legacy[group][layer].keys()
            assert all(torch.equal(sums[name], legacy[group][layer][name]) for name in sums), (group, layer)
    resumed = ExpertObserver(model, subsets, EVERY, low_attn_quantile=0.25)
    resumed.load_state_dict(legacy)
    assert all(torch.equal(resumed.result()._values[key][layer], value)
               for key, per_layer in want._values.items() for layer, value in per_layer.items())


def test_a_statistic_a_project_registers_is_collected_scored_and_resumed(tiny) -> None:
    """A Statistic registered outside lightprune (sum of squared routing weights per expert, the documentation's example)
    is collected in the same pass as the built-in ones, equals the same sum taken from the routers' own outputs, is
    read by a criterion that names it, and resumes from a saved state."""
    from lightprune.experts.calibration import Statistic
    from lightprune.experts.criteria import CalibrationCriterion
    from lightprune.experts.criteria.registry import CRITERIA, STATISTICS, register_criterion, register_statistic
    from lightprune.models import find_moe_layers

    model = tiny("qwen3_moe", norm_topk_prob=True).eval()
    batches = _batches(model, ("all",))
    with STATISTICS.restoring(), CRITERIA.restoring():
        @register_statistic
        class WeightSquares(Statistic):
            values = ("weight_squares",)

            def __init__(self, layer, subsets, wanted, counts=None):
                super().__init__(layer, subsets, wanted, counts)
                self.sums = {"weight_squares": self.zeros(len(subsets), layer.num_experts)}

            def update(self, batch):
                per_slot = batch.m.unsqueeze(-1) * batch.w.pow(2)
                sums = torch.zeros(self.sums["weight_squares"].shape, dtype=batch.dtype)
                sums.index_add_(1, batch.selected.reshape(-1), per_slot.flatten(1))
                self.sums["weight_squares"] += sums.double()

            def value(self, name, subset):
                return self.sums[name][subset]

        @register_criterion("weight_squares")
        class WeightSquaresCriterion(CalibrationCriterion):
            statistic = "weight_squares"

        layers = find_moe_layers(model)
        routed = {layer.index: [] for layer in layers}
        handles = [layer.router.register_forward_hook(lambda m, a, out, i=layer.index: routed[i].append(out[1:]))
                   for layer in layers]
        try:
            observer = _observe(ExpertObserver, model, batches, ("all", "text"), ["reap", "weight_squares"])
        finally:
            for handle in handles:
                handle.remove()
        stats = observer.result()
        for layer in layers:
            expected = torch.zeros(layer.num_experts, dtype=torch.float64)
            for batch, (weights, ids) in zip(batches, routed[layer.index]):
                keep = batch["attention_mask"].reshape(-1).bool()
                for t in keep.nonzero().flatten().tolist():
                    for w, e in zip(weights[t].tolist(), ids[t].tolist()):
                        expected[e] += w * w
            assert torch.allclose(stats.raw("weight_squares", "text")[layer.index], expected, rtol=1e-6, atol=1e-9)
        scored = WeightSquaresCriterion(subset="text").score_in_run(model, calibration=stats)
        assert all(torch.equal(scored[l], stats.raw("weight_squares", "text")[l]) for l in scored)
        resumed = ExpertObserver(model, ("all", "text"), ["reap", "weight_squares"])
        resumed.load_state_dict(observer.state_dict())
        assert torch.equal(resumed.result().raw("weight_squares", "all")[0], stats.raw("weight_squares", "all")[0])
    assert "weight_squares" not in STATISTICS and "weight_squares" not in CRITERIA
