"""LightningModules wrapping MoE language models, and the adapters they fine-tune with."""

from lightprune.finetune.adapters import (
                                          AdapterSpec,
                                          apply_adapter,
                                          merged_router_weights,
                                          remove_adapters,
                                          router_is_trainable,
)
from lightprune.finetune.causal_lm import MoECausalLM
from lightprune.models.unwrap import base_model_of

__all__ = ["MoECausalLM", "AdapterSpec", "apply_adapter", "remove_adapters", "merged_router_weights",
           "router_is_trainable", "base_model_of"]
