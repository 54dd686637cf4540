"""NumPy scalars and 0-d tensors wherever the experts API takes a number: the same plan as the Python number; NumPy
bools and non-finite values refused with the argument named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import lightprune as lp
from lightprune.models.layer import RoutingLimits

LIMITS = {0: RoutingLimits(10, 2), 1: RoutingLimits(10, 2)}
IMPORTANCE = {layer: torch.randperm(10, generator=torch.Generator().manual_seed(layer)).double() for layer in LIMITS}
# 0.7 of 10 experts prunes 7; numpy.float32(0.7) widened is 0.699999988 and would prune 6
SEVEN_TENTHS = [np.float32(0.7), np.float16(0.7), np.float64(0.7), np.array(0.7, dtype=np.float32),
                torch.tensor(0.7), torch.tensor(0.7, dtype=torch.float64)]


@pytest.mark.parametrize("allocation", ["uniform", "global"])
@pytest.mark.parametrize("ratio", SEVEN_TENTHS, ids=repr)
def test_a_numpy_ratio_selects_what_the_python_float_selects(ratio, allocation) -> None:
    want = lp.select_experts(IMPORTANCE, 0.7, allocation, limits=LIMITS)
    got = lp.select_experts(IMPORTANCE, ratio, allocation, limits=LIMITS)
    assert got.to_dict() == want.to_dict() and type(got.ratio) is float
    assert want.total_pruned == 14  # 7 of each layer's 10, or 14 of 20
    widened = lp.select_experts(IMPORTANCE, float(np.float32(0.7)), allocation, limits=LIMITS)
    assert widened.total_pruned == {"uniform": 12, "global": 13}[allocation]


@pytest.mark.parametrize("n", [np.int64(3), np.uint8(3), np.array(3), torch.tensor(3), np.float64(3.0)], ids=repr)
def test_a_numpy_count_per_layer_selects_what_the_python_int_selects(n) -> None:
    want = lp.select_experts(IMPORTANCE, None, limits=LIMITS, n_per_layer=3)
    got = lp.select_experts(IMPORTANCE, None, limits=LIMITS, n_per_layer=n)
    assert got.to_dict() == want.to_dict() and got.metadata["n_per_layer"] == 3
    assert type(got.metadata["n_per_layer"]) is int


@pytest.mark.parametrize("ratio", [np.bool_(False), np.float32("nan"), np.float64(math.inf), torch.tensor(math.nan),
                                   torch.tensor(False), np.array([0.5]), "0.5"], ids=repr)
def test_numpy_bools_and_non_finite_ratios_are_refused(ratio) -> None:
    with pytest.raises(ValueError, match=r"^ratio must be in \[0, 1\), got "):
        lp.select_experts(IMPORTANCE, ratio, limits=LIMITS)


@pytest.mark.parametrize("n", [np.bool_(True), np.float64(math.nan), np.float32(2.5), math.inf], ids=repr)
def test_numpy_bools_and_non_finite_counts_are_refused(n) -> None:
    with pytest.raises(ValueError, match=r"^n_per_layer must be a non-negative integer, got "):
        lp.select_experts(IMPORTANCE, None, limits=LIMITS, n_per_layer=n)


def test_a_plan_built_with_numpy_numbers_saves_plain_json(tmp_path) -> None:
    plan = lp.ExpertPlan(keep={np.int64(0): [np.int64(2), np.int32(0)]}, num_experts={0: np.int64(4)},
                         ratio=np.float32(0.5))
    assert plan.keep == {0: [0, 2]} and plan.num_experts == {0: 4} and type(plan.ratio) is float
    plan.save(tmp_path / "plan.json")
    assert lp.ExpertPlan.load(tmp_path / "plan.json").to_dict() == plan.to_dict()
    with pytest.raises(lp.PlanError, match=r"^ratio must be a number in \[0, 1\) or null, got np.True_$"):
        lp.ExpertPlan(keep={0: [0]}, num_experts={0: 4}, ratio=np.bool_(True))
    with pytest.raises(lp.PlanError, match=r"keep\[0\]\[0\] must be an expert id \(an integer\), got np.True_"):
        lp.ExpertPlan(keep={0: [np.bool_(True)]}, num_experts={0: 4})


def test_weight_criteria_take_numpy_ints(tiny) -> None:
    model = tiny("qwen3_moe")
    want = lp.score_weights(model, "random", seed=3)
    got = lp.score_weights(model, "random", seed=np.int64(3))
    assert all(torch.equal(got[layer], want[layer]) for layer in want)
    blocked = lp.score_weights(model, "aimer", block_elements=np.int64(64))
    assert all(torch.equal(blocked[layer], lp.score_weights(model, "aimer", block_elements=64)[layer])
               for layer in blocked)
    for bad in (np.bool_(True), np.float64(3.0)):
        with pytest.raises(TypeError, match="^seed must be an int, got "):
            lp.score_weights(model, "random", seed=bad)


def test_calibration_options_take_numpy_floats(tiny) -> None:
    from lightprune.testing.batches import tiny_text_batch

    model = tiny("qwen3_moe")
    batches = [tiny_text_batch(model, batch_size=2, seq_len=6, seed=0)]
    stats = lp.collect_expert_stats(model, batches, low_attn_quantile=np.float32(0.1), criteria=["frequency"],
                                    progress=False)
    assert stats.metadata["low_attn_quantile"] == 0.1 and type(stats.metadata["low_attn_quantile"]) is float
    for bad in (np.bool_(True), np.float32("nan"), np.float64(0.75)):
        with pytest.raises(ValueError, match=r"^low_attn_quantile must be in \(0, 0.5\], got "):
            lp.collect_expert_stats(model, batches, low_attn_quantile=bad, criteria=["frequency"], progress=False)


def test_maep_takes_a_numpy_alpha_and_refuses_a_numpy_bool() -> None:
    from lightprune.experts.criteria import get_criterion

    assert get_criterion("maep", alpha=np.float32(0.3)).alpha == 0.3
    for bad in (np.bool_(False), np.float64("nan"), "0.3"):
        with pytest.raises(ValueError, match=r"^alpha must be in \[0, 1\], got "):
            get_criterion("maep", alpha=bad)
