"""DeepSeek's routers and the families that compute them: DeepSeek-V3 (sigmoid scores, a correction bias for
selection, group-limited top-k, scaling; the rule itself in :mod:`.deepseek_v3_routing`) with the models whose
transformers router is the same computation (rows of :func:`~lightprune.models.family_rows.family_row`), and DeepSeek-V2
(softmax, greedy or group-limited greedy)."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from lightprune.models.base import MoEFamily, RemovalEffect, SelectsWithExpertTensor
from lightprune.models.deepseek_v3_routing import (
    RENORM_EPS,
    GroupTop,
    choose_groups,
    group_scores,
    group_top,
    routed_weights,
    select_from_group_top,
    select_from_scores,
    select_without_one,
    selection_scores,
)
from lightprune.models.family_rows import family_row
from lightprune.models.layer import MoELayer, RoutingOutput, kept_entries, mlp_layer_type
from lightprune.models.routing_ops import (
    chosen_group_leaders,
    fill_unchosen_groups,
    renormalized,
    softmax_removal_growth,
    unique_rows,
)
from lightprune.models.sorted_top import sorted_topk

__all__ = ["GroupTop", "DeepseekV3Family", "Glm4MoeFamily", "SarvamMoeFamily", "Param2MoeFamily", "SarvamMlaFamily",
           "Glm4vMoeFamily", "KimiK25Family",
           "NemotronHFamily", "Dots1Family", "DeepseekV2Family", "DEEPSEEK_ALIKE", "Dots3NoteTextFamily",
           "MiniCPM5MoeFamily", "BeamFamily",
           "AXK2Family"]


class DeepseekV3Family(MoEFamily):
    """DeepSeek-V3: sigmoid scores, correction bias for selection only, group-limited top-k,
    optional renormalisation, then ``routed_scaling_factor``.

    Masking sets the expert's logit to -inf (score 0) and its selection score to -inf (the
    correction bias alone could otherwise still select it), so a masked expert takes no part in
    group scores or selection: exactly the model with that expert removed.
    """

    routing = "sigmoid + correction bias, group-limited top-k, scaled"
    model_types = ("deepseek_v3",)
    num_experts_key = "n_routed_experts"
    shared_attrs = ("shared_experts",)
    group_limited = True

    def is_sparse_layer(self, index: int) -> bool:
        cfg = self.text_config
        listed = mlp_layer_type(cfg, index)
        if listed is not None:
            return listed
        return index >= int(getattr(cfg, "first_k_dense_replace", 0) or 0)

    def group_limits(self) -> tuple[int, int]:
        cfg = self.text_config
        return int(cfg.n_group or 1), int(cfg.topk_group or 1)

    score_function = "sigmoid"

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        hidden_states = hidden_states.view(-1, router.weight.shape[1])
        return F.linear(hidden_states.type(torch.float32), router.weight.type(torch.float32))

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        """The rule from all E scores (:func:`~lightprune.models.deepseek_v3_routing.select_from_scores`)."""
        return select_from_scores(layer.router, router_logits, expert_mask)

    def select_kept(self, layer: MoELayer, kept_logits: torch.Tensor, kept: torch.Tensor) -> RoutingOutput:
        """The rule on the kept experts' logits and correction bias entries, in the pruned layer's groups (the same
        group count, each group its kept experts)."""
        router = layer.router
        return select_from_scores(router, kept_logits, None, kept_entries(router.e_score_correction_bias, kept))

    def select_without(self, layer: MoELayer, router_logits: torch.Tensor, tokens: torch.Tensor,
                       experts: torch.Tensor) -> RoutingOutput:
        """:meth:`select` with one expert removed per (token, expert) row, from each group's top k + 1 (at least 3)
        selection scores c instead of all E (:func:`~lightprune.models.deepseek_v3_routing.select_without_one`); the
        rows whose chosen groups hold fewer than k experts (the router fills up from the rest) by :meth:`select` on a
        mask. The logits returned are the rows of ``router_logits``, unmasked."""
        top_weights, top_index, short = select_without_one(layer.router, router_logits, tokens, experts)
        if bool(short.any()):
            _, weights, index = super().select_without(layer, router_logits, tokens[short], experts[short])
            top_weights[short], top_index[short] = weights.to(top_weights.dtype), index
        return router_logits[tokens], top_weights, top_index

    def observed_router(self, layer: MoELayer, keep: Callable[[Any], None]) -> Callable[..., Any] | None:
        """The router's forward computed as :meth:`removal_effect` needs it: the group scores from each group's sorted
        top k + 1 (:class:`GroupTop`, kept with the scores and the chosen groups), the other groups' selection scores
        at -inf by adding -inf (:func:`~lightprune.models.deepseek_v3_routing.select_from_group_top`). Bit for bit the
        router's output; a batch with NaN logits runs the router's own forward. None for a router that does not
        compute what DeepSeek-V3's does (its forward already replaced, say by a device hook)."""
        router = layer.router
        if "forward" in vars(router) or not hasattr(router, "e_score_correction_bias"):
            return None
        original = type(router).forward

        def forward(hidden_states: torch.Tensor):
            logits = self.router_logits(layer, hidden_states)
            if bool(torch.isnan(logits).any()):
                return original(router, hidden_states)
            weights, selected, top = select_from_group_top(router, logits)
            keep(top)
            return logits, weights, selected

        return forward

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor, selected: torch.Tensor,
                       routing_state: Any = None) -> RemovalEffect:
        """Sigmoid scores are per expert, so a removal changes the routing only through the selection, and the chosen
        groups only through a group's score, the sum of its top-2 selection scores c. Removing expert j:

        - j among the top 2 of a chosen group g whose score without j (the top-3 sum less c_j; -inf without a third
          expert) is below the best unchosen group r's score: g leaves the chosen groups and r enters, whichever of
          the two leaves (the other is the slot's ``rerun_alias``), and the new selection is the top k of the other
          chosen groups' and r's lists, computed here for every (token, chosen group) at once; equal to r's score
          (a tie the router breaks), or no closed form (the groups hold fewer than k experts): re-run
          (:meth:`select_without`);
        - else, j selected: the k - 1 others stay and the best unselected expert n of the chosen groups enters (when
          the chosen groups hold no unselected expert, the selection is re-run);
          weights are scores s (sigmoid, no bias) times the scaling factor, renormalised over the selected ones when
          ``norm_topk_prob``: then the others' factor is (s_j - s_n) / (S - s_j + s_n), S the selected score sum;
        - else nothing changes.

        ``routing_state``: the :class:`GroupTop` of these logits that :meth:`observed_router` kept (else computed).
        """
        router = layer.router
        num_group, num_experts = router.num_group, router_logits.shape[-1]
        k, picked = selected.shape[1], router.topk_group
        num_tokens, device = router_logits.shape[0], router_logits.device
        # each group's top k + 1 (at least 3) selection scores, sorted: a group holds at most k selected experts, so
        # its best unselected one is in its list
        top = routing_state if isinstance(routing_state, GroupTop) else None
        scores = top.scores if top is not None and top.scores is not None else router_logits.sigmoid()
        if top is None:
            top = group_top(selection_scores(scores, router.e_score_correction_bias), num_group, k)
        top_values, top_ids = top.values, top.ids                                            # [T, G, w]
        width = top_values.shape[-1]
        scored = group_scores(top_values)                                                    # [T, G]
        chosen_idx = top.chosen if top.chosen is not None else choose_groups(scored, picked)  # [T, Gc]
        gather = lambda t: t.gather(1, chosen_idx.unsqueeze(-1).expand(-1, -1, t.shape[-1]))  # noqa: E731
        values, ids = gather(top_values), gather(top_ids)                                   # [T, Gc, w]
        rerun = selected[:, :0]
        alias = new_weights = new_selected = None
        if num_group > picked:
            chosen = torch.zeros_like(scored, dtype=torch.bool).scatter_(1, chosen_idx, True)
            rival_score, rival = scored.masked_fill(chosen, float("-inf")).max(dim=-1)
            third = values[..., 2] if width >= 3 else torch.full_like(values[..., 0], float("-inf"))
            without = torch.stack([values[..., 1] + third, values[..., 0] + third], dim=-1)  # [T, Gc, 2]: less each
            falls = without <= rival_score.view(-1, 1, 1)
            # a group gives at most k experts to a top k: the pools of the new groups hold each one's first k
            pool_width = min(width, k)
            # a strict fall of the top-1 removal has the closed form (the top-2 removal's score is not lower)
            closed = (without[..., 0] < rival_score.view(-1, 1)) & (picked * pool_width >= k)  # [T, Gc]
            both = closed & (without[..., 1] < rival_score.view(-1, 1))
            pair_ids = torch.where(falls, ids[..., :2], -1)
            pair_ids[..., 1] = torch.where(both, -1, pair_ids[..., 1])
            alias = torch.stack([torch.where(both, ids[..., 1], -1), torch.full_like(both, -1, dtype=ids.dtype)],
                                dim=-1).flatten(1)
            rerun = pair_ids.flatten(1)                                                      # [T, 2 Gc]
            # for each (token, chosen group c) of the closed form, the new groups: the chosen ones with c replaced by
            # the rival; the new selection: the top k of their lists
            new_selected = torch.zeros(num_tokens, picked, 2, k, dtype=selected.dtype, device=device)
            new_weights = torch.zeros(num_tokens, picked, 2, k, dtype=scores.dtype, device=device)
            tokens, slot = closed.nonzero(as_tuple=True)
            if tokens.numel():
                groups = chosen_idx.index_select(0, tokens).scatter(1, slot.unsqueeze(-1),
                                                                    rival.index_select(0, tokens).unsqueeze(-1))
                # rows (token, group) of the [T G, w] lists, by index_select (faster than indexing on a CPU)
                at = (tokens.unsqueeze(-1) * num_group + groups).view(-1)
                pool = lambda t: t.flatten(0, 1).index_select(0, at)[:, :pool_width].reshape(len(tokens), -1)  # noqa
                pool_values, pool_ids = pool(top_values), pool(top_ids)                                # [n, Gc w']
                swapped = pool_ids.gather(1, sorted_topk(pool_values, k)[1])                         # [n, k]
                into = tokens * (picked * 2) + slot * 2                     # row (token, slot, 0) of [T, Gc, 2, k]
                new_selected.view(-1, k).index_copy_(0, into, swapped)
                new_weights.view(-1, k).index_copy_(0, into, routed_weights(
                    router, scores.view(-1).index_select(0, (tokens.unsqueeze(-1) * num_experts + swapped).view(-1))
                    .view(-1, k)))
            new_selected, new_weights = new_selected.flatten(1, 2), new_weights.flatten(1, 2)
            generic = (rerun >= 0) & ~torch.stack([closed, torch.zeros_like(closed)], dim=-1).flatten(1)
        # the expert a swap promotes: the best unselected one of the chosen groups' lists
        is_selected = torch.zeros(num_tokens, num_experts, dtype=torch.bool, device=device).scatter_(1, selected, True)
        listed = ids.flatten(1)
        best, at = values.flatten(1).masked_fill(is_selected.gather(1, listed), float("-inf")).max(dim=-1,
                                                                                                 keepdim=True)
        promoted = listed.gather(1, at)
        none_left = torch.isneginf(best)  # the chosen groups hold only selected experts: no swap, re-run them
        if bool(none_left.any()):
            extra = torch.where(none_left, selected, -1)
            rerun = torch.cat([rerun, extra], dim=1)
            if new_selected is not None:
                alias = torch.cat([alias, torch.full_like(extra, -1)], dim=1)
                new_selected = torch.cat([new_selected, selected.new_zeros(num_tokens, k, k)], dim=1)
                new_weights = torch.cat([new_weights, new_weights.new_zeros(num_tokens, k, k)], dim=1)
                generic = torch.cat([generic, extra >= 0], dim=1)
        if new_selected is not None:
            rows, slots = generic.nonzero(as_tuple=True)
            if rows.numel():
                _, weights, index = self.select_without(layer, router_logits, rows, rerun[rows, slots])
                new_weights[rows, slots], new_selected[rows, slots] = weights.to(new_weights.dtype), index
        s_sel, s_next = scores.gather(1, selected), scores.gather(1, promoted)
        scale = router.routed_scaling_factor
        if router.norm_topk_prob:
            denom = s_sel.sum(dim=-1, keepdim=True) - s_sel + s_next + RENORM_EPS
            factor, weight = (s_sel - s_next) / denom, s_next / denom * scale
        else:
            factor, weight = torch.zeros_like(s_sel), (s_next * scale).expand(-1, k)
        return RemovalEffect(rerun=rerun, swap_factor=factor, swap_expert=promoted.squeeze(-1), swap_weight=weight,
                             rerun_weights=new_weights, rerun_selected=new_selected, rerun_alias=alias)


class NemotronHFamily(DeepseekV3Family):
    """Nemotron-H / Nemotron 3 (``nemotron_h``): DeepSeek-V3's router (NemotronHTopkRouter is the same computation)
    in the layers whose ``layers_block_type`` is "moe" (the others are Mamba-2, attention or MLP mixers); ungated
    relu^2 experts (``up_proj``, ``down_proj``), fed a latent projection of the router's input when
    ``moe_latent_size`` is set."""

    model_types = ("nemotron_h",)
    mlp_attr = "mixer"

    def is_sparse_layer(self, index: int) -> bool:
        return self.text_config.layers_block_type[index] == "moe"


class MiniCPM5MoeFamily(DeepseekV3Family):
    """MiniCPM 5 MoE (``minicpm5_moe``): DeepSeek-V3's router (MiniCPM5MoeTopkRouter is its computation) with the fp32
    logits computed outside any autocast, as that router forces them; the dense-layer rule of ``mlp_layer_types``."""

    model_types = ("minicpm5_moe",)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            return super().router_logits(layer, hidden_states)


class BeamFamily(SelectsWithExpertTensor, DeepseekV3Family):
    """Beam (``beam``): DeepSeek-V3's scores (sigmoid of fp32 logits, the router's correction bias for the selection
    only, groups scored by their top-2 sum, ``topk_group`` groups kept) with both top-ks sorted, the k renormalised
    (+1e-20) when ``norm_topk_prob`` and not scaled in the router (BeamTopKRouter): the MoE block multiplies the
    routed experts' sum by ``routed_scaling_factor``. No shared experts; the sparse layers those ``mlp_layer_types``
    says. Masking: logit -inf (score 0) and selection score -inf."""

    routing = "sigmoid + correction bias, group-limited top-k, renormalised; routed sum scaled"
    model_types = ("beam",)
    num_experts_key = "num_experts"
    shared_attrs = ()

    def selection_tensor(self, layer: MoELayer) -> torch.Tensor:
        return layer.router.e_score_correction_bias

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                bias: torch.Tensor) -> RoutingOutput:
        """BeamTopKRouter's ops with the correction bias ``bias`` (the layer's, or its kept experts' entries)."""
        router = layer.router
        if expert_mask is not None:
            expert_mask = expert_mask.to(router_logits.device)
            router_logits = router_logits.masked_fill(expert_mask, float("-inf"))
        scores = router_logits.sigmoid()
        choice = scores + bias
        if expert_mask is not None:
            choice = choice.masked_fill(expert_mask, float("-inf"))
        num_experts, num_group = choice.shape[-1], router.num_group
        best_two = choice.view(-1, num_group, num_experts // num_group).topk(2, dim=-1)[0].sum(dim=-1)
        chosen = torch.topk(best_two, k=router.topk_group, dim=-1)[1]
        choice = fill_unchosen_groups(choice, chosen, num_group, float("-inf"))
        top_index = torch.topk(choice, k=router.top_k, dim=-1)[1]
        top_weights = scores.gather(1, top_index)
        if router.norm_topk_prob:
            top_weights = renormalized(top_weights, RENORM_EPS)
        return router_logits, top_weights, top_index

    select_without = MoEFamily.select_without  # one mask per (token, expert) row

    def observed_router(self, layer: MoELayer, keep: Callable[[Any], None]) -> Callable[..., Any] | None:
        return None  # the router's own forward

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor, selected: torch.Tensor,
                       routing_state: Any = None) -> RemovalEffect:
        """:func:`_chosen_leaders_rerun`: the selected experts and each chosen group's top 2 re-run."""
        return _chosen_leaders_rerun(layer.router, router_logits, selected)

    def output_scale(self, layer: MoELayer) -> float:
        return float(layer.block.routed_scaling_factor)


class AXK2Family(SelectsWithExpertTensor, DeepseekV3Family):
    """A.X K2 (``axk2``): DeepSeek-V3's scores (sigmoid of fp32 logits, the router's correction bias for the selection
    only); with ``n_group`` set, groups scored by their top-2 sum and ``topk_group`` kept, the other groups' selection
    scores set to 0, not -inf (an expert there still beats a chosen one whose biased score is below 0); without
    ``n_group`` (A.X K2 Light) no groups; top-k, renormalised (+1e-20) when ``norm_topk_prob``, times
    ``routed_scaling_factor`` (AXK2TopkRouter). Masking: logit -inf (score 0) and selection score -inf, also after
    the groups' fill."""

    routing = "sigmoid + correction bias, top-k in the chosen groups (the others at 0), scaled"
    model_types = ("axk2",)

    @property
    def group_limited(self) -> bool:  # type: ignore[override]
        return self.text_config.n_group is not None

    def selection_tensor(self, layer: MoELayer) -> torch.Tensor:
        return layer.router.e_score_correction_bias

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                bias: torch.Tensor) -> RoutingOutput:
        """AXK2TopkRouter's ops with the correction bias ``bias`` (the layer's, or its kept experts' entries)."""
        router = layer.router
        if expert_mask is not None:
            expert_mask = expert_mask.to(router_logits.device)
            router_logits = router_logits.masked_fill(expert_mask, float("-inf"))
        scores = router_logits.sigmoid()
        choice = scores + bias
        if expert_mask is not None:
            choice = choice.masked_fill(expert_mask, float("-inf"))
        if router.num_group is not None:
            num_experts, num_group = choice.shape[-1], router.num_group
            best_two = choice.view(-1, num_group, num_experts // num_group).topk(2, dim=-1)[0].sum(dim=-1)
            chosen = torch.topk(best_two, k=router.topk_group, dim=-1, sorted=False)[1]
            choice = fill_unchosen_groups(choice, chosen, num_group, 0.0)
            if expert_mask is not None:
                choice = choice.masked_fill(expert_mask, float("-inf"))
        top_index = torch.topk(choice, k=router.top_k, dim=-1, sorted=False)[1]
        top_weights = scores.gather(1, top_index)
        if router.norm_topk_prob:
            top_weights = renormalized(top_weights, RENORM_EPS)
        return router_logits, top_weights * router.routed_scaling_factor, top_index

    select_without = MoEFamily.select_without  # one mask per (token, expert) row

    def observed_router(self, layer: MoELayer, keep: Callable[[Any], None]) -> Callable[..., Any] | None:
        return None  # the router's own forward

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor, selected: torch.Tensor,
                       routing_state: Any = None) -> RemovalEffect:
        """:func:`_chosen_leaders_rerun` with groups; without them only the selected experts are re-run (per-expert
        scores: any other removal changes nothing). A token that selected an expert of an unchosen group took it
        among the experts all at the fill's 0, a tie ``torch.topk`` breaks by position, which any removal there
        may change: every removal of such a token is re-run."""
        router = layer.router
        if router.num_group is None:
            return RemovalEffect(rerun=selected)
        effect = _chosen_leaders_rerun(router, router_logits, selected)
        num_tokens, num_experts = router_logits.shape
        size = num_experts // router.num_group
        choice = (router_logits.sigmoid() + router.e_score_correction_bias).view(-1, router.num_group, size)
        chosen = choice.topk(2, dim=-1)[0].sum(dim=-1).topk(router.topk_group, dim=-1)[1]       # [T, g]
        inside = (selected // size).unsqueeze(-1).eq(chosen.unsqueeze(1)).any(dim=-1)           # [T, k]
        tied = ~inside.all(dim=-1)
        if not bool(tied.any()):
            return effect
        rerun = torch.full((num_tokens, num_experts), -1, dtype=selected.dtype, device=selected.device)
        rerun[:, :effect.rerun.shape[1]] = effect.rerun
        rerun[tied] = torch.arange(num_experts, dtype=selected.dtype, device=selected.device)
        return RemovalEffect(rerun=rerun)


def _chosen_leaders_rerun(router: torch.nn.Module, router_logits: torch.Tensor,
                          selected: torch.Tensor) -> RemovalEffect:
    """The removal effect of a group-limited router on per-expert sigmoid scores s plus a selection bias (Beam, A.X K2):
    an unselected expert's removal changes the routing only through its group's top-2 sum, and only a chosen group's
    fall can change the chosen groups; so the selected experts and each chosen group's top 2 (of s + bias) are
    re-run, and any other removal leaves the selection and the weights as they are."""
    choice = router_logits.sigmoid() + router.e_score_correction_bias
    return RemovalEffect(rerun=chosen_group_leaders(choice, router.num_group, router.topk_group, selected))


class DeepseekV2Family(MoEFamily):
    """DeepSeek-V2: softmax of fp32 logits over all experts, then ``greedy`` top-k or ``group_limited_greedy``
    (groups scored by their best expert, ``topk_group`` groups kept, the rest zeroed), not renormalised, times
    ``routed_scaling_factor`` (DeepseekV2TopkRouter). Masking sets a pruned expert's logit to -inf (probability 0,
    the softmax's denominator as without it) and its selection score to -inf, so it is never chosen."""

    routing = "softmax, greedy or group-limited top-k, scaled"
    model_types = ("deepseek_v2",)
    num_experts_key = "n_routed_experts"
    shared_attrs = ("shared_experts",)

    @property
    def group_limited(self) -> bool:  # type: ignore[override]
        return self.text_config.topk_method == "group_limited_greedy"

    is_sparse_layer = DeepseekV3Family.is_sparse_layer  # the same dense-layer rule

    def group_limits(self) -> tuple[int, int]:
        cfg = self.text_config
        return (int(cfg.n_group or 1), int(cfg.topk_group or 1)) if self.group_limited else (1, 1)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        return F.linear(hidden_states.view(-1, router.weight.shape[1]).type(torch.float32),
                        router.weight.type(torch.float32))

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router = layer.router
        if expert_mask is not None:
            expert_mask = expert_mask.to(router_logits.device)
            router_logits = router_logits.masked_fill(expert_mask, float("-inf"))
        scores = router_logits.softmax(dim=-1, dtype=torch.float32)
        if router.topk_method == "group_limited_greedy":
            num_experts, num_group = scores.shape[-1], router.num_group
            best = scores.view(-1, num_group, num_experts // num_group).max(dim=-1).values
            scores = fill_unchosen_groups(scores, torch.topk(best, k=router.topk_group, dim=-1, sorted=False)[1],
                                          num_group, 0.0)
        elif router.topk_method != "greedy":
            raise ValueError(f"deepseek_v2 topk_method {router.topk_method!r}: lightprune knows 'greedy' and "
                             "'group_limited_greedy'")
        choice = scores if expert_mask is None else scores.masked_fill(expert_mask, float("-inf"))
        top_index = torch.topk(choice, k=router.top_k, dim=-1, sorted=False)[1]
        top_weights = scores.gather(1, top_index) if expert_mask is not None else \
            torch.topk(scores, k=router.top_k, dim=-1, sorted=False)[0]
        return router_logits, top_weights * router.routed_scaling_factor, top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor, selected: torch.Tensor,
                       routing_state: Any = None) -> RemovalEffect:
        """Softmax over all experts, not renormalised: an unselected expert's removal scales every probability by
        1 / (1 - p_j), which keeps the top-k and each group's order; under group-limited greedy a group's best
        expert is also a candidate (its removal lowers the group's score)."""
        growth = softmax_removal_growth(router_logits)
        router = layer.router
        if router.topk_method != "group_limited_greedy" or router.num_group <= router.topk_group:
            return RemovalEffect(rerun=selected, growth=growth)
        num_group, num_experts = router.num_group, router_logits.shape[-1]
        size = num_experts // num_group
        best = router_logits.view(-1, num_group, size).max(dim=-1)
        chosen = best[0].topk(router.topk_group, dim=-1, sorted=False)[1]          # an unchosen group can only fall
        leaders = best[1].gather(1, chosen) + chosen * size
        return RemovalEffect(rerun=unique_rows(torch.cat([selected, leaders], dim=1)), growth=growth)


# ------------------------------------------------------------------------------------------------ the table rows
# families whose transformers router computes what DeepSeek-V3's does (its forward, line for line), with DeepSeek-V3's
# attribute names and dense-layer rule (first_k_dense_replace or the config's mlp_layer_types): one row each
_IMAGES_AND_VIDEOS = ("image_token_id", "video_token_id")
_V3_ROUTER = "DeepSeek-V3's router (sigmoid, correction bias, groups, scaling)."

Glm4MoeFamily = family_row(__name__, DeepseekV3Family, "glm4_moe",
                           "GLM-4.5 / 4.6 (``glm4_moe``): DeepSeek-V3's router (Glm4MoeTopkRouter is the same "
                           "computation).")
SarvamMoeFamily = family_row(__name__, DeepseekV3Family, "sarvam_moe",
                             "Sarvam-30B (``sarvam_moe``): transformers builds it as a GLM-4.5 model "
                             "(Glm4MoeForCausalLM with a SarvamMoEConfig), so DeepSeek-V3's router.")
Param2MoeFamily = family_row(__name__, DeepseekV3Family, "param2moe",
                             "Param-2 MoE (``param2moe``): transformers builds it as a GLM-4.5 model "
                             "(Glm4MoeForCausalLM with a Param2MoeConfig), so DeepSeek-V3's router.")
SarvamMlaFamily = family_row(__name__, DeepseekV3Family, "sarvam_mla",
                             "Sarvam-105B (``sarvam_mla``): transformers builds it as a DeepSeek-V3 model "
                             "(DeepseekV3ForCausalLM with a SarvamMLAConfig), so DeepSeek-V3's router.")
Glm4vMoeFamily = family_row(__name__, DeepseekV3Family, "glm4v_moe",
                            "GLM-4.5V / 4.6V (``glm4v_moe``): a GLM-4.5 language model (DeepSeek-V3's router) with "
                            "image and video placeholders.",
                            multimodal=True, vision_token_keys=_IMAGES_AND_VIDEOS)
KimiK25Family = family_row(__name__, DeepseekV3Family, "kimi_k25",
                           "Kimi K2.5 / K2.6 (``kimi_k25``): a DeepSeek-V3 language model (``text_config.model_type`` "
                           "deepseek_v3) behind a MoonViT vision tower; images and videos are its vision tokens.",
                           multimodal=True, language_model_type="deepseek_v3", vision_token_keys=_IMAGES_AND_VIDEOS)
Dots1Family = family_row(__name__, DeepseekV3Family, "dots1",
                         "dots.llm1 (``dots1``): DeepSeek-V3's router and dense-layer rule.")
#: the rows registered by model type only (no name of their own here); settings: the config key counting the experts
DEEPSEEK_ALIKE: tuple[type[MoEFamily], ...] = tuple(
    family_row(__name__, DeepseekV3Family, model_type, f"``{model_type}``: {_V3_ROUTER}", **settings)
    for model_type, settings in (
        ("exaone_moe", {"num_experts_key": "num_experts"}),
        ("solar_open", {}),
        ("mimo_v2_flash", {}),
        ("hy_v4", {}),
        ("deepseek_v32", {}),
        ("glm_moe_dsa", {}),
        ("glm4_moe_lite", {}),
        ("axk1", {}),
        ("kimi_linear", {"num_experts_key": "num_local_experts"}),
        ("bailing_hybrid", {"num_experts_key": "num_local_experts"}),
    ))
Dots3NoteTextFamily = family_row(__name__, DeepseekV3Family, "dots3_note_text", f"``dots3_note_text``: {_V3_ROUTER}")
