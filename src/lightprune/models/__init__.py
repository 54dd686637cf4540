"""Model families (layout + routing rule) behind one registry, and [`find_moe_layers`][].

The only code that knows a family's attribute names. Families register with [`register_family`][]
([`registry`][.registry]); the built-in ones are registered here. `resize` gives a model built with the largest
expert count the per-layer counts of a non-uniform prune, with torch alone (its source is the generated
``modeling_lightprune.py``), and names the per-expert tensors (``EXPERT_TENSORS``, ``ROUTER_TENSORS``) once.
May import: torch, transformers and the shared leaves; nothing else of lightprune.
"""

from __future__ import annotations

from torch import nn

from lightprune.models.base import MoEFamily, RemovalEffect
from lightprune.models.dtypes import dtype_problem
from lightprune.models.experts_kernel import runnable_experts
from lightprune.models.families import BUILT_IN, REFUSED_TYPES
from lightprune.models.layer import MoELayer, RoutingLimits, RoutingOutput
from lightprune.models.layer_shapes import describe, layer_problems, zero_experts_field
from lightprune.models.registry import (
    ADD_A_FAMILY,
    FAMILIES,
    REFUSED,
    family_table,
    get_family,
    refuse_family,
    register_family,
    supported_model_types,
    unregister_family,
)

__all__ = ["MoEFamily", "MoELayer", "RemovalEffect", "RoutingLimits", "RoutingOutput", "FAMILIES", "REFUSED",
           "get_family", "find_moe_layers", "supported_model_types", "register_family", "unregister_family",
           "refuse_family", "family_table", "ADD_A_FAMILY"]

for _family in BUILT_IN:
    register_family(_family)
for _type, _why in REFUSED_TYPES.items():
    refuse_family(_type, _why)


def find_moe_layers(model: nn.Module) -> list[MoELayer]:
    """The MoE layers of ``model`` in depth order; dense layers are skipped by the family's rule.

    Raises ``ValueError`` for an unsupported family, a model with no MoE layers, one whose layers cannot be
    pruned (`layer_problems`: no experts, top-k outside 1..experts, a zero-size expert tensor), or one in a dtype
    lightprune does not compute in (`dtype_problem`: a float8 or complex parameter, integer expert weights).
    Experts that transformers' default ``grouped_mm`` cannot run (float64, rows not a multiple of 16 bytes) are
    pointed at its ``eager`` implementation (`runnable_experts`).
    """
    family = get_family(model)
    layers = family.layers()
    if not layers:
        raise ValueError(f"{type(model).__name__} has no MoE layers{zero_experts_field(family)}: nothing to prune")
    problems = layer_problems(layers)
    if problems:
        raise ValueError(f"{type(model).__name__} cannot be pruned: {describe(problems)}; fix its config")
    odd = dtype_problem(model, [layer.experts for layer in layers])
    if odd is not None:
        raise ValueError(odd)
    runnable_experts(layer.experts for layer in layers)  # float64 experts: transformers' eager ones
    return layers
