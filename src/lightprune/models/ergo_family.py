"""Ergo (``ergo``): a biased sigmoid router and experts that norm each output with a scale of their own.

ErgoTopkRouter: fp32 logits (ErgoLinearWithFP32Output), s = sigmoid(l), the top-k (unsorted) of s + b (the router's
``e_score_correction_bias``), w = s / (sum_k s + 1e-20) * ``moe_routed_scaling_factor``, rounded to the hidden states'
dtype and back to fp32. ErgoExperts: every (token, selected expert) pair is its own row, run by the dispatched
projections (relu^2, transposed ``up_proj [E, H, I]``, ``down_proj [E, I, H]``) with weight 1, then RMS-normed with
expert j's scale ``post_expert_norm.weight[j]`` ([E, H], pruned with the experts), then weighted and summed:

    H(x) = shared(x) + sum_{j in S} w_j f_j(x),   f_j(x) = rmsnorm(relu(x U_j)^2 D_j) * g_j

The dispatched call sees one route per row, not the block's [T, k] selection, so calibration observes the experts in
the block's own forward (`ErgoFamily.observed_block`) with f_j as above.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lightprune.models.base import MoEFamily, SelectsWithExpertTensor
from lightprune.models.layer import MoELayer, RoutingOutput
from lightprune.models.routing_ops import sigmoid_biased_topk

__all__ = ["ErgoFamily"]


class ErgoFamily(SelectsWithExpertTensor, MoEFamily):
    """Ergo (``ergo``): sigmoid of fp32 logits + the router's correction bias, top-k, renormalised (+1e-20), scaled,
    rounded through the model's dtype; a per-expert output norm in the experts; shared experts; sparse layers from
    ``mlp_layer_types``. Masking: logit -inf and selection score -inf."""

    routing = "sigmoid of fp32 logits + correction bias, top-k, renormalised, scaled; per-expert output norm"
    model_types = ("ergo",)
    router_weight_attr = "linear"
    router_sub_tensors = (("", "e_score_correction_bias", 0),)
    block_sub_tensors = (("experts.post_expert_norm", "weight", 0),)
    shared_attrs = ("shared_experts",)
    score_function = "sigmoid"
    unselected_removal_is_free = True  # per-expert sigmoid scores, renormalised over the k

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        linear = layer.router.linear
        return linear(hidden_states.reshape(-1, linear.in_features))

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                bias: torch.Tensor) -> RoutingOutput:
        router_logits, weights, top_index = sigmoid_biased_topk(router_logits, bias, expert_mask, layer.top_k, 1e-20,
                                                                layer.router.routed_scaling_factor)
        return router_logits, weights.to(layer.experts.up_proj.dtype).float(), top_index

    def observed_block(self, layer: MoELayer, observe: Callable[..., torch.Tensor],
                       expert_rows: Callable[..., torch.Tensor]) -> Callable[..., Any]:
        """ErgoMoE's forward with the experts' part computed here: each (token, expert) row run by ``expert_rows``
        (the projections, grouped by expert) then normed with its expert's scale, the selected ones handed to
        ``observe`` with the router's weights."""
        block = layer.block

        def normed_rows(hidden, tokens, experts):  # f_e(x_t) = rmsnorm(relu(x U_e)^2 D_e) * g_e
            return layer.experts.post_expert_norm(expert_rows(layer.experts, hidden, tokens, experts), experts)

        def forward(hidden_states: torch.Tensor) -> torch.Tensor:
            residuals, shape = hidden_states, hidden_states.shape
            _, weights, index = block.gate(hidden_states)
            hidden = hidden_states.view(-1, shape[-1])
            num_tokens, k = index.shape
            tokens = torch.arange(num_tokens, device=index.device).repeat_interleave(k)

            def run(rows):
                chosen = normed_rows(hidden, tokens, index.reshape(-1)).view(num_tokens, k, -1)
                return chosen, None if rows is None else normed_rows(hidden, *rows)

            outputs = observe(hidden, index, weights, run)
            out = (outputs * weights.unsqueeze(-1)).sum(1).to(hidden.dtype).view(*shape)
            return out + block.shared_experts(residuals)

        return forward
