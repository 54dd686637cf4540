"""Scores -> ExpertPlan: uniform or global allocation under the per-layer floor.

- uniform: every layer prunes floor(ratio x E_l) of its lowest-importance experts.
- global: all (layer, expert) pairs ranked together; the lowest floor(ratio x N_total) are
  pruned, skipping any that would take a layer below its floor (the floor: docs/python-api.md; the global
  ranking: MAEP ("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language Models", arXiv
  2611.05927), section 5.3).

The counts are exact: ratio is the decimal it was written as (`lightprune.core.checks.ratio_count`), so
0.29 of 100 experts is 29, not the 28 of ``math.floor(0.29 * 100)`` in binary floating point.
  Values are ranked as given unless ``normalize="log_zscore"``: z-score of log(v + 1e-8) per
  layer first (MAEP section 5.3), for criteria whose scales differ across layers.

Group-limited routers (DeepSeek-V3 ``n_group``) prune in slices of one expert per group (the
q-th weakest of every group), so every group keeps the same count and stays usable; a global
plan may then prune fewer than floor(ratio x N_total) by less than n_group per such layer, and
records the count it reached in ``metadata``.
"""

from __future__ import annotations

import math
from typing import Mapping

import torch

from lightprune.core.checks import check_choice, check_non_negative_int, check_ratio, ratio_count
from lightprune.core.choices import ALLOCATIONS, NORMALIZATIONS
from lightprune.core.errors import listed
from lightprune.experts.plan import ExpertPlan
from lightprune.experts.scores import check_score_values
from lightprune.models.layer import RoutingLimits

__all__ = ["select_experts", "ALLOCATIONS", "NORMALIZATIONS"]

_EPS = 1e-8


def log_zscore(values: torch.Tensor) -> torch.Tensor:
    """(log(v + 1e-8) - mean) / std over one layer's experts (a constant layer gives all zeros)."""
    if (values < 0).any():
        raise ValueError("log_zscore needs non-negative values; got a negative score "
                         f"({float(values.min()):.4g}); use normalize=None for signed scores")
    logs = torch.log(values.double() + _EPS)
    # equal logs give zeros: their floating-point std need not be exactly 0 (128 zeros: ~4e-15)
    if bool((logs == logs[0]).all()):
        return torch.zeros_like(logs)
    return (logs - logs.mean()) / logs.std(unbiased=False)


def _units(layer: int, values: torch.Tensor, limits: RoutingLimits) -> list[tuple[float, int, int, list[int]]]:
    """Pruning units of one layer as (score, layer, order, expert ids), weakest first within the layer.

    Ungrouped: one expert each. Grouped: slice q = the q-th weakest expert of every group, scored by
    its strongest member (a slice goes only when all of its members rank low).
    """
    if limits.n_group <= 1:
        order = sorted(range(values.numel()), key=lambda e: (float(values[e]), e))
        return [(float(values[e]), layer, rank, [e]) for rank, e in enumerate(order)]
    size = limits.group_size
    per_group = [sorted(range(g * size, (g + 1) * size), key=lambda e: (float(values[e]), e))
                 for g in range(limits.n_group)]
    units = []
    for q in range(size):
        ids = [group[q] for group in per_group]
        units.append((max(float(values[e]) for e in ids), layer, q, ids))
    return units


def _max_prunable(limits: RoutingLimits) -> int:
    if limits.n_group <= 1:
        return limits.num_experts - limits.min_experts
    return (limits.group_size - limits.min_per_group) * limits.n_group


def select_experts(importance: Mapping[int, torch.Tensor], ratio: float | None, allocation: str = "uniform",
                   normalize: str | None = None, *, limits: Mapping[int, RoutingLimits] | None = None,
                   criterion: str | None = None, n_per_layer: int | None = None) -> ExpertPlan:
    """Prune ``ratio`` of the routed experts by ``importance`` (higher = keep).

    ``limits`` (per layer top-k, groups) defaults to ``importance.limits`` when the scores come
    from lightprune (``ExpertScores``). ``n_per_layer`` (with ``ratio=None``) prunes exactly that many
    experts from every layer instead (the uniform count of router sensitivity ("Router Sensitivity Under
    Lightweight Fine-Tuning Identifies Prunable Experts in Mixture-of-Experts Models", arXiv 2608.07890), section
    3.4). Errors name the bad value: a ratio outside [0, 1), an unknown allocation or normalisation, non-finite
    scores, scores that cannot be ranked (bool, complex, on the meta device:
    `check_score_values`), a ratio that would cut below a floor.
    """
    return _select(importance, ratio, allocation, normalize, limits=limits, criterion=criterion,
                   n_per_layer=n_per_layer)


def _select(importance: Mapping[int, torch.Tensor], ratio: float | None, allocation: str = "uniform",
            normalize: str | None = None, *, limits: Mapping[int, RoutingLimits] | None = None,
            criterion: str | None = None, n_per_layer: int | None = None,
            counts: Mapping[int, int] | None = None) -> ExpertPlan:
    """[`select_experts`][]; ``counts`` ({layer: experts to prune}, uniform only) replaces ``ratio``'s counts."""
    if (ratio is None) == (n_per_layer is None):
        raise ValueError("give exactly one of ratio (a fraction) or n_per_layer (a count per layer); "
                         f"got ratio={ratio!r}, n_per_layer={n_per_layer!r} (set ratio: null to use n_per_layer)")
    check_choice("allocation", allocation, ALLOCATIONS)
    check_choice("normalize", normalize, NORMALIZATIONS)
    if n_per_layer is not None:
        return _select_count(importance, n_per_layer, allocation, normalize, limits, criterion)
    ratio = check_ratio(ratio)
    limits = limits if limits is not None else getattr(importance, "limits", None)
    if limits is None:
        raise ValueError("select_experts needs each layer's routing limits: pass limits= "
                         "(ExpertScores.limits_of(find_moe_layers(model))) or scores from lightprune")
    if not importance:
        raise ValueError("no scores to select from (empty importance)")
    values: dict[int, torch.Tensor] = {}
    for layer, v in sorted(importance.items()):
        if layer not in limits:
            raise ValueError(f"no routing limits for layer {layer}")
        v = torch.as_tensor(v)
        check_score_values(layer, v)  # bool, complex, meta: nothing to rank
        v = v.detach().double().cpu()
        if v.dim() != 1 or v.numel() != limits[layer].num_experts:
            raise ValueError(f"layer {layer}: expected {limits[layer].num_experts} scores (one per routed expert), "
                             f"got shape {tuple(v.shape)}")
        if not torch.isfinite(v).all():
            bad = {i: x for i, x in enumerate(v.tolist()) if not math.isfinite(x)}
            raise ValueError(f"layer {layer}: non-finite scores {listed(bad.values())} for experts {listed(bad)} "
                             "(NaN or inf statistics)")
        values[layer] = log_zscore(v) if normalize == "log_zscore" else v
    crit = criterion or getattr(importance, "criterion", "unknown")
    num = {layer: limits[layer].num_experts for layer in values}

    pruned: dict[int, set[int]] = {layer: set() for layer in values}
    if allocation == "uniform":
        counts = {layer: ratio_count(ratio, n) for layer, n in num.items()} if counts is None else counts
        for layer, v in values.items():
            lim = limits[layer]
            want = counts[layer]
            if want > _max_prunable(lim):
                raise ValueError(f"ratio {ratio} prunes {want} of {lim.num_experts} experts in layer {layer}, "
                                 f"below its floor of {lim.min_experts} kept (top_k={lim.top_k})")
            units = _units(layer, v, lim)
            slices = want if lim.n_group <= 1 else want // lim.n_group
            for unit in units[:slices]:
                pruned[layer].update(unit[3])
        target = sum(counts.values())
    else:
        total = sum(num.values())
        target = ratio_count(ratio, total)
        capacity = sum(_max_prunable(limits[layer]) for layer in values)
        if target > capacity:
            raise ValueError(f"ratio {ratio} prunes {target} of {total} experts, but the per-layer floors "
                             f"(top_k, groups) allow at most {capacity}")
        units = sorted(u for layer, v in values.items() for u in _units(layer, v, limits[layer]))
        budget = {layer: _max_prunable(limits[layer]) for layer in values}
        done = 0
        for score, layer, order, ids in units:
            if done == target:
                break
            if len(ids) > budget[layer] or done + len(ids) > target:
                continue
            # slices of one layer go weakest first, so a layer never skips a weaker slice
            if order != len(pruned[layer]) // len(ids):
                continue
            pruned[layer].update(ids)
            budget[layer] -= len(ids)
            done += len(ids)
    keep = {layer: sorted(set(range(num[layer])) - pruned[layer]) for layer in values}
    plan = ExpertPlan(keep=keep, num_experts=num, criterion=crit, ratio=float(ratio), allocation=allocation,
                      metadata={"normalize": normalize, "target_pruned": target})
    plan.metadata["pruned"] = plan.total_pruned
    return plan


def _select_count(importance, n: int, allocation: str, normalize: str | None, limits, criterion) -> ExpertPlan:
    """The same count ``n`` pruned from every layer, smallest scores first, each layer's floor enforced."""
    n = check_non_negative_int("n_per_layer", n)
    if allocation != "uniform":
        raise ValueError(f"n_per_layer prunes the same count from every layer: allocation must be 'uniform', "
                         f"got {allocation!r}")
    limits = limits if limits is not None else getattr(importance, "limits", None)
    crit = criterion or getattr(importance, "criterion", "unknown")
    keep, num, pruned = {}, {}, 0
    for layer, values in sorted(importance.items()):
        if limits is None or layer not in limits:
            raise ValueError(f"no routing limits for layer {layer}")
        lim = limits[layer]
        if n > lim.num_experts - lim.min_experts:
            raise ValueError(f"n_per_layer={n} prunes {n} of {lim.num_experts} experts in layer {layer}, below "
                             f"its floor of {lim.min_experts} kept (top_k={lim.top_k})")
        part = _select({layer: values}, n / lim.num_experts, "uniform", normalize, limits={layer: lim},
                       criterion=crit, counts={layer: n})
        keep[layer], num[layer] = part.keep[layer], part.num_experts[layer]
        pruned += part.total_pruned
    ratios = {n / e for e in num.values()}
    return ExpertPlan(keep=keep, num_experts=num, criterion=crit, ratio=ratios.pop() if len(ratios) == 1 else None,
                      allocation="uniform", metadata={"n_per_layer": n, "normalize": normalize,
                                                      "target_pruned": n * len(num), "pruned": pruned})
