"""All Tasks calibration (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), appendix
A.4): min-rank combination against ranks computed by hand."""

from __future__ import annotations

import pytest
import torch

from lightprune.width.min_rank import min_rank_scores, pool_ranks
from lightprune.width.paths import PATHS
from lightprune.width.plan import WidthPlan
from lightprune.width.select import select_channels, select_paths
from lightprune.width.taylor import WidthScores

HEADS, CHANNELS, LAYERS = 3, 5, (0, 2)


def _scores(seed: int) -> WidthScores:
    gen = torch.Generator().manual_seed(seed)
    attn = {l: torch.rand(HEADS, len(PATHS), generator=gen, dtype=torch.float64) for l in LAYERS}
    ffn = {l: {mu: torch.rand(CHANNELS, generator=gen, dtype=torch.float64) for mu in ("vision", "text")}
           for l in LAYERS}
    return WidthScores(attn=attn, ffn=ffn, num_samples=4)


def _hand_ranks(values: list[float]) -> list[int]:
    """Rank 1 = highest; ties to the earlier unit."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    ranks = [0] * len(values)
    for rank, i in enumerate(order, 1):
        ranks[i] = rank
    return ranks


def test_pool_ranks_by_hand() -> None:
    assert pool_ranks(torch.tensor([0.2, 0.9, 0.2, 0.5])).tolist() == [3.0, 1.0, 4.0, 2.0]


def test_selections_prune_the_largest_minimum_ranks_first() -> None:
    categories = [_scores(s) for s in (0, 1, 2)]
    combined = min_rank_scores(categories)
    assert combined.num_samples == 12
    base = WidthPlan({}, {}, {l: HEADS for l in LAYERS}, {l: CHANNELS for l in LAYERS})
    units = [(l, h) for l in LAYERS for h in range(HEADS)]
    for column, path in enumerate(PATHS):
        ranks = [_hand_ranks([float(c.attn[l][h, column]) for l, h in units]) for c in categories]
        aggregate = {u: (min(r[i] for r in ranks), sum(r[i] for r in ranks)) for i, u in enumerate(units)}
        count = round(0.5 * len(units))
        want = set(sorted(units, key=lambda u: aggregate[u])[len(units) - count:])
        plan = select_paths(combined.attn, {path: 0.5}, base)
        got = {(l, h) for l in LAYERS for h in range(HEADS) if not plan.attn_keep[l][h, column]}
        assert got == want, path
    channels = [(l, c) for l in LAYERS for c in range(CHANNELS)]
    for modality in ("vision", "text"):
        ranks = [_hand_ranks([float(s.ffn[l][modality][c]) for l, c in channels]) for s in categories]
        aggregate = {u: (min(r[i] for r in ranks), sum(r[i] for r in ranks)) for i, u in enumerate(channels)}
        want = set(sorted(channels, key=lambda u: aggregate[u])[len(channels) - 4:])
        plan = select_channels(combined.ffn, {modality: 0.4}, base)
        got = {(l, c) for l in LAYERS for c in range(CHANNELS) if not plan.ffn_keep[l][modality][c]}
        assert got == want, modality


def test_one_category_keeps_its_own_order_and_mismatched_units_are_refused() -> None:
    single = _scores(5)
    combined = min_rank_scores([single])
    for column in range(len(PATHS)):
        flat = torch.cat([single.attn[l][:, column] for l in LAYERS])
        again = torch.cat([combined.attn[l][:, column] for l in LAYERS])
        assert torch.equal(torch.argsort(flat, stable=True), torch.argsort(again, stable=True))
    other = _scores(6)
    other.attn[0] = other.attn[0][:2]
    with pytest.raises(ValueError, match="other units"):
        min_rank_scores([single, other])
    with pytest.raises(ValueError, match="at least one"):
        min_rank_scores([])
