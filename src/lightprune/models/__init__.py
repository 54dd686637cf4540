"""Model families (layout + routing rule) behind one registry, and :func:`find_moe_layers`.

The only code that knows a family's attribute names. May import: torch, transformers and :mod:`lightprune.errors`;
nothing else of lightprune.
"""

from __future__ import annotations

from torch import nn

from lightprune._compat import warn_once
from lightprune.models.base import MoEFamily, MoELayer, RoutingLimits, RoutingOutput
from lightprune.models.families import (
    DeepseekV3Family,
    InternVLFamily,
    MixtralFamily,
    OlmoeFamily,
    Qwen2MoeFamily,
    Qwen3MoeFamily,
    Qwen3VLMoeFamily,
)

__all__ = ["MoEFamily", "MoELayer", "RoutingLimits", "RoutingOutput", "FAMILIES", "get_family", "find_moe_layers",
           "supported_model_types"]

FAMILIES: dict[str, type[MoEFamily]] = {
    t: cls
    for cls in (MixtralFamily, Qwen2MoeFamily, Qwen3MoeFamily, OlmoeFamily, DeepseekV3Family,
                Qwen3VLMoeFamily, InternVLFamily)
    for t in cls.model_types
}


def supported_model_types() -> list[str]:
    return sorted(FAMILIES)


def get_family(model: nn.Module) -> MoEFamily:
    """The family of ``model``; an unsupported ``model_type`` is an error listing the supported ones."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported model_type {model_type!r}; lightprune supports: "
                         f"{', '.join(supported_model_types())}")
    return FAMILIES[model_type](model)


def find_moe_layers(model: nn.Module) -> list[MoELayer]:
    """The MoE layers of ``model`` in depth order; dense layers are skipped by the family's rule.

    Raises ``ValueError`` for an unsupported family or a model with no MoE layers.
    """
    layers = get_family(model).layers()
    if not layers:
        raise ValueError(f"{type(model).__name__} has no MoE layers: nothing to prune")
    return layers


#: 0.1 names of the family registry (``adapter`` now means a fine-tuning adapter only); they warn once
_DEPRECATED = {"get_adapter": "get_family", "MoEAdapter": "MoEFamily", "ADAPTERS": "FAMILIES"}


def __getattr__(name: str):
    if name in _DEPRECATED:
        warn_once(f"lightprune.models.{name}", f"lightprune.models.{_DEPRECATED[name]}")
        return globals()[_DEPRECATED[name]]
    raise AttributeError(f"module 'lightprune.models' has no attribute {name!r}")
