"""LightningModules wrapping MoE language models."""

from .causal_lm import MoECausalLM

__all__ = ["MoECausalLM"]
