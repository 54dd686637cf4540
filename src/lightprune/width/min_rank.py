"""MWOP's "All Tasks" calibration: per-category rankings combined by their minimum rank (MWOP ("MWOP:
Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), appendix A.4).

Each task category c gives its own Taylor scores ([`taylor_importance`][..taylor_importance] on that
category's calibration samples). Within every pool that a selection ranks (`lightprune.width.select`: the
(layer, head) units of one path type across all layers; the channels of one modality across all dense-FFN layers)
unit u gets rank r_c(u) in category c, rank 1 the highest score (ties to the earlier unit). The aggregate rank is

    r(u) = min_c r_c(u)

("favoring units important to at least one category"); the paper leaves ties of r open, here they go to the
smaller sum of ranks over the categories. [`min_rank_scores`][] returns scores of the same shapes whose order is
that aggregate (score = -(r(u) + sum_c r_c(u) / (C n + 1)) for a pool of n units), so the selections prune the
units with the largest aggregate rank first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lightprune.width.paths import MODALITIES, PATHS
from lightprune.width.taylor import WidthScores

__all__ = ["min_rank_scores", "pool_ranks"]


def pool_ranks(scores: torch.Tensor) -> torch.Tensor:
    """Ranks of a 1-D tensor of scores, 1 for the highest (ties to the lower index), float64."""
    order = torch.sort(-scores.double(), stable=True).indices
    ranks = torch.empty(scores.numel(), dtype=torch.float64)
    ranks[order] = torch.arange(1, scores.numel() + 1, dtype=torch.float64)
    return ranks


def _combine(pools: list[torch.Tensor]) -> torch.Tensor:
    """Per-category score vectors of one pool -> the aggregate order's scores (module docstring)."""
    ranks = torch.stack([pool_ranks(p) for p in pools])                       # [C, n]
    count, n = ranks.shape
    return -(ranks.min(dim=0).values + ranks.sum(dim=0) / (count * n + 1))


def min_rank_scores(per_category: Sequence[WidthScores]) -> WidthScores:
    """One [`WidthScores`][] whose every pool is ordered by the categories' minimum rank (module docstring);
    ``num_samples`` is the categories' total. The categories must score the same layers, heads and channels."""
    if not per_category:
        raise ValueError("min_rank_scores needs the scores of at least one category")
    first = per_category[0]
    for i, other in enumerate(per_category[1:], 1):
        shapes = lambda s: ({l: tuple(t.shape) for l, t in s.attn.items()},  # noqa: E731
                            {l: {mu: tuple(t[mu].shape) for mu in MODALITIES} for l, t in s.ffn.items()})
        if shapes(other) != shapes(first):
            raise ValueError(f"category {i} scores other units than category 0: {shapes(other)} vs {shapes(first)}")
    attn_layers, ffn_layers = sorted(first.attn), sorted(first.ffn)
    attn = {l: torch.zeros_like(first.attn[l], dtype=torch.float64) for l in attn_layers}
    heads = [first.attn[l].shape[0] for l in attn_layers]
    for column in range(len(PATHS) if attn_layers else 0):
        pools = [torch.cat([s.attn[l][:, column].double() for l in attn_layers]) for s in per_category]
        for l, part in zip(attn_layers, torch.split(_combine(pools), heads)):
            attn[l][:, column] = part
    ffn = {l: {} for l in ffn_layers}
    channels = [first.ffn[l][MODALITIES[0]].numel() for l in ffn_layers]
    for modality in MODALITIES if ffn_layers else ():
        pools = [torch.cat([s.ffn[l][modality].double() for l in ffn_layers]) for s in per_category]
        for l, part in zip(ffn_layers, torch.split(_combine(pools), channels)):
            ffn[l][modality] = part
    return WidthScores(attn=attn, ffn=ffn, num_samples=sum(int(s.num_samples) for s in per_category))
