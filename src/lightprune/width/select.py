"""Taylor scores -> WidthPlan masks: global ranking per path type and per FFN modality (MWOP).

MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), sections 4 and 5 and appendix
D.2: attention units are (layer, head) pairs, ranked per path type (V2V, T2V, T2T) across all layers at once; FFN
units are channels, ranked per modality across all dense-FFN layers. At ratio r of n units the round(r * n)
lowest-scored units are pruned (in exact arithmetic, r the decimal it was written as:
`lightprune.core.checks.ratio_count`; half to even); ties go to the unit that comes first in
(layer, head / channel) order, so a selection is deterministic. "Last-layer-first" (MWOP section 5) spends the
visual-FFN budget on the final dense layer's channels before ranking the rest.

Selections are cumulative: [`select_paths`][] and [`select_channels`][] replace only the masks of the
path / modality they select, on top of ``base`` (the masks fixed by earlier stages of the search).
[`random_scores`][] gives scores of the same shapes for the random baseline at the same ratios.
"""

from __future__ import annotations

from typing import Mapping

import torch

from lightprune.core.checks import check_interval, ratio_count
from lightprune.core.errors import PlanError, listed
from lightprune.width.paths import MODALITIES, PATHS
from lightprune.width.plan import WidthPlan

__all__ = ["select_paths", "select_channels", "random_scores"]


def _check_ratio(name: str, ratio: float) -> float:
    return check_interval(f"ratio for {name!r}", ratio, 0, 1)  # a number: not a string or a bool, nor NaN


def _lowest(values: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` smallest entries of a 1-D tensor; ties to the lower index."""
    order = torch.sort(values.double(), stable=True).indices
    return order[:count]


def select_paths(scores: Mapping[int, torch.Tensor], ratios: Mapping[str, float], base: WidthPlan) -> WidthPlan:
    """Prune ``ratios[path]`` of every path type's (layer, head) units, lowest Taylor score first.

    Args:
        scores: {layer: [heads, 3]} attention Taylor scores (columns `PATHS`).
        ratios: {path: fraction of that path's units to prune}, e.g. ``{"v2v": 0.4}``.
        base: the plan to start from; the selected paths' columns are replaced, everything else kept.
    """
    bad = sorted(set(ratios) - set(PATHS))
    if bad:
        raise ValueError(f"unknown attention paths {bad}; choose among {list(PATHS)}")
    layers = sorted(base.num_heads)
    missing = sorted(set(layers) - set(int(l) for l in scores))
    if missing:
        raise PlanError(f"attention scores are missing layers {listed(missing)}")
    for l in layers:
        if tuple(scores[l].shape) != (base.num_heads[l], len(PATHS)):
            raise PlanError(f"attention scores of layer {l} have shape {tuple(scores[l].shape)}, "
                            f"expected ({base.num_heads[l]}, {len(PATHS)})")
    keep = {l: (base.attn_keep[l].clone() if l in base.attn_keep
                else torch.ones(base.num_heads[l], len(PATHS), dtype=torch.bool)) for l in layers}
    offsets = [0]
    for l in layers:
        offsets.append(offsets[-1] + base.num_heads[l])
    for path, ratio in ratios.items():
        column = PATHS.index(path)
        flat = torch.cat([scores[l][:, column].detach().double().cpu() for l in layers])
        pruned = _lowest(flat, ratio_count(_check_ratio(path, ratio), flat.numel(), round))
        mask = torch.ones(flat.numel(), dtype=torch.bool)
        mask[pruned] = False
        for i, l in enumerate(layers):
            keep[l][:, column] = mask[offsets[i]:offsets[i + 1]]
    return base.replace(attn_keep=keep)


def select_channels(scores: Mapping[int, Mapping[str, torch.Tensor]], ratios: Mapping[str, float], base: WidthPlan,
                    last_layer_first: bool = False) -> WidthPlan:
    """Prune ``ratios[modality]`` of every modality's FFN channels across the dense-FFN layers.

    Args:
        scores: {layer: {"vision": [m], "text": [m]}} FFN Taylor scores.
        ratios: {modality: fraction of that modality's channels to prune}, e.g. ``{"vision": 0.5}``.
        base: the plan to start from; the selected modalities' masks are replaced.
        last_layer_first: spend the vision budget on the last dense layer's channels first.
    """
    bad = sorted(set(ratios) - set(MODALITIES))
    if bad:
        raise ValueError(f"unknown FFN modalities {bad}; choose among {list(MODALITIES)}")
    layers = sorted(base.intermediate_size)
    if not layers and ratios:
        raise PlanError("the model has no dense FFN layer (its FFNs are experts): FFN channels do not apply")
    missing = sorted(set(layers) - set(int(l) for l in scores))
    if missing:
        raise PlanError(f"FFN scores are missing layers {listed(missing)}")
    keep = {l: {mod: (base.ffn_keep[l][mod].clone() if l in base.ffn_keep
                      else torch.ones(base.intermediate_size[l], dtype=torch.bool)) for mod in MODALITIES}
            for l in layers}
    offsets = [0]
    for l in layers:
        offsets.append(offsets[-1] + base.intermediate_size[l])
    for modality, ratio in ratios.items():
        flat = torch.cat([scores[l][modality].detach().double().cpu() for l in layers])
        for l in layers:
            if scores[l][modality].numel() != base.intermediate_size[l]:
                raise PlanError(f"{modality} FFN scores of layer {l} have {scores[l][modality].numel()} channels, "
                                f"expected {base.intermediate_size[l]}")
        budget = ratio_count(_check_ratio(modality, ratio), flat.numel(), round)
        if last_layer_first and modality == "vision":
            # channels of the last layer rank below every other channel, in their own score order
            flat = flat.clone()
            last = slice(offsets[-2], offsets[-1])
            flat[last] = flat[last] - (flat.max() - flat.min() + 1.0) * 2
        mask = torch.ones(flat.numel(), dtype=torch.bool)
        mask[_lowest(flat, budget)] = False
        for i, l in enumerate(layers):
            keep[l][modality] = mask[offsets[i]:offsets[i + 1]]
    return base.replace(ffn_keep=keep)


def random_scores(plan: WidthPlan, seed: int) -> tuple[dict[int, torch.Tensor], dict[int, dict[str, torch.Tensor]]]:
    """Uniform random (attention, FFN) scores shaped like ``plan``'s units: the random baseline's ranking."""
    gen = torch.Generator().manual_seed(int(seed))
    attn = {l: torch.rand(h, len(PATHS), generator=gen, dtype=torch.float64) for l, h in sorted(plan.num_heads.items())}
    ffn = {l: {mod: torch.rand(m, generator=gen, dtype=torch.float64) for mod in MODALITIES}
           for l, m in sorted(plan.intermediate_size.items())}
    return attn, ffn
