"""Softmax top-k routing as the transformers 5 softmax families implement it.

Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE and Qwen3-VL-MoE share the rule
``p = softmax(W h)``, ``S = top-k(p)``, ``w_S = p_S`` or ``p_S / sum(p_S)`` (renormalised), and
differ only in whether they renormalise and in the dtype of the returned weights. Masking an
expert sets its logit to -inf before the softmax, which is exactly the model with its router
row removed (MAEP section 3; METHODS.md "Router facts").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightprune.models.base import RoutingOutput

__all__ = ["softmax_topk_select"]


def softmax_topk_select(router_logits: torch.Tensor, expert_mask: torch.Tensor | None, top_k: int,
                        renormalize: bool, cast_back: bool) -> RoutingOutput:
    """The softmax families' selection from logits, op for op.

    ``expert_mask`` is [E] or broadcastable to the logits (one mask per token row).
    ``cast_back``: Qwen / OLMoE cast the selected weights back to the logits' dtype; Mixtral keeps fp32.
    """
    if expert_mask is not None:
        router_logits = router_logits.masked_fill(expert_mask.to(router_logits.device), float("-inf"))
    router_probs = F.softmax(router_logits, dtype=torch.float, dim=-1)
    top_value, top_index = torch.topk(router_probs, top_k, dim=-1)
    if renormalize:
        top_value /= top_value.sum(dim=-1, keepdim=True)
    if cast_back:
        top_value = top_value.to(router_logits.dtype)
    return router_logits, top_value, top_index
