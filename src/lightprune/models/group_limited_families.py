"""Routers with DeepSeek-V3's scores (sigmoid of fp32 logits, the correction bias for the selection only) and a
group-limited top-k of their own (`group_limited_top_k`, DeepSeek-V3 technical report, arXiv 2412.19437, section
2.1.2): Beam (both top-ks sorted, the routed sum scaled by the MoE block) and A.X K2 (the unchosen groups at 0,
optional groups)."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch

from lightprune.models.base import MoEFamily, RemovalEffect, SelectsWithExpertTensor
from lightprune.models.deepseek_families import DeepseekV3Family
from lightprune.models.deepseek_v3_routing import RENORM_EPS
from lightprune.models.layer import MoELayer, RoutingOutput
from lightprune.models.routing_ops import (
    chosen_group_leaders,
    chosen_groups,
    group_limited_top_k,
    mask_logits,
    masked_choice,
    renormalized,
)

__all__ = ["BiasedGroupLimitedFamily", "BeamFamily", "AXK2Family"]


class BiasedGroupLimitedFamily(SelectsWithExpertTensor, DeepseekV3Family):
    """DeepSeek-V3's scores s = sigmoid(l) and selection scores c = s + correction bias, the group-limited top-k of c
    (`group_limited_top_k`; none when the router has no ``num_group``), the weights s of the k renormalised (+1e-20)
    when ``norm_topk_prob``, times ``routed_scaling_factor`` when `scaled_in_router`. Masking: logit -inf (score 0)
    and selection score -inf, also after the groups' fill. Removals are re-run (`removal_effect`)."""

    #: the selection score of the experts outside the chosen groups
    unchosen_fill: ClassVar[float] = float("-inf")
    #: the router's two ``torch.topk`` sorted (their ties and the order of the k as it takes them)
    sorted_top: ClassVar[bool] = False
    #: the router multiplies the weights by ``routed_scaling_factor`` (else the MoE block scales the routed sum)
    scaled_in_router: ClassVar[bool] = True

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                bias: torch.Tensor) -> RoutingOutput:
        """The router's ops with the correction bias ``bias`` (the layer's, or its kept experts' entries)."""
        router = layer.router
        router_logits = mask_logits(router_logits, expert_mask)
        scores = router_logits.sigmoid()
        choice = masked_choice(scores, bias, expert_mask)
        if router.num_group is None:
            top_index = torch.topk(choice, k=router.top_k, dim=-1, sorted=self.sorted_top)[1]
        else:
            # masked_choice holds the removed experts at -inf: only a finite fill (A.X K2) can lift them above it
            finite_fill = self.unchosen_fill != float("-inf")
            top_index = group_limited_top_k(choice, router.num_group, router.topk_group, router.top_k,
                                            fill=self.unchosen_fill, sorted=self.sorted_top,
                                            expert_mask=expert_mask if finite_fill else None)
        top_weights = scores.gather(1, top_index)
        if router.norm_topk_prob:
            top_weights = renormalized(top_weights, RENORM_EPS)
        return router_logits, top_weights * router.routed_scaling_factor if self.scaled_in_router else top_weights, \
            top_index

    select_without = MoEFamily.select_without  # one mask per (token, expert) row

    def observed_router(self, layer: MoELayer, keep: Callable[[Any], None]) -> Callable[..., Any] | None:
        return None  # the router's own forward

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor, selected: torch.Tensor,
                       routing_state: Any = None) -> RemovalEffect:
        """`_chosen_leaders_rerun`: the selected experts and each chosen group's top 2 re-run."""
        return _chosen_leaders_rerun(layer.router, router_logits, selected)


class BeamFamily(BiasedGroupLimitedFamily):
    """Beam (``beam``): DeepSeek-V3's scores (sigmoid of fp32 logits, the router's correction bias for the selection
    only, groups scored by their top-2 sum, ``topk_group`` groups kept) with both top-ks sorted, the k renormalised
    (+1e-20) when ``norm_topk_prob`` and not scaled in the router (BeamTopKRouter): the MoE block multiplies the
    routed experts' sum by ``routed_scaling_factor``. No shared experts; the sparse layers those ``mlp_layer_types``
    says. Masking: logit -inf (score 0) and selection score -inf."""

    routing = "sigmoid + correction bias, group-limited top-k, renormalised; routed sum scaled"
    model_types = ("beam",)
    num_experts_key = "num_experts"
    shared_attrs = ()
    sorted_top = True
    scaled_in_router = False

    def output_scale(self, layer: MoELayer) -> float:
        return float(layer.block.routed_scaling_factor)


class AXK2Family(BiasedGroupLimitedFamily):
    """A.X K2 (``axk2``): DeepSeek-V3's scores (sigmoid of fp32 logits, the router's correction bias for the selection
    only); with ``n_group`` set, groups scored by their top-2 sum and ``topk_group`` kept, the other groups' selection
    scores set to 0, not -inf (an expert there still beats a chosen one whose biased score is below 0); without
    ``n_group`` (A.X K2 Light) no groups; top-k, renormalised (+1e-20) when ``norm_topk_prob``, times
    ``routed_scaling_factor`` (AXK2TopkRouter). Masking: logit -inf (score 0) and selection score -inf, also after
    the groups' fill."""

    routing = "sigmoid + correction bias, top-k in the chosen groups (the others at 0), scaled"
    model_types = ("axk2",)
    unchosen_fill = 0.0

    @property
    def group_limited(self) -> bool:  # type: ignore[override]
        return self.text_config.n_group is not None

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor, selected: torch.Tensor,
                       routing_state: Any = None) -> RemovalEffect:
        """`_chosen_leaders_rerun` with groups; without them only the selected experts are re-run (per-expert
        scores: any other removal changes nothing). A token that selected an expert of an unchosen group took it
        among the experts all at the fill's 0, a tie ``torch.topk`` breaks by position, which any removal there
        may change: every removal of such a token is re-run."""
        router = layer.router
        if router.num_group is None:
            return RemovalEffect(rerun=selected)
        num_tokens, num_experts = router_logits.shape
        size = num_experts // router.num_group
        choice = router_logits.sigmoid() + router.e_score_correction_bias
        effect = RemovalEffect(rerun=chosen_group_leaders(choice, router.num_group, router.topk_group, selected))
        chosen = chosen_groups(choice, router.num_group, router.topk_group, sorted=True)          # [T, g]
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
