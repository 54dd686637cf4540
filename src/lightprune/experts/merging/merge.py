"""A MergePlan applied to a model: each cluster's experts folded into its dominant's slot.

For a cluster C with dominant d and coefficients c (summing to 1), every per-expert tensor T of the fused
experts module (gate_up / up, down and their biases) becomes, in slot d,

    T_d <- sum_{i in C} c_i P_i(T_i)

where P_i permutes expert i's intermediate neurons to match d's (M-SMoE's alignment, ``plan.align``; the
identity otherwise and for d itself). With ``plan.router == "average"`` the router's per-expert tensors (its
row, bias, score-correction bias, per-expert scales) get the same average in slot d; with ``"dominant"`` they stay
d's. The merged layer is then the layer with only the dominants' slots kept: the same ExpertPlan surgery as
pruning ([`lightprune.experts.prune.prune_experts`][...prune.prune_experts]), so the merged model saves, reloads and
verifies through the pruning export.

- [`merged_experts`][]: reversible, for evaluation: the dominants' slots are overwritten (their previous
  values kept aside) and the other members masked at the router ([`lightprune.mask_experts`][...mask.mask_experts]);
  everything is restored on exit, also on error. It computes exactly what the structural merge computes.
- [`write_merged`][] writes the merged tensors in place (irreversibly); [`merge_experts`][] then removes
  the non-dominant slots.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from lightprune.experts.mask import is_masked, mask_experts
from lightprune.experts.merging.align import neuron_permutation, permuted_expert
from lightprune.experts.merging.plan import MergePlan
from lightprune.experts.plan_base import check_plan_kind
from lightprune.experts.prune import _check_not_partitioned, expert_slice, per_expert_tensors, prune_experts
from lightprune.models import MoELayer, find_moe_layers

__all__ = ["merge_experts", "merged_experts", "write_merged"]


def merged_slots(layer: MoELayer, plan: MergePlan) -> list[tuple[torch.Tensor, int, int, int, torch.Tensor]]:
    """(per-expert tensor, experts' dimension, rows per expert, dominant id, merged slot value) for every cluster of
    ``layer`` with more than one member (a single expert stays as it is), computed from the current weights."""
    out = []
    tensors = per_expert_tensors(layer)
    for members, dominant, coefficients in zip(plan.clusters[layer.index], plan.dominant[layer.index],
                                               plan.coefficients[layer.index]):
        if len(members) == 1:
            continue
        aligned = {}
        if plan.align:  # each member's neurons permuted to the dominant's order
            for member in members:
                if member != dominant:
                    perm = neuron_permutation(layer.experts, dominant, member)
                    aligned[member] = permuted_expert(layer.experts, member, perm)
        for found in tensors:
            if found.routing and plan.router == "dominant":
                continue
            name, tensor = found.name, getattr(found.module, found.name)
            dtype = torch.promote_types(tensor.dtype, torch.float32)
            total = None
            for member, weight in zip(members, coefficients):
                value = aligned[member][name] if member in aligned and name in aligned[member] \
                    else expert_slice(tensor.detach(), found.dim, member, found.rows)
                term = value.to(dtype) * weight
                total = term if total is None else total + term
            out.append((tensor, found.dim, found.rows, dominant, total.to(tensor.dtype)))
    return out


def _checked_layers(model: nn.Module, plan: MergePlan, caller: str,
                    layers: list[MoELayer] | None = None) -> list[MoELayer]:
    check_plan_kind(plan, MergePlan, caller)
    if is_masked(model):
        raise ValueError("the model is inside mask_experts (or merged_experts): leave that block before merging")
    _check_not_partitioned(model)
    if layers is None:
        layers = find_moe_layers(model)
        plan.check_layers(layers)
    return [layer for layer in layers if layer.index in plan.clusters]


@torch.no_grad()
def write_merged(model: nn.Module, plan: MergePlan, *, layers: list[MoELayer] | None = None) -> nn.Module:
    """Write every cluster's merged expert into its dominant's slot, in place (the other slots keep their old
    values until [`merge_experts`][] removes them). Returns ``model``. ``layers``: the model's MoE layers, from a
    caller that has checked the plan against them (an export checks it once); by default found and the plan
    checked here."""
    for layer in _checked_layers(model, plan, "write_merged", layers):
        for tensor, dim, rows, dominant, value in merged_slots(layer, plan):
            expert_slice(tensor.data, dim, dominant, rows).copy_(value)
    return model


def merge_experts(model: nn.Module, plan: MergePlan) -> nn.Module:
    """Merge ``model``'s experts by ``plan``, structurally and in place: the merged tensors written, then only
    the dominants' slots kept (in ascending id order). Returns ``model``."""
    _checked_layers(model, plan, "merge_experts")
    write_merged(model, plan)
    return prune_experts(model, plan.expert_plan())


@contextmanager
def merged_experts(model: nn.Module, plan: MergePlan) -> Iterator[nn.Module]:
    """The merged model, reversibly: inside the block ``model`` computes what [`merge_experts`][] would leave;
    on exit every overwritten slot gets its value back and the router masks are removed."""
    layers = _checked_layers(model, plan, "merged_experts")
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []  # (an overwritten slot, a view; its old value)
    try:
        with torch.no_grad():
            for layer in layers:
                for tensor, dim, rows, dominant, value in merged_slots(layer, plan):
                    slot = expert_slice(tensor.data, dim, dominant, rows)
                    saved.append((slot, slot.clone()))
                    slot.copy_(value)
        with mask_experts(model, plan.expert_plan()):
            yield model
    finally:
        with torch.no_grad():
            for slot, original in reversed(saved):
                slot.copy_(original)
