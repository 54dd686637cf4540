"""DeepSeek-V2's router: softmax of fp32 logits, then greedy top-k or group-limited greedy (DeepSeek-V2, arXiv
2405.04434, device-limited routing: groups scored by their best expert), not renormalised, scaled."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from lightprune.models.base import MoEFamily, RemovalEffect
from lightprune.models.deepseek_families import DeepseekV3Family
from lightprune.models.layer import MoELayer, RoutingOutput
from lightprune.models.routing_ops import fill_unchosen_groups, softmax_removal_growth, unique_rows

__all__ = ["DeepseekV2Family"]


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
            best = scores.view(-1, num_group, num_experts // num_group).max(dim=-1).values  # each group's best expert
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
