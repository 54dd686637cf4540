"""Reversible expert masking: the router selects among the kept experts only.

Inside ``with mask_experts(model, plan):`` every MoE router of the plan is replaced (per instance, never per class) by
its family's routing run on the kept experts' logits (and their biases): the same operations the pruned model's stock
router runs on its pruned tensors, so the model computes exactly what the structurally pruned model computes, exact ties
in the logits included (tested per family); the removed experts' logits read -inf. Leaving the block restores the
original routers, also on error. The plan is checked against the model first
([`ExpertPlan.check_layers`][..plan.ExpertPlan.check_layers]), and so is every tensor the masked routers read: a NaN or
inf is refused before any router is replaced (`check_routing_tensors`; a layer on the meta device, loaded later, is
skipped); a MergePlan is refused (``lp.merged_experts``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from lightprune.experts.plan import ExpertPlan
from lightprune.experts.plan_base import check_plan_kind
from lightprune.models import MoELayer, find_moe_layers
from lightprune.models.layer import kept_experts
from lightprune.models.routing_check import check_routing_tensors

__all__ = ["mask_experts"]

_MASK_ATTR = "_lightprune_expert_mask"


def is_masked(model: nn.Module) -> bool:
    """True while ``model`` is inside a [`mask_experts`][] block."""
    return any(hasattr(layer.router, _MASK_ATTR) for layer in find_moe_layers(model))


def _masked_forward(layer, mask: torch.Tensor):
    """The router's forward with ``mask`` applied: the pruned layer's router on the kept experts' columns
    (``MoEFamily.route_kept``, ties broken as there), the kept ids found once (per device); arguments after the
    hidden states (a bias the block passes in, MiniMax-M2) are the block's own tensors, which the family's routing
    reads from the block itself. It returns what the router's own forward returns (``MoEFamily.router_output``)."""
    family = layer.family
    kept_on = {mask.device: kept_experts(mask)}
    if not family.keeps_a_layer(layer, kept_on[mask.device]):  # no pruned layer to match: -inf over E
        return lambda hidden_states, *args, **kwargs: family.router_output(layer, layer.route(hidden_states, mask))

    def forward(hidden_states: torch.Tensor, *args, **kwargs):
        kept = kept_on.get(hidden_states.device)
        if kept is None:
            kept = kept_on[hidden_states.device] = kept_on[mask.device].to(hidden_states.device)
        return family.router_output(layer, family.route_kept(layer, hidden_states, kept))
    return forward


@contextmanager
def mask_experts(model: nn.Module, plan: ExpertPlan, *, layers: list[MoELayer] | None = None) -> Iterator[nn.Module]:
    """Mask the experts ``plan`` prunes, for the duration of the block; yields ``model``. ``layers``: the model's MoE
    layers, from a caller that has checked the plan against them (an export checks it once); by default found and
    the plan checked here."""
    check_plan_kind(plan, ExpertPlan, "mask_experts")
    if layers is None:
        layers = find_moe_layers(model)
        plan.check_layers(layers)
    for layer in layers:
        if layer.index in plan.keep:  # once per layer and block: the routers below read these tensors
            check_routing_tensors(layer, "mask_experts", "nothing was masked (the masked model would route on it)")
    installed = []
    try:
        for layer in layers:
            if layer.index not in plan.keep:
                continue
            router = layer.router
            if hasattr(router, _MASK_ATTR):
                raise RuntimeError(f"layer {layer.index} is already masked: nested mask_experts is not supported")
            device = layer.router_linear.weight.device  # a layer not loaded yet (meta): its mask waits on the CPU
            mask = torch.ones(layer.num_experts, dtype=torch.bool, device=device if device.type != "meta" else "cpu")
            mask[plan.keep[layer.index]] = False
            previous = router.__dict__.get("forward")
            router.forward = _masked_forward(layer, mask)
            setattr(router, _MASK_ATTR, mask)
            installed.append((router, previous))
        yield model
    finally:
        for router, previous in installed:
            del router.forward
            if previous is not None:
                router.forward = previous
            delattr(router, _MASK_ATTR)
