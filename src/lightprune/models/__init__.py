"""Model-family adapters and :func:`find_moe_layers`."""

from __future__ import annotations

from torch import nn

from .base import MoEAdapter, MoELayer, RoutingLimits, RoutingOutput
from .families import (DeepseekV3Adapter, InternVLAdapter, MixtralAdapter, OlmoeAdapter, Qwen2MoeAdapter,
                       Qwen3MoeAdapter, Qwen3VLMoeAdapter)

__all__ = ["MoEAdapter", "MoELayer", "RoutingLimits", "RoutingOutput", "ADAPTERS", "get_adapter", "find_moe_layers",
           "supported_model_types"]

ADAPTERS: dict[str, type[MoEAdapter]] = {
    t: cls
    for cls in (MixtralAdapter, Qwen2MoeAdapter, Qwen3MoeAdapter, OlmoeAdapter, DeepseekV3Adapter,
                Qwen3VLMoeAdapter, InternVLAdapter)
    for t in cls.model_types
}


def supported_model_types() -> list[str]:
    return sorted(ADAPTERS)


def get_adapter(model: nn.Module) -> MoEAdapter:
    """The adapter for ``model``'s family; an unsupported ``model_type`` is an error listing the supported ones."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in ADAPTERS:
        raise ValueError(f"unsupported model_type {model_type!r}; lightprune supports: "
                         f"{', '.join(supported_model_types())}")
    return ADAPTERS[model_type](model)


def find_moe_layers(model: nn.Module) -> list[MoELayer]:
    """The MoE layers of ``model`` in depth order; dense layers are skipped by the family's rule.

    Raises ``ValueError`` for an unsupported family or a model with no MoE layers.
    """
    layers = get_adapter(model).layers()
    if not layers:
        raise ValueError(f"{type(model).__name__} has no MoE layers: nothing to prune")
    return layers
