"""select_experts and ExpertPlan: allocations checked against independent rankings, floors, errors.

Every expected plan is recomputed here from the raw scores (plain sorting over (layer, expert)
pairs), never taken from the code under test.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from fixtures import greedy_global, random_scores

import lightprune as lp
from lightprune.experts.scores import ExpertScores
from lightprune.models.layer import RoutingLimits


def lowest(values: torch.Tensor, count: int) -> set[int]:
    return set(np.argsort(values.numpy(), kind="stable")[:count].tolist())


def pruned_sets(plan) -> dict[int, set[int]]:
    return {layer: set(ids) for layer, ids in plan.pruned().items()}



# ----------------------------------------------------------------------------- uniform
@pytest.mark.parametrize("ratio", [0.125, 0.3, 0.5, 0.7, 0.75])
def test_uniform_prunes_the_lowest_floor_r_e_per_layer(ratio):
    scores = random_scores({0: 8, 2: 8, 5: 16, 6: 12}, seed=1)
    plan = lp.select_experts(scores, ratio, allocation="uniform")
    expected = {layer: lowest(v, math.floor(ratio * v.numel())) for layer, v in scores.items()}
    assert pruned_sets(plan) == expected
    assert plan.num_experts == {0: 8, 2: 8, 5: 16, 6: 12}
    assert plan.total_pruned == sum(map(len, expected.values()))
    assert plan.allocation == "uniform" and plan.ratio == ratio and plan.criterion == "random"


def test_uniform_may_keep_exactly_top_k_but_not_fewer():
    scores = random_scores({0: 8, 1: 8}, seed=2, top_k=4)
    plan = lp.select_experts(scores, 0.6, allocation="uniform")  # floor(4.8) = 4 pruned, 4 = top_k kept
    assert plan.kept_counts() == {0: 4, 1: 4}
    with pytest.raises(ValueError, match=re.escape("ratio 0.7 ")) as err:
        lp.select_experts(scores, 0.7, allocation="uniform")  # 5 pruned would keep 3 < top_k
    assert "top_k=4" in str(err.value)


# ----------------------------------------------------------------------------- global
def _spread_scores(seed: int, offsets=(0.0, 0.5, 0.25), num: int = 8, top_k: int = 2) -> ExpertScores:
    """Per-layer shifted scores so that global and uniform allocation differ."""
    gen = torch.Generator().manual_seed(seed)
    importance = {layer: torch.rand(num, generator=gen, dtype=torch.float64) + off
                  for layer, off in enumerate(offsets)}
    return ExpertScores(importance, {layer: RoutingLimits(num, top_k) for layer in importance})


@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_global_prunes_the_lowest_floor_r_n_overall(ratio):
    scores = _spread_scores(seed=3)
    plan = lp.select_experts(scores, ratio, allocation="global")
    target = math.floor(ratio * 24)
    pairs = sorted((float(v), layer, e) for layer, vals in scores.items() for e, v in enumerate(vals))[:target]
    expected = {layer: {e for _, l, e in pairs if l == layer} for layer in scores}
    assert all(8 - len(ids) >= 2 for ids in expected.values())  # no floor binds in this setup
    assert len({len(ids) for ids in expected.values()}) > 1  # and global differs from uniform
    assert pruned_sets(plan) == expected
    assert plan.total_pruned == target and plan.allocation == "global"


def test_global_floor_binds_and_the_rest_comes_from_other_layers():
    gen = torch.Generator().manual_seed(4)
    importance = {0: torch.rand(8, generator=gen) * 0.1,          # every one of layer 0's scores is the lowest
                  1: 1 + torch.rand(8, generator=gen),
                  3: 1 + torch.rand(8, generator=gen)}
    limits = {layer: RoutingLimits(8, 2) for layer in importance}
    plan = lp.select_experts(importance, 0.5, allocation="global", limits=limits)
    values = {layer: v.double().numpy() for layer, v in importance.items()}
    expected = greedy_global(values, 12, {layer: 2 for layer in values})
    assert len(expected[0]) == 6  # the floor binds: without it all 8 of layer 0 would go
    assert pruned_sets(plan) == expected
    assert plan.kept_counts()[0] == 2 and set(plan.keep[0]) == set(np.argsort(values[0])[-2:].tolist())
    assert plan.total_pruned == 12


def test_global_beyond_every_floor_is_an_error():
    scores = random_scores({0: 8, 1: 8, 2: 8}, seed=5)
    with pytest.raises(ValueError, match=re.escape("ratio 0.9 ")):
        lp.select_experts(scores, 0.9, allocation="global")  # 21 > 3 * (8 - 2)


def test_log_zscore_ranks_layers_on_a_common_scale():
    gen = torch.Generator().manual_seed(6)
    scales = {0: 1.0, 1: 1e3, 2: 1e-2}
    importance = {layer: torch.exp(torch.randn(8, generator=gen, dtype=torch.float64)) * s
                  for layer, s in scales.items()}
    limits = {layer: RoutingLimits(8, 2) for layer in importance}
    ratio = 0.375
    plan = lp.select_experts(importance, ratio, allocation="global", normalize="log_zscore", limits=limits)

    z = {}
    for layer, v in importance.items():
        logs = np.log(v.numpy() + 1e-8)
        z[layer] = (logs - logs.mean()) / logs.std()
    expected = greedy_global(z, math.floor(ratio * 24), {layer: 2 for layer in z})
    assert pruned_sets(plan) == expected
    assert plan.metadata["normalize"] == "log_zscore"
    raw = lp.select_experts(importance, ratio, allocation="global", limits=limits)
    assert pruned_sets(raw) != expected  # the scale matters without normalisation
    assert len(pruned_sets(raw)[2]) == 6  # raw ranking empties the small-scale layer to its floor


def test_log_zscore_rejects_negative_scores():
    scores = random_scores({0: 8}, seed=7, low=-1.0, high=1.0)
    with pytest.raises(ValueError, match="negative"):
        lp.select_experts(scores, 0.25, allocation="global", normalize="log_zscore")


@pytest.mark.parametrize("allocation", ["uniform", "global"])
def test_ratio_zero_prunes_nothing(allocation):
    scores = random_scores({0: 8, 1: 16}, seed=8)
    plan = lp.select_experts(scores, 0.0, allocation=allocation)
    assert plan.keep == {0: list(range(8)), 1: list(range(16))}
    assert plan.total_pruned == 0


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize("ratio", [1.0, -0.1, 1.5, float("nan")])
def test_bad_ratio_is_named(ratio):
    scores = random_scores({0: 8}, seed=9)
    with pytest.raises(ValueError, match=re.escape(repr(ratio))):
        lp.select_experts(scores, ratio)


def test_unknown_allocation_and_normalize_are_named():
    scores = random_scores({0: 8}, seed=10)
    with pytest.raises(ValueError, match="'layerwise'"):
        lp.select_experts(scores, 0.25, allocation="layerwise")
    with pytest.raises(ValueError, match="'zscore'"):
        lp.select_experts(scores, 0.25, normalize="zscore")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_scores_are_named(bad):
    scores = random_scores({0: 8, 4: 8}, seed=11)
    scores[4][5] = bad
    with pytest.raises(ValueError) as err:
        lp.select_experts(scores, 0.25)
    message = str(err.value)
    assert "layer 4" in message and "[5]" in message and str(bad) in message


def test_missing_limits_are_an_error():
    gen = torch.Generator().manual_seed(12)
    importance = {0: torch.rand(8, generator=gen), 1: torch.rand(8, generator=gen)}
    with pytest.raises(ValueError, match="limits"):
        lp.select_experts(importance, 0.25)
    with pytest.raises(ValueError, match="layer 1"):
        lp.select_experts(importance, 0.25, limits={0: RoutingLimits(8, 2)})


WHY_BOOL = "True and False only, so which experts go would be decided by how ties are broken"
WHY_COMPLEX = "complex numbers have no order, and their imaginary parts would be dropped"


GIVE = "give the importance as a floating-point or integer tensor (higher = keep)"


@pytest.mark.parametrize("make, message", [
    (lambda v: v > v.median(), f"layer 3: scores of dtype torch.bool cannot be ranked ({WHY_BOOL}); {GIVE}"),
    (lambda v: v.to(torch.complex64),
     f"layer 3: scores of dtype torch.complex64 cannot be ranked ({WHY_COMPLEX}); {GIVE}"),
    (lambda v: v.to("meta"), ("layer 3: scores on the meta device hold no values to rank; compute them on a device "
                              "with data (cpu, cuda)")),
])
def test_scores_that_cannot_be_ranked_are_refused_naming_the_layer(make, message):
    """bool scores were ranked by tie-breaking and complex ones by their real parts, silently; meta ones failed in
    torch ("Cannot copy out of meta tensor"). Refused wherever scores enter: ExpertScores, and select_experts given a
    plain mapping (both allocations, and n_per_layer)."""
    scores = random_scores({0: 8, 3: 8}, seed=13)
    bad = {0: scores[0], 3: make(scores[3])}
    with pytest.raises(ValueError) as err:
        ExpertScores(bad, scores.limits)
    assert str(err.value) == message
    for kwargs in ({"ratio": 0.25}, {"ratio": 0.25, "allocation": "global"}, {"ratio": None, "n_per_layer": 2}):
        with pytest.raises(ValueError) as err:
            lp.select_experts(bad, limits=scores.limits, **kwargs)
        assert str(err.value) == message


def test_integer_scores_rank_as_their_values():
    """An integer count (a routing frequency) is a real number: ranked as the same values in floating point."""
    scores = random_scores({0: 8, 3: 8}, seed=14)
    counts = {layer: (values * 1000).round().long() for layer, values in scores.items()}
    as_float = {layer: values.double() for layer, values in counts.items()}
    for allocation in ("uniform", "global"):
        assert lp.select_experts(ExpertScores(counts, scores.limits), 0.5, allocation).keep == \
            lp.select_experts(as_float, 0.5, allocation, limits=scores.limits).keep


def test_a_ratio_that_holds_no_number_is_refused_naming_it():
    """``ratio=torch.tensor(0.5, device="meta")`` failed in torch naming nothing; ``ratio=numpy.ma.masked`` pruned
    nothing (read as 0.0)."""
    scores = random_scores({0: 8}, seed=15)
    for value, why in ((torch.tensor(0.5, device="meta"), "a tensor on the meta device, which holds no value"),
                       (np.ma.masked, "NumPy's masked value (a missing value)")):
        with pytest.raises(ValueError) as err:
            lp.select_experts(scores, value)
        assert str(err.value) == f"ratio must be in [0, 1), got {value!r}: {why}, not a number"
        with pytest.raises(ValueError) as err:
            lp.select_experts(scores, None, n_per_layer=value)
        assert str(err.value) == f"n_per_layer must be a non-negative integer, got {value!r}: {why}, not a number"


def test_score_count_must_match_the_layer():
    importance = {0: torch.rand(6)}
    with pytest.raises(ValueError, match="expected 8 scores"):
        lp.select_experts(importance, 0.25, limits={0: RoutingLimits(8, 2)})


# ----------------------------------------------------------------------------- grouped routers
def _check_grouped(plan, scores):
    for layer, keep in plan.keep.items():
        lim = scores.limits[layer]
        size = lim.group_size
        per_group = [[e for e in keep if e // size == g] for g in range(lim.n_group)]
        assert len({len(ids) for ids in per_group}) == 1, per_group
        assert len(per_group[0]) >= lim.min_per_group
        values = scores[layer]
        for g, kept in enumerate(per_group):
            gone = [e for e in range(g * size, (g + 1) * size) if e not in kept]
            if gone:  # within a group, the weakest go
                assert max(values[gone]) < min(values[kept])


@pytest.mark.parametrize("num,n_group,topk_group,top_k,ratio", [
    (8, 2, 1, 2, 0.25), (8, 2, 1, 2, 0.5), (16, 4, 2, 3, 0.5), (16, 4, 2, 5, 0.25),
])
def test_grouped_uniform_prunes_the_weakest_of_every_group(num, n_group, topk_group, top_k, ratio):
    scores = random_scores({1: num, 2: num}, seed=13, top_k=top_k, n_group=n_group, topk_group=topk_group)
    plan = lp.select_experts(scores, ratio, allocation="uniform")
    _check_grouped(plan, scores)
    size = num // n_group
    per_group = math.floor(ratio * num) // n_group
    for layer, v in scores.items():
        expected = {g * size + i for g in range(n_group) for i in lowest(v[g * size:(g + 1) * size], per_group)}
        assert set(plan.pruned()[layer]) == expected
        assert len(expected) == per_group * n_group


@pytest.mark.parametrize("ratio", [0.2, 0.3, 0.45])
def test_grouped_global_keeps_groups_equal_and_above_the_floor(ratio):
    scores = _spread_scores(seed=14, offsets=(0.0, 0.3, 0.6, 0.1), num=16, top_k=3)
    scores = ExpertScores(dict(scores), {layer: RoutingLimits(16, 3, 4, 2) for layer in scores})
    plan = lp.select_experts(scores, ratio, allocation="global")
    _check_grouped(plan, scores)
    target = math.floor(ratio * 64)
    assert target - 4 * len(scores) < plan.total_pruned <= target
    assert plan.metadata["pruned"] == plan.total_pruned
    assert len(set(plan.kept_counts().values())) > 1  # global: layers differ


def test_grouped_uniform_below_the_group_floor_is_an_error():
    scores = random_scores({1: 8}, seed=15, top_k=2, n_group=2, topk_group=1)
    assert lp.select_experts(scores, 0.5).kept_counts() == {1: 4}
    with pytest.raises(ValueError, match=re.escape("ratio 0.75")):
        lp.select_experts(scores, 0.75)


def test_single_group_limited_router_keeps_two():
    # a DeepSeek-style router with one group still scores it by a top-2 sum
    limits = {0: RoutingLimits(8, 1, grouped=True)}
    gen = torch.Generator().manual_seed(17)
    importance = {0: torch.rand(8, generator=gen)}
    assert lp.select_experts(importance, 0.75, limits=limits).kept_counts() == {0: 2}
    with pytest.raises(ValueError, match="ratio 0.875"):
        lp.select_experts(importance, 0.875, limits=limits)
    plan = lp.select_experts(importance, 0.875, limits={0: RoutingLimits(8, 1)})  # ungrouped top-1 may keep 1
    assert plan.kept_counts() == {0: 1}


# ----------------------------------------------------------------------------- ExpertPlan
def test_plan_json_round_trip(tmp_path):
    scores = random_scores({0: 8, 3: 16}, seed=16, criterion="reap")
    plan = lp.select_experts(scores, 0.4, allocation="global")
    plan.metadata["note"] = {"alpha": 0.25}
    path = plan.save(tmp_path / "sub" / "plan.json")
    data = json.loads(path.read_text())
    assert data["keep"] == {str(k): v for k, v in plan.keep.items()}  # JSON object keys are strings
    loaded = lp.ExpertPlan.load(path)
    assert loaded == plan
    assert loaded.keep == plan.keep and all(isinstance(k, int) for k in loaded.keep)
    assert (loaded.criterion, loaded.ratio, loaded.allocation) == ("reap", 0.4, "global")
    assert loaded.pruned() == plan.pruned() and loaded.total_pruned == plan.total_pruned


def test_plan_views():
    plan = lp.ExpertPlan(keep={2: [5, 0, 3], 0: [1, 2]}, num_experts={0: 4, 2: 6})
    assert list(plan.keep) == [0, 2] and plan.keep[2] == [0, 3, 5]
    assert plan.pruned() == {0: [0, 3], 2: [1, 2, 4]}
    assert plan.kept_counts() == {0: 2, 2: 3} and plan.total_pruned == 5 and not plan.is_uniform


@pytest.mark.parametrize("keep,num,match", [
    ({0: [0, 8]}, {0: 8}, r"\[8\]"),
    ({0: [-1, 2]}, {0: 8}, r"\[-1\]"),
    ({0: [1, 1, 2]}, {0: 8}, r"duplicate.*\[1, 1, 2\]"),
    ({0: [1, 2], 3: [0, 1]}, {0: 8}, r"\[3\]"),
])
def test_plan_construction_errors_name_the_value(keep, num, match):
    with pytest.raises(lp.PlanError, match=match):
        lp.ExpertPlan(keep=keep, num_experts=num)


def test_plan_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        lp.ExpertPlan.load(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(lp.PlanError, match="not valid JSON"):
        lp.ExpertPlan.load(bad)
    bad.write_text(json.dumps({"keep": {"0": [0, 1]}}))
    with pytest.raises(lp.PlanError, match="'num_experts'"):
        lp.ExpertPlan.load(bad)
    bad.write_text(json.dumps({"keep": {"0": [0, 1]}, "num_experts": {"0": 4}, "budget": 3}))
    with pytest.raises(lp.PlanError, match="budget"):
        lp.ExpertPlan.load(bad)


# ----------------------------------------------------------------------------- ExpertScores
def test_expert_scores_validate_and_serialise():
    limits = {0: RoutingLimits(4, 2)}
    with pytest.raises(ValueError, match="expected 4 scores"):
        ExpertScores({0: torch.zeros(5)}, limits)
    with pytest.raises(ValueError, match=r"\[1\]"):
        ExpertScores({0: torch.zeros(4), 1: torch.zeros(4)}, limits)
    imp = torch.tensor([0.5, -1.0, 2.0, 0.25])
    scores = ExpertScores({0: imp}, limits, criterion="aimer", raw={0: -imp})
    data = scores.to_json()
    assert data["criterion"] == "aimer"
    assert data["importance"] == {"0": imp.tolist()} and data["raw"] == {"0": (-imp).tolist()}


@pytest.mark.parametrize("n", [0, 3, 6])
def test_n_per_layer_prunes_exactly_the_n_lowest_of_every_layer(n):
    scores = random_scores({0: 8, 3: 12, 5: 16}, seed=4)
    plan = lp.select_experts(scores, None, n_per_layer=n)
    for layer, values in scores.items():
        lowest = sorted(torch.argsort(values)[:n].tolist())
        assert plan.pruned()[layer] == lowest  # by hand: the n smallest scores of the layer
    assert plan.metadata["n_per_layer"] == n and plan.metadata["pruned"] == 3 * n
    assert plan.ratio is None if n else plan.ratio == 0.0  # one ratio only when every layer has the same E


def test_n_per_layer_errors_name_the_value():
    scores = random_scores({0: 8}, seed=1, top_k=2)
    with pytest.raises(ValueError, match="exactly one of ratio"):
        lp.select_experts(scores, 0.5, n_per_layer=2)
    with pytest.raises(ValueError, match="n_per_layer=7 prunes 7 of 8 experts in layer 0, below its floor of 2"):
        lp.select_experts(scores, None, n_per_layer=7)
    with pytest.raises(ValueError, match="allocation must be 'uniform'"):
        lp.select_experts(scores, None, "global", n_per_layer=1)
    with pytest.raises(ValueError, match="non-negative integer, got 1.5"):
        lp.select_experts(scores, None, n_per_layer=1.5)


# ----------------------------------------------------------------------------- counts as the decimal written
def _decimal_floor(ratio: float, total: int) -> int:
    from decimal import ROUND_FLOOR, Decimal

    return int((Decimal(repr(ratio)) * total).to_integral_value(ROUND_FLOOR))


@pytest.mark.parametrize("experts", [50, 100, 150])
def test_uniform_counts_are_the_decimal_ratio_of_each_layer(experts):
    scores = random_scores({0: experts, 1: experts}, seed=2)
    for hundredths in range(1, 96):  # up to the floor of 2 kept (top_k) in 50
        ratio = hundredths / 100
        plan = lp.select_experts(scores, ratio, allocation="uniform")
        want = _decimal_floor(ratio, experts)
        assert pruned_sets(plan) == {layer: lowest(v, want) for layer, v in scores.items()}, ratio
        assert plan.metadata["target_pruned"] == 2 * want


def test_the_sweep_cases_prune_the_decimal_count():
    s100, s50 = random_scores({0: 100, 1: 100}, seed=3), random_scores({0: 50, 1: 50}, seed=3)
    assert lp.select_experts(s100, 0.29).kept_counts() == {0: 71, 1: 71}  # 29 of 100, not 28
    assert lp.select_experts(s50, 0.58).kept_counts() == {0: 21, 1: 21}  # 29 of 50
    plan = lp.select_experts(s100, 0.57, allocation="global")
    assert plan.total_pruned == 114 and plan.metadata["target_pruned"] == 114  # 57% of 200, not 113
    values = {layer: v.numpy() for layer, v in s100.items()}
    assert pruned_sets(plan) == greedy_global(values, 114, {0: 2, 1: 2})


@pytest.mark.parametrize("hundredths", range(1, 99))
def test_global_counts_are_the_decimal_ratio_of_all_experts(hundredths):
    ratio = hundredths / 100
    scores = random_scores({0: 100, 3: 100}, seed=4)
    assert lp.select_experts(scores, ratio, allocation="global").total_pruned == _decimal_floor(ratio, 200)


def test_a_merge_keeps_the_decimal_count():
    from lightprune.experts.merging.methods import kept_counts

    limits = {0: RoutingLimits(100, 2), 1: RoutingLimits(50, 2)}
    assert kept_counts(limits, 0.29) == {0: 71, 1: 36}  # 29 of 100 and 14 of 50 merged away
