"""DeepSeek-V3's routing rule, written once (DeepSeek-V3 technical report, arXiv 2412.19437, section 2.1.2: sigmoid
affinities, the auxiliary-loss-free balancing bias that only steers the selection, node-limited routing; transformers'
DeepseekV3TopkRouter and every router that is the same computation). For a token with fp32 router logits l [E]::

    s = sigmoid(l)                                           scores: the weights come from these
    c = s + b                                                selection scores, b = e_score_correction_bias
    g_G = c_(1) + c_(2) of group G                           group score: the sum of its two highest c
    C = top-topk_group(g)                                    the chosen groups   (torch.topk, sorted=False)
    S = top-k(c), c at -inf outside the groups of C          the selected experts (torch.topk, sorted=False)
    w = s_S / (sum(s_S) + 1e-20) if norm_topk_prob else s_S, times routed_scaling_factor

The families compute it from three starting points, each through the steps below (`selection_scores`,
`group_scores`, `choose_groups`, `mask_unchosen_groups`, `top_experts`, `routed_weights`):

- `select_from_scores`: all E scores, with masked experts (``DeepseekV3Family.select``; the router's ops, the
  group-limited top-k of `group_limited_top_k` that every group-limited family computes);
- `select_from_group_top`: each group's sorted top list (`GroupTop`, kept for the removal effect), the
  group scores read off it (the router's forward while calibration observes it);
- `select_without_one`: one removed expert per row, from each group's top list without it
  (``DeepseekV3Family.select_without``).

``router`` is the transformers router module: ``num_group``, ``topk_group``, ``top_k``, ``norm_topk_prob``,
``routed_scaling_factor``, ``e_score_correction_bias``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from lightprune.models.routing_ops import fill_unchosen_groups, group_limited_top_k, renormalized
from lightprune.models.sorted_top import sorted_topk

__all__ = ["RENORM_EPS", "GroupTop", "list_width", "selection_scores", "group_scores", "choose_groups",
           "mask_unchosen_groups", "top_experts", "routed_weights", "group_top", "select_from_scores",
           "select_from_group_top", "select_without_one"]

#: the epsilon of the renormalisation's denominator
RENORM_EPS = 1e-20


class GroupTop(NamedTuple):
    """Each group's highest selection scores c = s + bias, sorted descending ([T, G, w]), and their expert ids; as the
    router computed them, also the scores s [T, E] and the chosen groups [T, topk_group] (None: not kept)."""

    values: torch.Tensor
    ids: torch.Tensor
    scores: torch.Tensor | None = None
    chosen: torch.Tensor | None = None


# ---------------------------------------------------------------------------------------------------- the steps
def list_width(group_size: int, k: int) -> int:
    """How many of each group's best selection scores a top list keeps: k + 1 (a group gives at most k experts to the
    top k, so its best unselected one is listed), at least 3 (the top-2 sum without one of them), at most the group."""
    return min(group_size, max(k + 1, 3))


def selection_scores(scores: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """c = s + b: the scores the selection ranks (the bias steers the selection only, never the weights)."""
    return scores + bias


def group_scores(top_values: torch.Tensor) -> torch.Tensor:
    """g [T, G]: each group's two highest selection scores summed, from its sorted top values [T, G, >= 2]."""
    return top_values[..., :2].sum(dim=-1)


def choose_groups(group_scores: torch.Tensor, topk_group: int) -> torch.Tensor:
    """C [T, topk_group]: the ids of each token's best groups, taken as the router takes them (unsorted)."""
    return torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]


def mask_unchosen_groups(choice: torch.Tensor, chosen: torch.Tensor, num_group: int, finite: bool) -> torch.Tensor:
    """The selection scores [T, E] with every expert outside the chosen groups at -inf.

    ``finite=False``: the router's ``masked_fill`` (any values, NaN included). ``finite=True``: for finite ``choice``
    only, by adding a [T, G, 1] tensor of 0 and -inf, the same tensor as the ``masked_fill`` there (x + 0 = x, x - inf
    = -inf) and several times faster on a CPU."""
    if not finite:
        return fill_unchosen_groups(choice, chosen, num_group, float("-inf"))
    num_experts = choice.shape[-1]
    outside = torch.full(chosen.shape[:1] + (num_group,), float("-inf"), dtype=choice.dtype, device=choice.device)
    outside.scatter_(1, chosen, 0.0)
    return (choice.view(-1, num_group, num_experts // num_group) + outside.unsqueeze(-1)).view(-1, num_experts)


def top_experts(choice: torch.Tensor, k: int) -> torch.Tensor:
    """S: the positions of the k best selection scores of each row, taken as the router takes them (unsorted)."""
    return torch.topk(choice, k=k, dim=-1, sorted=False)[1]


def routed_weights(router: Any, selected_scores: torch.Tensor) -> torch.Tensor:
    """w from the selected experts' scores s_S [..., k]: renormalised (+ `RENORM_EPS`) when the router's
    ``norm_topk_prob``, times its ``routed_scaling_factor``."""
    if router.norm_topk_prob:
        selected_scores = renormalized(selected_scores, RENORM_EPS)
    return selected_scores * router.routed_scaling_factor


def group_top(choice: torch.Tensor, num_group: int, k: int) -> GroupTop:
    """Each group's `list_width` best selection scores c [T, E], sorted descending (ties in ascending expert id,
    `sorted_topk`), with their expert ids."""
    size = choice.shape[-1] // num_group
    values, ids = sorted_topk(choice.view(-1, num_group, size), list_width(size, k))
    return GroupTop(values, ids + torch.arange(num_group, device=choice.device).view(1, -1, 1) * size)


# ---------------------------------------------------------------------------------------------- the three starts
def select_from_scores(router: Any, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                       bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rule from all E scores, op for op the router's forward: ``(logits, weights [T, k], ids [T, k])``.

    A masked expert (``expert_mask`` [E] or per row, True = removed) has logit -inf (score 0) and selection score -inf
    (the bias alone could otherwise still select it): it takes no part in group scores or selection, exactly the model
    without it. ``bias``: the correction bias to use (None: the router's), for logits of a pruned layout (the kept
    experts' columns with their bias entries, the router's group count)."""
    bias = router.e_score_correction_bias if bias is None else bias
    if expert_mask is not None:
        expert_mask = expert_mask.to(router_logits.device)
        router_logits = router_logits.masked_fill(expert_mask, float("-inf"))
        bias = bias.masked_fill(expert_mask, float("-inf"))
    scores = router_logits.sigmoid()
    choice = selection_scores(scores, bias)
    selected = group_limited_top_k(choice, router.num_group, router.topk_group, router.top_k)
    return router_logits, routed_weights(router, scores.gather(1, selected)), selected


def select_from_group_top(router: Any, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, GroupTop]:
    """The rule with the group scores read off each group's sorted top list: ``(weights, ids, GroupTop)``, the
    `GroupTop` with the scores and the chosen groups. Bit for bit `select_from_scores` without a mask for
    logits without NaN (the unchosen groups are masked by adding -inf: the selection scores are finite)."""
    num_group = router.num_group
    scores = router_logits.sigmoid()
    choice = selection_scores(scores, router.e_score_correction_bias)
    top = group_top(choice, num_group, router.top_k)
    chosen = choose_groups(group_scores(top.values), router.topk_group)
    selected = top_experts(mask_unchosen_groups(choice, chosen, num_group, finite=True), router.top_k)
    return routed_weights(router, scores.gather(1, selected)), selected, top._replace(scores=scores, chosen=chosen)


def select_without_one(router: Any, router_logits: torch.Tensor, tokens: torch.Tensor,
                       experts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rule for token ``tokens[i]`` (rows of ``router_logits`` [T, E]) with expert ``experts[i]`` removed, from each
    group's `list_width` best selection scores instead of all E: ``(weights [n, k], ids [n, k], short [n])``.

    The removed expert's group score becomes the top-2 sum of what is left of its list (the lists are sorted), the
    chosen groups are taken from the group scores as the router takes them, the top k over the chosen groups' lists
    (no group gives more than k). ``short``: the rows whose chosen groups hold fewer than k experts, where the router
    fills up from the rest: their weights and ids are not the rule's (the caller re-runs them on all E)."""
    num_group, num_experts = router.num_group, router_logits.shape[-1]
    size, k = num_experts // num_group, router.top_k
    width = list_width(size, k)
    rows = router_logits[tokens] if tokens.numel() < router_logits.shape[0] else router_logits
    choice = selection_scores(rows.sigmoid(), router.e_score_correction_bias)
    top = choice.view(-1, num_group, size).topk(width, dim=-1)
    values, ids = (top.values, top.indices) if rows is not router_logits else \
        (top.values[tokens], top.indices[tokens])                                              # [n, G, w]
    ids = ids + torch.arange(num_group, device=choice.device).view(1, -1, 1) * size
    hit = ids == experts.view(-1, 1, 1)
    # the group scores with the expert removed: the top-2 sum of what is left of its group (the values are sorted)
    low = torch.full_like(values[..., 0], float("-inf"))
    second = values[..., 1] if width >= 2 else low
    third = values[..., 2] if width >= 3 else low
    removed_second = hit[..., 1] if width >= 2 else torch.zeros_like(hit[..., 0])
    groups = torch.where(hit[..., 0], second + third,
                         torch.where(removed_second, values[..., 0] + third, values[..., 0] + second))
    values = values.masked_fill(hit, float("-inf"))
    pick = choose_groups(groups, router.topk_group).unsqueeze(-1).expand(-1, -1, width)       # [n, topk_group, w]
    pool_values, pool_ids = values.gather(1, pick).flatten(1), ids.gather(1, pick).flatten(1)
    selected = pool_ids.gather(1, top_experts(pool_values, k))
    weights = routed_weights(router, router_logits.reshape(-1)[tokens.unsqueeze(-1) * num_experts + selected].sigmoid())
    return weights, selected, torch.isfinite(pool_values).sum(dim=-1) < k
