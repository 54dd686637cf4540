"""The tensor operations several families' routing rules share: renormalising the selected weights, masking logits,
selection scores and unchosen groups, group-limited top-k, the softmax factor of removing an expert, the distinct
candidates of a row.

Renormalisation (every renormalising router here, with its own epsilon or none)::

    w_i <- w_i / (sum_{s in S} w_s + eps)        over the k selected experts S of a token

Group-limited top-k (DeepSeek-V3 technical report, arXiv 2412.19437, section 2.1.2, node-limited routing), for a
token's selection scores c [E] in G equal groups (DeepSeek-V2's device-limited routing, arXiv 2405.04434, scores a
group by its highest c instead: ``deepseek_v2_family``)::

    g_G = sum of the two highest c of group G
    C = top-topk_group(g)                                    the chosen groups
    S = top-k(c), c at ``fill`` outside the groups of C      ``fill``: -inf, or 0 (A.X K2, Mistral 4)
"""

from __future__ import annotations

import torch

from lightprune.models.base import RemovalEffect

__all__ = ["chosen_group_leaders", "chosen_groups", "fill_unchosen_groups", "group_limited_top_k", "mask_logits",
           "masked_choice", "one_minus", "renormalized", "sigmoid_biased_topk", "softmax_removal_growth",
           "softmax_topk_removal", "unique_rows"]


def renormalized(weights: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """``weights / (weights.sum(dim=-1, keepdim=True) + eps)``: the selected weights [..., k] divided by their sum,
    out of place, in their dtype, the ops and their order those of the routers' ``w /= w.sum(...) (+ eps)``.

    ``eps``: the router's epsilon (DeepSeek-V3, Hunyuan 3, AFMoE: 1e-20; LFM2-MoE: 1e-6); None adds nothing (not
    ``+ 0.0``, which would turn a -0.0 sum into +0.0)."""
    total = weights.sum(dim=-1, keepdim=True)
    return weights / (total if eps is None else total + eps)


def unique_rows(ids: torch.Tensor) -> torch.Tensor:
    """Each row's distinct values (ascending), padded with the row's first value to the longest row."""
    ids = ids.sort(dim=-1).values
    repeat = torch.zeros_like(ids, dtype=torch.bool)
    repeat[:, 1:] = ids[:, 1:] == ids[:, :-1]
    width = int((~repeat).sum(dim=-1).max())
    order = torch.sort(repeat.to(torch.int8), dim=-1, stable=True).indices[:, :width]     # distinct values first
    out = ids.gather(1, order)
    return torch.where(repeat.gather(1, order), ids[:, :1], out)


def softmax_removal_growth(router_logits: torch.Tensor) -> torch.Tensor:
    """p_j / (1 - p_j) [T, E]: every other softmax probability is multiplied by 1 + this when expert j is removed.

    Computed in the logits' dtype (at least float32) without cancellation: the excess over 1 rather than the
    factor, and 1 - p_j of each row's most probable expert as the sum of the other probabilities."""
    p = torch.softmax(router_logits.to(torch.promote_types(router_logits.dtype, torch.float32)), dim=-1)
    return p / one_minus(p)


def one_minus(p: torch.Tensor) -> torch.Tensor:
    """1 - p [T, E] of a distribution's rows, with the row's largest entry's as the sum of the others (exact where
    1 - p_max rounds to 0), floored at the dtype's smallest normal number."""
    rest = 1.0 - p
    top = p.argmax(dim=-1, keepdim=True)
    others = p.scatter(-1, top, 0.0).sum(dim=-1, keepdim=True)
    return rest.scatter(-1, top, others).clamp_min(torch.finfo(p.dtype).tiny)


def softmax_topk_removal(router_logits: torch.Tensor, selected: torch.Tensor, renormalize: bool) -> RemovalEffect:
    """Removals under ``w = top-k(softmax(logits))`` (divided by their sum when ``renormalize``), in closed form.

    With p the softmax over all experts and n the (k+1)-th most probable expert: removing a selected expert j
    leaves the other k - 1 and promotes n (the softmax over the rest is p_i / (1 - p_j), the same order); the
    others' weights become p_s / (1 - p_j) (factor growth p_j / (1 - p_j), n's weight p_n / (1 - p_j)), or
    renormalised p_s / (P - p_j + p_n) with P the selected mass (factor (p_j - p_n) / (P - p_j + p_n), n's weight
    p_n / (P - p_j + p_n)). Removing an unselected expert keeps the selection: growth p_j / (1 - p_j), or nothing
    under renormalisation. Nothing is re-run. Exact up to ties between the k-th and (k+1)-th probability.
    """
    k = selected.shape[1]
    if k >= router_logits.shape[-1]:  # nothing to promote: the selection is re-run (exact)
        return RemovalEffect(rerun=selected, growth=None if renormalize else softmax_removal_growth(router_logits))
    p = torch.softmax(router_logits.to(torch.promote_types(router_logits.dtype, torch.float32)), dim=-1)
    top = torch.topk(p, k + 1, dim=-1)
    p_sel, p_next = p.gather(1, selected), top.values[:, k:]
    promoted = top.indices[:, k]
    if renormalize:
        denom = p_sel.sum(dim=-1, keepdim=True) - p_sel + p_next
        factor, weight, growth = (p_sel - p_next) / denom, p_next / denom, None
    else:
        rest = one_minus(p)
        growth = p / rest
        factor, weight = growth.gather(1, selected), p_next / rest.gather(1, selected)
    return RemovalEffect(rerun=selected[:, :0], growth=growth, swap_factor=factor, swap_expert=promoted,
                         swap_weight=weight)


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


def sigmoid_biased_topk(router_logits: torch.Tensor, bias: torch.Tensor, expert_mask: torch.Tensor | None,
                        top_k: int, eps: float, scale) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(masked logits, weights [T, k], ids [T, k]) of the biased sigmoid router several families share (Hunyuan 3,
    Inkling 2, Muse Spark, Ergo): s = sigmoid(l), ids = top-k (unsorted) of s + bias, w = s_ids / (sum + eps) * scale,
    the masked experts at -inf in the logits and the choice; op for op as their routers compute it."""
    router_logits = mask_logits(router_logits, expert_mask)
    scores = torch.sigmoid(router_logits)
    top_index = torch.topk(masked_choice(scores, bias, expert_mask), top_k, dim=-1, sorted=False)[1]
    return router_logits, renormalized(scores.gather(1, top_index), eps) * scale, top_index


def fill_unchosen_groups(values: torch.Tensor, chosen: torch.Tensor, num_group: int, fill: float) -> torch.Tensor:
    """``values`` [T, E] (contiguous) with every expert outside each token's ``chosen`` groups ([T, g] group ids) at
    ``fill``: the group-limited routers' ``masked_fill`` (DeepSeek-V2: 0.0, DeepSeek-V3: -inf), any values (NaN
    included) as theirs. The [T, n_group] mask broadcasts over each group's experts instead of being expanded to
    [T, E] first (the same elements filled, the same tensor)."""
    num_tokens, num_experts = values.shape
    outside = torch.ones(num_tokens, num_group, dtype=torch.bool, device=values.device).scatter_(1, chosen, False)
    return values.view(num_tokens, num_group, num_experts // num_group).masked_fill(outside.unsqueeze(-1), fill) \
        .view(num_tokens, num_experts)


def chosen_group_leaders(choice: torch.Tensor, num_group: int, topk_group: int, selected: torch.Tensor, *,
                         sorted: bool = True) -> torch.Tensor:
    """The experts to re-run for a router that keeps the ``topk_group`` groups with the largest top-2 sums of
    ``choice`` [T, E]: the ``selected`` ones and each chosen group's top 2 (an unselected expert's removal changes the
    routing only by lowering its group's top-2 sum, and only a chosen group's fall can change the chosen groups).
    ``sorted``: the router's own ``torch.topk`` over the group scores (ties are resolved as it resolves them)."""
    size = choice.shape[-1] // num_group
    best = choice.view(-1, num_group, size).topk(2, dim=-1)
    chosen = best[0].sum(dim=-1).topk(topk_group, dim=-1, sorted=sorted)[1]                 # [T, g]
    leaders = best[1].gather(1, chosen.unsqueeze(-1).expand(-1, -1, 2)) + (chosen * size).unsqueeze(-1)
    return unique_rows(torch.cat([selected, leaders.flatten(1)], dim=1))


def chosen_groups(choice: torch.Tensor, num_group: int, topk_group: int, *, sorted: bool = False) -> torch.Tensor:
    """C [T, topk_group]: the ids of each token's groups with the largest sums of their two highest ``choice``
    [T, E], by the router's ``torch.topk`` (``sorted`` as it takes it: the ties are resolved as it resolves
    them)."""
    scores = choice.view(-1, num_group, choice.shape[-1] // num_group).topk(2, dim=-1)[0].sum(dim=-1)
    return torch.topk(scores, k=topk_group, dim=-1, sorted=sorted)[1]


def group_limited_top_k(choice: torch.Tensor, num_group: int, topk_group: int, top_k: int, *,
                        fill: float = float("-inf"), sorted: bool = False,
                        expert_mask: torch.Tensor | None = None) -> torch.Tensor:
    """S [T, top_k]: the ids of the ``top_k`` best ``choice`` [T, E] in each token's `chosen_groups` (top-2
    sums), every expert outside them at ``fill`` (`fill_unchosen_groups`), op for op the group-limited
    routers' forward (both ``torch.topk`` ``sorted`` as the router takes them). ``expert_mask`` (True = removed):
    put back at -inf after a finite ``fill`` (an expert of an unchosen group at 0 still outranks a chosen one
    below 0; a removed one never does): a caller whose ``choice`` holds the removed experts at -inf and whose
    ``fill`` is -inf has nothing to put back and passes none."""
    choice = fill_unchosen_groups(choice, chosen_groups(choice, num_group, topk_group, sorted=sorted), num_group, fill)
    if expert_mask is not None:
        choice = choice.masked_fill(expert_mask.to(choice.device), float("-inf"))
    return torch.topk(choice, k=top_k, dim=-1, sorted=sorted)[1]
