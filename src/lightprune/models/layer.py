"""One MoE layer as lightprune sees it ([`MoELayer`][]), what its routing needs to keep working
([`RoutingLimits`][]), its per-expert tensor names, and the helpers that find a model's decoder layers and read a
config's (possibly dotted) fields. The families ([`lightprune.models.base`][..base]) build the layers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["MoELayer", "RoutingLimits", "RoutingOutput", "RoutingTensor", "kept_experts"]



def config_value(config: Any, key: str, default: Any = None) -> Any:
    """``config``'s field ``key``, a dotted key reading a sub-config (DBRX's ``ffn_config.moe_num_experts``);
    ``default`` where a part is missing."""
    for part in key.split("."):
        if not hasattr(config, part):
            return default
        config = getattr(config, part)
    return config


def set_config_value(config: Any, key: str, value: Any) -> None:
    """Set ``config``'s field ``key`` (dotted: on the sub-config it names)."""
    *path, last = key.split(".")
    for part in path:
        config = getattr(config, part)
    setattr(config, last, value)

RoutingOutput = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``(router_logits [T, E], weights applied to the selected experts [T, k], selected ids [T, k])``."""


@dataclass(frozen=True)
class RoutingLimits:
    """What a layer's router needs to keep working: the per-layer floor (docs/python-api.md)."""

    num_experts: int
    top_k: int
    n_group: int = 1
    topk_group: int = 1
    #: group-limited router (DeepSeek-V3): every group is scored by its top-2 sum, also when n_group == 1
    grouped: bool = False

    @property
    def is_grouped(self) -> bool:
        return self.n_group > 1 or self.grouped

    @property
    def group_size(self) -> int:
        return self.num_experts // self.n_group

    @property
    def min_per_group(self) -> int:
        """Group-limited routing scores a group by its top-2 sum and picks top_k among topk_group groups."""
        return max(2, -(-self.top_k // self.topk_group))

    @property
    def min_experts(self) -> int:
        """Fewest experts the layer may keep: top_k, or min_per_group in every group."""
        if self.is_grouped:
            return self.min_per_group * self.n_group
        return self.top_k


@dataclass(frozen=True, eq=False)
class RoutingTensor:
    """A tensor a MoE layer's routing reads (`MoEFamily.routing_tensors`): ``name`` is its name in the model
    (the state-dict name), held as ``attr`` of ``module``; ``dim`` the experts' dimension (None: not per expert)."""

    name: str
    module: nn.Module
    attr: str
    dim: int | None

    @property
    def tensor(self) -> torch.Tensor:
        return getattr(self.module, self.attr)


@dataclass(eq=False)
class MoELayer:
    """One sparse MoE block, in depth order.

    ``index`` is the decoder layer index (the key of every per-layer dict in lightprune);
    ``name`` the module path of the block. ``num_experts`` counts the routed experts now
    present (after any prune); shared experts are never counted.
    """

    index: int
    name: str
    block: nn.Module
    router: nn.Module
    experts: nn.Module
    num_experts: int
    top_k: int
    has_shared_experts: bool
    n_group: int = 1
    topk_group: int = 1
    #: the :class:`~lightprune.models.base.MoEFamily` that built it (None: a layer made by hand)
    family: Any = field(default=None, repr=False)
    #: group-limited routing (see :attr:`RoutingLimits.grouped`)
    grouped: bool = False
    #: zero-computation (identity) experts the router selects besides the routed ones (LongCat-Flash): their ids,
    #: ``num_experts .. num_selectable - 1``, and router rows follow the routed experts'; never pruned or scored
    identity_experts: int = 0

    @property
    def num_selectable(self) -> int:
        """The ids the router selects from: the routed experts, then the identity experts."""
        return self.num_experts + self.identity_experts

    def router_rows(self, kept: torch.Tensor) -> torch.Tensor:
        """The router rows a layer keeping the experts ``kept`` (ascending ids) holds: theirs, then every identity
        expert's (renumbered after the kept ones)."""
        if not self.identity_experts:
            return kept
        identity = torch.arange(self.num_experts, self.num_selectable, dtype=kept.dtype, device=kept.device)
        return torch.cat([kept, identity])

    @property
    def limits(self) -> RoutingLimits:
        return RoutingLimits(self.num_experts, self.top_k, self.n_group, self.topk_group, self.grouped)

    @property
    def min_experts(self) -> int:
        return self.limits.min_experts

    @property
    def router_linear(self) -> nn.Module:
        """The module holding the router's ``weight [E, H]``: the router itself, or its submodule
        `MoEFamily.router_weight_attr` (Gemma 4: ``router.proj``)."""
        attr = self.family.router_weight_attr if self.family is not None else ""
        return getattr(self.router, attr) if attr else self.router

    def route(self, hidden_states: torch.Tensor, expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        """The family's routing of ``hidden_states`` [T, H]; ``expert_mask`` [E] bool, True = masked out."""
        assert self.family is not None
        return self.family.route(self, hidden_states, expert_mask)


_DECODER_PATHS = ("model.language_model.layers", "model.layers", "language_model.layers",
                  "language_model.model.layers", "layers", "transformer.blocks")


def mlp_layer_type(config, index: int) -> bool | None:
    """``config.mlp_layer_types[index] == "sparse"`` where the config lists its layers' MLP types (recent families
    build their decoder layers from that list), else ``None``: the family's own rule applies."""
    types = getattr(config, "mlp_layer_types", None)
    if not isinstance(types, (list, tuple)) or index >= len(types):
        return None
    if types[index] not in ("sparse", "dense"):
        raise ValueError(f"config.mlp_layer_types[{index}] is {types[index]!r}; lightprune knows 'sparse' and 'dense'")
    return types[index] == "sparse"


def find_decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """(module path, ModuleList) of the language model's decoder layers of a transformers model (MoE or dense)."""
    for path in _DECODER_PATHS:
        module = model
        try:
            for part in path.split("."):
                module = getattr(module, part)
        except AttributeError:
            continue
        if isinstance(module, nn.ModuleList):
            return path, module
    raise ValueError(f"{type(model).__name__}: cannot find the decoder layers (looked for {list(_DECODER_PATHS)})")


def kept_experts(expert_mask: torch.Tensor) -> torch.Tensor:
    """The ids an [E] mask (True = removed) keeps, ascending: the order in which the pruned layer holds them."""
    return (~expert_mask).nonzero().squeeze(-1)


def kept_entries(tensor: torch.Tensor, kept: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The entries ``kept`` of a per-expert tensor along ``dim``: what the pruned layer holds of it."""
    return tensor.index_select(dim, kept.to(tensor.device))
