"""4-bit base weights for QLoRA (Dettmers et al. 2023; router sensitivity ("Router Sensitivity Under Lightweight
Fine-Tuning Identifies Prunable Experts in Mixture-of-Experts Models", arXiv 2608.07890), section 4: Mixtral runs
hold the base in 4 bit).

Every ``nn.Linear`` of the model except the output head is replaced by a bitsandbytes ``Linear4bit``
(NF4, double quantisation off, compute in the model's dtype), frozen. transformers 5 routers are not
``nn.Linear`` and the fused 3D expert parameters are not linear layers either: both stay in the compute dtype
(bitsandbytes quantises 2D linear weights only), so the router that a router LoRA adapts is never quantised.
Quantisation happens on the weights' current device; bitsandbytes >= 0.48 runs 4-bit layers on CPU.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

__all__ = ["quantize_4bit", "is_quantized_4bit"]


def _bnb():
    from lightprune.core.extras import require

    return require("qlora", "load_in_4bit=True")


_CPU_PACK_BLOCK = 64


def quantize_4bit(model: nn.Module, compute_dtype: torch.dtype = torch.float32, quant_type: str = "nf4") -> nn.Module:
    """Replace the model's linear layers (not the output head) by frozen 4-bit layers, in place; returns ``model``."""
    bnb = _bnb()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is nn.Linear and module is not head]
    if not targets:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layer to quantise")
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        device = linear.weight.device
        q = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                              compute_dtype=compute_dtype, quant_type=quant_type, device="meta")
        q.weight = bnb.nn.Params4bit(linear.weight.data.to("cpu", torch.float32).contiguous(), requires_grad=False,
                                     quant_type=quant_type)
        if linear.bias is not None:
            q.bias = nn.Parameter(linear.bias.data.clone(), requires_grad=False)
        q = q.to(device)
        if linear.in_features % _CPU_PACK_BLOCK:
            # bitsandbytes repacks 4-bit weights for its CPU inference kernel in blocks of 64 input
            # features and fails on narrower layers ("shape [N, 0] is invalid"): keep those unpacked
            q.support_avx512bf16_for_cpu = False
        setattr(parent, child, q)
    return model


def is_quantized_4bit(model: nn.Module) -> bool:
    """True when the model holds bitsandbytes 4-bit layers (never imports bitsandbytes itself)."""
    bnb = sys.modules.get("bitsandbytes")
    if bnb is None:  # not imported: nothing can be quantised with it
        return False
    return any(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())
