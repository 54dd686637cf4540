"""The tensor operations several families' routing rules share: masking logits and selection scores, the softmax
factor of removing an expert, the distinct candidates of a row."""

from __future__ import annotations

import torch

__all__ = ["chosen_groups_mask", "mask_logits", "masked_choice", "softmax_removal_scale", "unique_rows"]


def unique_rows(ids: torch.Tensor) -> torch.Tensor:
    """Each row's distinct values (ascending), padded with the row's first value to the longest row."""
    ids = ids.sort(dim=-1).values
    repeat = torch.zeros_like(ids, dtype=torch.bool)
    repeat[:, 1:] = ids[:, 1:] == ids[:, :-1]
    width = int((~repeat).sum(dim=-1).max())
    order = torch.sort(repeat.to(torch.int8), dim=-1, stable=True).indices[:, :width]     # distinct values first
    out = ids.gather(1, order)
    return torch.where(repeat.gather(1, order), ids[:, :1], out)


def softmax_removal_scale(router_logits: torch.Tensor) -> torch.Tensor:
    """1 / (1 - p_j) [T, E] (float64): the factor every softmax probability takes when expert j is removed."""
    p = torch.softmax(router_logits.double(), dim=-1)
    return 1.0 / (1.0 - p).clamp_min(1e-300)


def mask_logits(router_logits: torch.Tensor, expert_mask: torch.Tensor | None) -> torch.Tensor:
    """Router logits with the masked experts at -inf: never selected, and out of every softmax."""
    if expert_mask is None:
        return router_logits
    return router_logits.masked_fill(expert_mask.to(router_logits.device), float("-inf"))


def masked_choice(scores: torch.Tensor, bias: torch.Tensor | None,
                   expert_mask: torch.Tensor | None) -> torch.Tensor:
    """Selection scores ``scores + bias`` (``scores`` without a bias) with the masked experts at -inf."""
    choice = scores if bias is None else scores + bias
    if expert_mask is not None:
        choice = choice.masked_fill(expert_mask.to(choice.device), float("-inf"))
    return choice


def chosen_groups_mask(group_scores: torch.Tensor, topk_group: int, num_experts: int) -> torch.Tensor:
    """[T, E] bool: the experts of each token's ``topk_group`` best groups (``group_scores`` [T, n_group]), the
    group-limited selection of DeepSeek's routers, computed as their transformers routers do."""
    num_group = group_scores.shape[-1]
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    return group_mask.unsqueeze(-1).expand(-1, num_group, num_experts // num_group).reshape(-1, num_experts).bool()
