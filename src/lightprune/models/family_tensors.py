"""Where a family's per-expert tensors are, and the config counts that follow them after a prune: the
`FamilyTensors` part of [`MoEFamily`][..base.MoEFamily] (it reads the family's settings:
``expert_sub_tensors``, ``expert_rows_key``, ``router_sub_tensors``, ``block_sub_tensors``, ``num_experts_key``,
``PER_LAYER_KEY``).

Per-expert tensors hold one slice (or ``rows`` rows) per expert along their experts' dimension: the fused
`EXPERT_TENSORS` of transformers 5's experts modules and the router's `ROUTER_TENSORS`, or the family's own
sub-tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lightprune.models.layer import (
    MoELayer,
    RoutingTensor,
    config_value,
    set_config_value,
)
from lightprune.models.resize import EXPERT_TENSORS, ROUTER_TENSORS

__all__ = ["FamilyTensors"]


class FamilyTensors:
    """The per-expert tensors of a family's layers (experts, router, block) and the expert counts of its config."""

    expert_sub_tensors: Any
    expert_rows_key: Any
    router_sub_tensors: Any
    block_sub_tensors: Any
    num_experts_key: str
    PER_LAYER_KEY: str
    config: Any
    text_config: Any

    def rows_per_expert(self) -> int:
        """Rows each expert holds along dimension 0 of its `expert_sub_tensors` (1: one slice per expert)."""
        return int(config_value(self.text_config, self.expert_rows_key)) if self.expert_rows_key else 1

    def _expert_tensors_of(self, experts: nn.Module) -> list[tuple[nn.Module, str, int]]:
        found = []
        if self.expert_sub_tensors:
            rows = self.rows_per_expert()
            for sub, name in self.expert_sub_tensors:
                module = experts.get_submodule(sub)
                if isinstance(getattr(module, name, None), torch.Tensor):
                    found.append((module, name, rows))
            return found
        return [(experts, name, 1) for name in EXPERT_TENSORS if isinstance(getattr(experts, name, None), torch.Tensor)]

    def expert_tensors(self, layer: MoELayer) -> list[tuple[nn.Module, str, int]]:
        """(module, name, rows per expert) of every per-expert tensor of ``layer``'s experts: the fused `EXPERT_TENSORS`
        present (one slice per expert along dimension 0), or the family's `expert_sub_tensors` (``rows`` rows per
        expert, one expert after another)."""
        return self._expert_tensors_of(layer.experts)

    # ----------------------------------------------------------------- routing tensors
    def router_expert_tensors(self, layer: MoELayer) -> list[tuple[nn.Module, str, int]]:
        """(module, tensor name, the experts' dimension) of every per-expert tensor of ``layer``'s routing: the router's
        rows (`ROUTER_TENSORS` of [`MoELayer.router_linear`][]), `router_sub_tensors` and the `block_sub_tensors`
        present. What a prune slices beside the experts; `routing_tensors` lists them first."""
        linear = layer.router_linear
        found = [(linear, name, 0) for name in ROUTER_TENSORS if isinstance(getattr(linear, name, None), torch.Tensor)]
        found += [(layer.router.get_submodule(sub), name, dim) for sub, name, dim in self.router_sub_tensors]
        for sub, name, dim in self.block_sub_tensors:  # the block's own per-expert tensors, where present
            module = layer.block.get_submodule(sub)  # "" the block, a dotted path a nested module
            if isinstance(getattr(module, name, None), torch.Tensor):
                found.append((module, name, dim))
        return found

    def routing_tensors(self, layer: MoELayer) -> list[RoutingTensor]:
        """Every tensor ``layer``'s routing reads, named as in the model: `router_expert_tensors` (router rows and
        biases, correction biases, per-expert scales), then every other parameter and buffer of the router module, which
        its forward reads (the scale of Gemma 4's router norm, an adapter's weights). Calibration, weight scoring,
        masking and pruning refuse a NaN or inf in any of them
        (`lightprune.models.routing_check.check_routing_tensors`)."""
        paths = {id(module): path for path, module in layer.block.named_modules(remove_duplicate=False)}

        def named(module: nn.Module, attr: str, dim: int | None) -> RoutingTensor:
            path = ".".join(part for part in (layer.name, paths[id(module)], attr) if part)
            return RoutingTensor(path, module, attr, dim)

        found = [named(module, attr, dim) for module, attr, dim in self.router_expert_tensors(layer)]
        listed = {id(t.tensor) for t in found}
        for module in layer.router.modules():
            for attr, tensor in [*module._parameters.items(), *module._buffers.items()]:
                if isinstance(tensor, torch.Tensor) and id(tensor) not in listed:
                    listed.add(id(tensor))
                    found.append(named(module, attr, None))
        return found

    def _reads_expert_tensors(self, layer: MoELayer) -> bool:
        """True when the layer holds per-expert routing tensors besides the router's weight and bias (the family's
        router and block sub-tensors, a router ``e_score_correction_bias``)."""
        if self.router_sub_tensors or isinstance(getattr(layer.router_linear, "e_score_correction_bias", None),
                                                 torch.Tensor):
            return True
        return any(isinstance(getattr(layer.block.get_submodule(sub), name, None), torch.Tensor)
                   for sub, name, _ in self.block_sub_tensors)

    # ----------------------------------------------------------------- config updates
    def set_layer_count(self, layer: MoELayer, count: int) -> None:
        """Set the integer expert counts ``layer``'s modules hold to ``count`` after a prune or resize: every
        ``num_experts`` of the router, its weight's module, the experts and the block; with identity experts also the
        router's ``n_routed_experts`` (its rows: ``count`` + those) and the block's ``num_routed_experts``
        (LongCat-Flash's)."""
        for module in (layer.router, layer.router_linear, layer.experts, layer.block):
            if isinstance(getattr(module, "num_experts", None), int):
                module.num_experts = count
        if layer.identity_experts:
            for module, attr, value in ((layer.router, "n_routed_experts", count + layer.identity_experts),
                                        (layer.block, "num_routed_experts", count)):
                if isinstance(getattr(module, attr, None), int):
                    setattr(module, attr, value)

    def set_expert_counts(self, counts: dict[int, int]) -> None:
        """Record per-layer routed-expert counts in the config after a structural prune.

        Uniform counts set the family's own key, so plain ``from_pretrained`` reloads the model;
        non-uniform counts set the key to the largest count and record every layer's count under
        `PER_LAYER_KEY` on the top-level config.
        """
        values = set(counts.values())
        cfg = self.text_config
        if len(values) == 1:
            set_config_value(cfg, self.num_experts_key, values.pop())
            if hasattr(self.config, self.PER_LAYER_KEY):
                delattr(self.config, self.PER_LAYER_KEY)
            return
        set_config_value(cfg, self.num_experts_key, max(values))
        setattr(self.config, self.PER_LAYER_KEY, {str(k): int(v) for k, v in sorted(counts.items())})
