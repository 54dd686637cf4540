"""Spearman rank correlation, float64, with average ranks for ties.

Used by the closed-form alpha of MAEP ("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language
Models", arXiv 2611.05927), section 5.3, MAEP's Delta-H validation against the ground-truth KL (appendix I) and
ranking stability across calibration sets.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["spearman"]


def _average_ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks of ``x`` (float64), tied values sharing the mean of their positions."""
    sorted_vals, order = torch.sort(x, stable=True)
    _, inverse, counts = torch.unique_consecutive(sorted_vals, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    starts = ends - counts.double() + 1.0
    ranks = torch.empty_like(x, dtype=torch.float64)
    ranks[order] = ((starts + ends) / 2.0)[inverse]
    return ranks


def spearman(a: Any, b: Any, label: str | None = None) -> float:
    """Spearman rank correlation of two equally long 1-D sequences, in float64.

    Ties get average ranks; rho is the Pearson correlation of the ranks. A constant input (or
    fewer than two values) has no ranking and gives NaN. NaN or inf inputs are a ValueError naming their positions
    (the experts of a layer's scores) and ``label`` (what is compared, e.g. the layer): they have no rank.
    """
    x = torch.as_tensor(a).detach().cpu().double().flatten()
    y = torch.as_tensor(b).detach().cpu().double().flatten()
    if x.numel() != y.numel():
        raise ValueError(f"spearman needs two equally long vectors, got {x.numel()} and {y.numel()} values")
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        bad = [(~torch.isfinite(v)).nonzero().flatten().tolist() for v in (x, y)]
        raise ValueError(f"{label + ': ' if label else ''}spearman got NaN or inf values at positions (experts) "
                         f"{bad[0]} of the first and {bad[1]} of the second ranking; they have no rank")
    if x.numel() < 2:
        return math.nan
    rx = _average_ranks(x)
    ry = _average_ranks(y)
    rx = rx - rx.mean()
    ry = ry - ry.mean()
    denom = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    if denom == 0.0:
        return math.nan
    return max(-1.0, min(1.0, float((rx * ry).sum()) / denom))
