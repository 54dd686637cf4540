"""LightningModules wrapping MoE language models, and the adapters they fine-tune with."""

from .adapters import (AdapterSpec, apply_adapter, base_model_of, merged_router_weights, remove_adapters,
                       router_is_trainable)
from .causal_lm import MoECausalLM

__all__ = ["MoECausalLM", "AdapterSpec", "apply_adapter", "remove_adapters", "merged_router_weights",
           "router_is_trainable", "base_model_of"]
