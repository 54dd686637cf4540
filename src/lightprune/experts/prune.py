"""Structural expert removal, in place: router rows, router biases, fused expert tensors, counts.

For each layer of the plan, the kept ids index dimension 0 of the router ``weight [E, H]``, any
router bias and ``e_score_correction_bias [E]``, and the fused expert parameters
(``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]`` and their biases); every ``num_experts``
attribute and the config follow (non-uniform counts per layer go to the config's
``lightprune_experts_per_layer``). The result equals the masked model exactly. A NaN or inf in a tensor the routing
reads is refused before anything changes (`check_routing`): the pruned model would route on it.

Surgery changes shapes, which DeepSpeed ZeRO-3 cannot re-partition in place: a model with
partitioned parameters is refused with an error that points to
`lightprune.core.distributed.materialize` (the callbacks call it at the end of a ZeRO-3 job).
Under DDP and ZeRO-1/2 every rank holds full parameters and applies the same plan.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from lightprune.core.distributed import PartitionedModelError, is_partitioned
from lightprune.core.errors import listed
from lightprune.experts.plan import ExpertPlan
from lightprune.experts.plan_base import check_plan_kind
from lightprune.models import MoELayer, find_moe_layers, get_family
from lightprune.models.layer import config_value
from lightprune.models.resize import EXPERT_TENSORS, ROUTER_TENSORS
from lightprune.models.routing_check import check_routing_tensors

__all__ = ["prune_experts", "EXPERT_TENSORS", "ROUTER_TENSORS"]


class PerExpertTensor(NamedTuple):
    """A tensor with entries per expert: ``getattr(module, name)``, the experts along ``dim``; ``routing``: one the
    routing reads (a prune keeps [`MoELayer.router_rows`][lightprune.models.layer.MoELayer.router_rows] of it);
    ``rows``: consecutive entries each expert holds (DBRX's ``w1`` [E * I, H]: I)."""

    module: nn.Module
    name: str
    dim: int
    routing: bool
    rows: int = 1

    def entries(self, layer: MoELayer, kept: torch.Tensor) -> torch.Tensor:
        """The entries along `dim` that the layer keeping the experts ``kept`` (ascending ids) holds."""
        if self.routing:
            return layer.router_rows(kept)
        if self.rows == 1:
            return kept
        return (kept.unsqueeze(-1) * self.rows + torch.arange(self.rows, dtype=kept.dtype)).reshape(-1)

    def count(self, layer: MoELayer, experts: int) -> int:
        """The entries along `dim` of the layer holding ``experts`` experts."""
        return experts + layer.identity_experts if self.routing else experts * self.rows


def expert_slice(tensor: torch.Tensor, dim: int, expert: int, rows: int = 1) -> torch.Tensor:
    """Expert ``expert``'s part of a per-expert tensor (a view): its slice along ``dim``, or its ``rows``
    consecutive entries there."""
    return tensor.select(dim, expert) if rows == 1 else tensor.narrow(dim, expert * rows, rows)


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


def per_expert_tensors(layer: MoELayer) -> list[PerExpertTensor]:
    """Every per-expert tensor of ``layer``: the experts' (`MoEFamily.expert_tensors`), then the family's
    per-expert routing tensors (`MoEFamily.router_expert_tensors`: the router's rows and the family's other
    router and block per-expert tensors; a prune keeps their
    [`MoELayer.router_rows`][lightprune.models.layer.MoELayer.router_rows], any identity experts' entries too)."""
    found = [PerExpertTensor(module, name, 0, False, rows) for module, name, rows in layer.family.expert_tensors(layer)]
    return found + [PerExpertTensor(module, name, dim, True)
                    for module, name, dim in layer.family.router_expert_tensors(layer)]


def check_routing(layers: list[MoELayer], where: str) -> None:
    """Refuse a NaN or inf in a tensor the routing of ``layers`` reads (`MoEFamily.routing_tensors`), before a
    prune changes or writes anything: the pruned model would route on it. ``where``: the entry point, for the
    error; tensors not in memory (the meta device) are skipped."""
    for layer in layers:
        check_routing_tensors(layer, where, "nothing was pruned or written (the pruned model would route on it)")


def prune_experts(model: nn.Module, plan: ExpertPlan, *, layers: list[MoELayer] | None = None) -> nn.Module:
    """Remove the experts ``plan`` prunes from ``model``, in place; returns ``model``. The plan is checked against
    the model ([`ExpertPlan.check_layers`][]), and every tensor the routing reads is checked finite
    (`check_routing`), before anything changes. ``layers``: the model's MoE layers, from a caller that has
    checked the plan against them (an export checks it once); by default found and the plan checked here."""
    check_plan_kind(plan, ExpertPlan, "prune_experts")
    _check_not_partitioned(model)
    if layers is None:
        layers = find_moe_layers(model)
        plan.check_layers(layers)
    check_routing(layers, "prune_experts")
    family = get_family(model)
    old_count = config_value(family.text_config, family.num_experts_key)
    for layer in layers:
        if layer.index not in plan.keep or len(plan.keep[layer.index]) == layer.num_experts:
            continue
        index = torch.tensor(plan.keep[layer.index], dtype=torch.long)
        for tensor in per_expert_tensors(layer):
            _index_along(tensor.module, tensor.name, tensor.dim, tensor.entries(layer, index))
        family.set_layer_count(layer, len(index))
    layers = find_moe_layers(model)
    counts = {layer.index: layer.num_experts for layer in layers}
    family.set_expert_counts(counts)
    _set_model_counts(model, layers, old_count, config_value(family.text_config, family.num_experts_key))
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
        for tensor in per_expert_tensors(layer):
            _index_along(tensor.module, tensor.name, tensor.dim, tensor.count(layer, count))
        layer.family.set_layer_count(layer, count)
    return model
