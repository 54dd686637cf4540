"""Structural expert removal, in place: router rows, router biases, fused expert tensors, counts.

For each layer of the plan, the kept ids index dimension 0 of the router ``weight [E, H]``, any
router bias and ``e_score_correction_bias [E]``, and the fused expert parameters
(``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]`` and their biases); every ``num_experts``
attribute and the config follow (non-uniform counts per layer go to the config's
``lightprune_experts_per_layer``). The result equals the masked model exactly. A NaN or inf in a tensor the routing
reads is refused before anything changes (:func:`check_routing`): the pruned model would route on it.

Surgery changes shapes, which DeepSpeed ZeRO-3 cannot re-partition in place: a model with
partitioned parameters is refused with an error that points to
:func:`lightprune.core.distributed.materialize` (the callbacks call it at the end of a ZeRO-3 job).
Under DDP and ZeRO-1/2 every rank holds full parameters and applies the same plan.
"""

from __future__ import annotations

import torch
from torch import nn

from lightprune.core.distributed import PartitionedModelError, is_partitioned
from lightprune.core.errors import listed
from lightprune.experts.plan import ExpertPlan
from lightprune.experts.plan_base import check_plan_kind
from lightprune.models import MoELayer, find_moe_layers, get_family
from lightprune.models.base import ROUTER_TENSORS
from lightprune.models.routing_check import check_routing_tensors

__all__ = ["prune_experts", "resize_experts", "per_expert_tensors", "check_routing", "EXPERT_TENSORS",
           "ROUTER_TENSORS"]

#: per-expert tensors of a fused experts module (dimension 0 indexes experts)
EXPERT_TENSORS = ("gate_up_proj", "down_proj", "up_proj", "gate_up_proj_bias", "down_proj_bias", "up_proj_bias")


def _index_along(module: nn.Module, name: str, dim: int, index: torch.Tensor | int) -> None:
    """Replace tensor ``name`` of ``module`` with its entries ``index`` along ``dim`` (a tensor), or an empty tensor
    of ``index`` entries there; parameters stay parameters, buffers keep their persistence."""
    tensor = getattr(module, name)
    if isinstance(index, torch.Tensor):
        data = tensor.data.index_select(dim, index.to(tensor.device))
    else:
        shape = list(tensor.shape)
        shape[dim] = index
        data = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
    if isinstance(tensor, nn.Parameter):
        setattr(module, name, nn.Parameter(data, requires_grad=tensor.requires_grad))
    else:
        module.register_buffer(name, data, persistent=name in _persistent_buffers(module))


def _check_not_partitioned(model: nn.Module) -> None:
    names = [n for n, p in model.named_parameters() if is_partitioned(p)]
    if names:
        raise PartitionedModelError(
            f"prune_experts got a DeepSpeed ZeRO-3 partitioned model ({len(names)} partitioned parameters, e.g. "
            f"{names[0]!r}); structural surgery needs full tensors: call "
            "lightprune.core.distributed.materialize(model, engine) first (every rank)")


def _persistent_buffers(module: nn.Module) -> set[str]:
    return {n for n in module._buffers if n not in module._non_persistent_buffers_set}


def per_expert_tensors(layer: MoELayer) -> list[tuple[nn.Module, str, int, bool]]:
    """(module, tensor name, experts' dimension, is a router tensor) of every per-expert tensor of ``layer``: the
    fused expert parameters, then the family's per-expert routing tensors (:meth:`MoEFamily.router_expert_tensors`:
    the router's rows and the family's other router and block per-expert tensors; a prune keeps their
    :meth:`MoELayer.router_rows`, the zero-computation experts' entries too)."""
    found = [(layer.experts, name, 0, False) for name in EXPERT_TENSORS
             if isinstance(getattr(layer.experts, name, None), torch.Tensor)]
    return found + [(module, name, dim, True) for module, name, dim in layer.family.router_expert_tensors(layer)]


def check_routing(layers: list[MoELayer], where: str) -> None:
    """Refuse a NaN or inf in a tensor the routing of ``layers`` reads (:meth:`MoEFamily.routing_tensors`), before a
    prune changes or writes anything: the pruned model would route on it. ``where``: the entry point, for the
    error; tensors not in memory (the meta device) are skipped."""
    for layer in layers:
        check_routing_tensors(layer, where, "nothing was pruned or written (the pruned model would route on it)")


def prune_experts(model: nn.Module, plan: ExpertPlan) -> nn.Module:
    """Remove the experts ``plan`` prunes from ``model``, in place; returns ``model``. The plan is checked against
    the model (:meth:`ExpertPlan.check_layers`), and every tensor the routing reads is checked finite
    (:func:`check_routing`), before anything changes."""
    check_plan_kind(plan, ExpertPlan, "prune_experts")
    _check_not_partitioned(model)
    layers = find_moe_layers(model)
    plan.check_layers(layers)
    check_routing(layers, "prune_experts")
    family = get_family(model)
    old_count = getattr(family.text_config, family.num_experts_key, None)
    for layer in layers:
        if layer.index not in plan.keep or len(plan.keep[layer.index]) == layer.num_experts:
            continue
        index = torch.tensor(plan.keep[layer.index], dtype=torch.long)
        for module, name, dim, routing in per_expert_tensors(layer):
            _index_along(module, name, dim, layer.router_rows(index) if routing else index)
        family.set_layer_count(layer, len(index))
    layers = find_moe_layers(model)
    counts = {layer.index: layer.num_experts for layer in layers}
    family.set_expert_counts(counts)
    _set_model_counts(model, layers, old_count, getattr(family.text_config, family.num_experts_key))
    return model


def _set_model_counts(model: nn.Module, layers: list[MoELayer], old: int | None, new: int) -> None:
    """Update ``num_experts`` copies held outside the MoE blocks.

    transformers' ``*ForCausalLM`` (Mixtral, Qwen2/3-MoE, OLMoE) copies the config's expert count
    to ``self.num_experts`` at construction and sizes the load-balancing loss with it, so a stale
    count breaks ``output_router_logits=True`` on the pruned model.
    """
    if old is None or old == new:
        return
    inside = {id(m) for layer in layers for m in layer.block.modules()}
    for module in model.modules():
        if id(module) in inside:
            continue
        value = module.__dict__.get("num_experts")
        if isinstance(value, int) and not isinstance(value, bool) and value == old:
            module.num_experts = new


def resize_experts(model: nn.Module, counts: dict[int, int]) -> nn.Module:
    """Give each listed MoE layer ``counts[layer]`` empty expert slots (weights to be loaded after).

    Used to build a non-uniformly pruned architecture from its config before loading its weights.
    """
    by_index = {layer.index: layer for layer in find_moe_layers(model)}
    unknown = sorted(set(counts) - set(by_index))
    if unknown:
        raise ValueError(f"expert counts name layers {listed(unknown)} that are not MoE layers (MoE layers: "
                         f"{listed(sorted(by_index))})")
    for index, count in counts.items():
        layer = by_index[index]
        if count == layer.num_experts:
            continue
        for module, name, dim, routing in per_expert_tensors(layer):
            _index_along(module, name, dim, count + layer.identity_experts if routing else count)
        layer.family.set_layer_count(layer, count)
    return model
