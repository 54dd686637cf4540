"""Load balance of every MoE layer on its own: Switch Transformer's auxiliary loss per layer (Fedus et al., 2022,
"Switch Transformers", section 2.2, eq. 4-6), averaged over the layers.

For a layer with E experts, top-k routing and router probabilities p_t = softmax(logits_t) over its unpadded
tokens t: f_e = (top-k assignments to e) / (k T) and P_e = mean_t p_t,e; the layer's loss is E sum_e f_e P_e, 1 when
both are uniform. transformers' ``aux_loss`` sums the assignments and probabilities of all layers before the product
(``load_balancing_loss_func``): balanced in the pool, one layer may starve experts that another feeds, which is what
a trained testbed showed (4-8 of 16 experts under 1% of a layer's routing). Only softmax routers (the testbeds'
Qwen3-MoE family) are supported.
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["per_layer_balance_loss", "routing_balance"]


def per_layer_balance_loss(router_logits: Sequence[torch.Tensor], top_k: int,
                           attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The mean over layers of E sum_e f_e P_e (module docstring); ``router_logits``: one [tokens, E] per MoE layer
    (tokens = the batch's rows x positions, as the model returns them), ``attention_mask`` [rows, positions]."""
    if not router_logits:
        raise ValueError("no router logits: the model has no MoE layer that returns them")
    num_tokens, device = router_logits[0].shape[0], router_logits[0].device
    keep = torch.ones(num_tokens, device=device) if attention_mask is None else \
        attention_mask.reshape(-1).to(device=device, dtype=torch.float32)
    if keep.numel() != num_tokens:
        raise ValueError(f"router logits of {num_tokens} tokens for an attention mask of {keep.numel()}")
    tokens = keep.sum().clamp_min(1)
    losses = []
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)                         # [T, E]
        chosen = torch.zeros_like(probs).scatter_(1, probs.topk(top_k, dim=-1).indices, 1.0)
        share = (chosen * keep.unsqueeze(-1)).sum(0) / (tokens * top_k)       # f_e
        mean_prob = (probs * keep.unsqueeze(-1)).sum(0) / tokens              # P_e
        losses.append(probs.shape[-1] * (share * mean_prob).sum())
    return torch.stack(losses).mean()


def routing_balance(counts: torch.Tensor) -> dict[str, float]:
    """How balanced one layer's routing is, from its assignment counts per expert [E]: ``min_share`` (the least
    routed expert's share of the assignments), ``min_share_x_experts`` (that share times E: 1 when uniform) and
    ``entropy`` (the shares' entropy over log E: 1 when uniform)."""
    counts = counts.double()
    total = counts.sum()
    if not total > 0:
        raise ValueError("no routed tokens: the balance of a layer that routed nothing is undefined")
    share = counts / total
    num = share.numel()
    nonzero = share[share > 0]
    entropy = float(-(nonzero * nonzero.log()).sum() / torch.log(torch.tensor(float(num), dtype=torch.float64)))
    return {"min_share": float(share.min()), "min_share_x_experts": float(share.min() * num), "entropy": entropy}
