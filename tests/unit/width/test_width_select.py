"""select_paths / select_channels (the ranking of MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for
Efficient MLLMs"), sections 4 and 5) against a plain-Python global sort."""

from __future__ import annotations

import pytest
import torch

from lightprune.core.errors import PlanError
from lightprune.width.paths import PATHS
from lightprune.width.plan import WidthPlan
from lightprune.width.select import random_scores, select_channels, select_paths

HEADS = {0: 4, 1: 4, 2: 4}
WIDTH = {0: 10, 2: 10}  # layer 1 is an MoE layer: no dense FFN


def _dense() -> WidthPlan:
    return WidthPlan(attn_keep={l: torch.ones(h, 3, dtype=torch.bool) for l, h in HEADS.items()},
                     ffn_keep={l: {"vision": torch.ones(m, dtype=torch.bool), "text": torch.ones(m, dtype=torch.bool)}
                               for l, m in WIDTH.items()}, num_heads=HEADS, intermediate_size=WIDTH)


def _reference_prune(units: list[tuple[float, int, int]], ratio: float) -> set[tuple[int, int]]:
    ranked = sorted(units)  # by score, then layer, then index: the documented tie rule
    return {(l, i) for _, l, i in ranked[:round(ratio * len(units))]}


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 1.0])
def test_paths_are_ranked_globally_per_path(ratio):
    gen = torch.Generator().manual_seed(1)
    scores = {l: torch.randint(0, 5, (h, 3), generator=gen).double() for l, h in HEADS.items()}  # many ties
    plan = select_paths(scores, {"t2v": ratio, "v2v": 0.5}, _dense())
    for path in ("t2v", "v2v"):
        col = PATHS.index(path)
        units = [(float(scores[l][h, col]), l, h) for l in HEADS for h in range(HEADS[l])]
        expected = _reference_prune(units, ratio if path == "t2v" else 0.5)
        got = {(l, h) for l in HEADS for h in range(HEADS[l]) if not plan.attn_keep[l][h, col]}
        assert got == expected
    assert all(plan.attn_keep[l][:, PATHS.index("t2t")].all() for l in HEADS)


def test_selection_is_cumulative_on_the_base():
    scores = {l: torch.arange(h * 3, dtype=torch.float64).reshape(h, 3) + l for l, h in HEADS.items()}
    first = select_paths(scores, {"v2v": 0.5}, _dense())
    second = select_paths(scores, {"t2v": 0.25}, first)
    col = PATHS.index("v2v")
    assert all(torch.equal(first.attn_keep[l][:, col], second.attn_keep[l][:, col]) for l in HEADS)
    assert second.pruned_fraction("t2v") == 0.25 and second.pruned_fraction("v2v") == 0.5


@pytest.mark.parametrize("last_layer_first", [False, True])
def test_channels_are_ranked_per_modality_across_dense_layers(last_layer_first):
    gen = torch.Generator().manual_seed(2)
    scores = {l: {"vision": torch.rand(m, generator=gen, dtype=torch.float64),
                  "text": torch.rand(m, generator=gen, dtype=torch.float64)} for l, m in WIDTH.items()}
    plan = select_channels(scores, {"vision": 0.65}, _dense(), last_layer_first=last_layer_first)
    units = [(float(scores[l]["vision"][c]), l, c) for l in WIDTH for c in range(WIDTH[l])]
    if last_layer_first:  # the last dense layer's 10 channels go first, then 3 by global rank
        expected = {(2, c) for c in range(10)} | {(l, c) for _, l, c in sorted(u for u in units if u[1] != 2)[:3]}
    else:
        expected = _reference_prune(units, 0.65)
    got = {(l, c) for l in WIDTH for c in range(WIDTH[l]) if not plan.ffn_keep[l]["vision"][c]}
    assert got == expected
    assert all(plan.ffn_keep[l]["text"].all() for l in WIDTH)


def test_bad_inputs_are_named():
    scores = {l: torch.zeros(h, 3) for l, h in HEADS.items()}
    with pytest.raises(ValueError, match="v2t"):
        select_paths(scores, {"v2t": 0.1}, _dense())
    with pytest.raises(ValueError, match="1.5"):
        select_paths(scores, {"v2v": 1.5}, _dense())
    with pytest.raises(PlanError, match=r"\[2\]"):
        select_paths({0: scores[0], 1: scores[1]}, {"v2v": 0.1}, _dense())
    moe_only = WidthPlan(attn_keep={}, ffn_keep={}, num_heads=HEADS, intermediate_size={})
    with pytest.raises(PlanError, match="experts"):
        select_channels({}, {"vision": 0.5}, moe_only)


def test_random_scores_are_seeded_and_shaped():
    a_attn, a_ffn = random_scores(_dense(), seed=3)
    b_attn, b_ffn = random_scores(_dense(), seed=3)
    c_attn, _ = random_scores(_dense(), seed=4)
    assert all(torch.equal(a_attn[l], b_attn[l]) and a_attn[l].shape == (4, 3) for l in HEADS)
    assert not torch.equal(a_attn[0], c_attn[0])
    assert set(a_ffn) == set(WIDTH) and a_ffn[0]["vision"].shape == (10,)


def test_counts_are_the_decimal_ratio_rounded_half_to_even():
    """0.35 of 90 units is 31.5, rounded to 32 (half to even); binary floating point gives 31.499999999999996 -> 31."""
    heads = {layer: 10 for layer in range(9)}
    base = WidthPlan(attn_keep={}, ffn_keep={}, num_heads=heads, intermediate_size={0: 90})
    gen = torch.Generator().manual_seed(5)
    attn = {layer: torch.rand(10, 3, generator=gen) for layer in heads}
    paths = select_paths(attn, {"v2v": 0.35}, base)
    assert sum(int((~mask[:, PATHS.index("v2v")]).sum()) for mask in paths.attn_keep.values()) == 32
    ffn = {0: {"vision": torch.rand(90, generator=gen), "text": torch.rand(90, generator=gen)}}
    channels = select_channels(ffn, {"vision": 0.35, "text": 0.07}, base)
    assert int((~channels.ffn_keep[0]["vision"]).sum()) == 32
    assert int((~channels.ffn_keep[0]["text"]).sum()) == 6  # 6.3
