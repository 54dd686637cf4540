"""LongCat-Flash (``longcat_flash``): zero-computation experts routed beside the FFN experts.

LongCat-Flash ("LongCat-Flash Technical Report", Meituan LongCat Team, arXiv 2509.01322, section 2.1) routes each
token among E FFN experts and Z zero-computation experts, which return their input. The router
(LongcatFlashTopkRouter) holds E + Z rows, the zero experts' last: ``classifier.weight [E + Z, H]`` and
``e_score_correction_bias [E + Z]``. In fp32::

    p = softmax(W x)                       over all E + Z rows
    S = the k largest of p + b             (the correction bias steers the choice only)
    w_j = p_j * routed_scaling_factor      for j in S
    H(x) = sum_{j in S, j < E} w_j f_j(x) + (sum_{j in S, j >= E} w_j) x

(LongcatFlashMoE sends a zero pick to a routed expert with weight 0 and adds the identity part after.)

Pruning removes FFN experts only: their rows go, the zero experts' rows stay after the kept ones
([`router_rows`][..layer.MoELayer.router_rows]), ``n_routed_experts`` follows and ``zero_expert_num`` stays.
Masking sets a removed expert's logit and choice score to -inf: the softmax is then the pruned router's (its
denominator without the expert) and the expert is never chosen. Calibration observes the selection over all E + Z
ids, a zero expert's output being its input, so that Delta-H removes an FFN expert from H as the block computes it
(promoting a zero expert where the router would); every criterion scores the FFN experts alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from lightprune.models.base import MoEFamily
from lightprune.models.layer import MoELayer, RoutingOutput, kept_entries
from lightprune.models.selection import selection_outputs, weighted_sum

__all__ = ["LongcatFlashFamily"]


class LongcatFlashFamily(MoEFamily):
    """LongCat-Flash: softmax over the FFN and zero-computation experts' rows, top-k of the probabilities plus a
    correction bias, the k probabilities scaled (see the module docstring). Every decoder layer holds one MoE block
    (``mlp``, beside its two dense MLPs)."""

    routing = "softmax over routed + zero-computation rows, + correction bias, top-k, scaled"
    model_types = ("longcat_flash",)
    num_experts_key = "n_routed_experts"
    identity_experts_key = "zero_expert_num"
    router_attr = "router"
    router_weight_attr = "classifier"
    router_sub_tensors = (("", "e_score_correction_bias", 0),)

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        """[T, E + Z] in fp32, as LongcatFlashTopkRouter computes them."""
        weight = layer.router_linear.weight
        return F.linear(hidden_states.reshape(-1, weight.shape[1]).float(), weight.float())

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        if expert_mask is not None and expert_mask.shape[-1] == layer.num_experts < router_logits.shape[-1]:
            expert_mask = F.pad(expert_mask.to(router_logits.device), (0, layer.identity_experts), value=False)
        return self._select(layer, router_logits, expert_mask, layer.router.e_score_correction_bias)

    def select_kept(self, layer: MoELayer, kept_logits: torch.Tensor, kept: torch.Tensor) -> RoutingOutput:
        bias = kept_entries(layer.router.e_score_correction_bias, layer.router_rows(kept.to(kept_logits.device)))
        return self._select(layer, kept_logits, None, bias)

    @staticmethod
    def _select(layer: MoELayer, logits: torch.Tensor, mask: torch.Tensor | None,
                bias: torch.Tensor) -> RoutingOutput:
        if mask is not None:
            mask = mask.to(logits.device)
            logits = logits.masked_fill(mask, float("-inf"))
        scores = logits.softmax(dim=-1)
        choice = scores + bias.unsqueeze(0)
        if mask is not None:
            choice = choice.masked_fill(mask, float("-inf"))
        index = torch.topk(choice, k=layer.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, index) * layer.router.routed_scaling_factor
        return logits, weights.to(logits.dtype), index

    def selected_rows(self, layer: MoELayer, hidden: torch.Tensor, tokens: torch.Tensor, ids: torch.Tensor,
                      expert_rows: Callable[..., torch.Tensor]) -> torch.Tensor:
        """Unweighted outputs [n, H] of the (token, id) rows: an FFN expert's run by ``expert_rows``, a zero
        expert's its input."""
        identity = ids >= layer.num_experts
        out = hidden.index_select(0, tokens).clone()
        ffn = (~identity).nonzero().squeeze(-1)
        out[ffn] = expert_rows(layer.experts, hidden, tokens[ffn], ids[ffn]).to(out.dtype)
        return out

    @staticmethod
    def _block_output(layer: MoELayer, hidden: torch.Tensor, index: torch.Tensor,
                      weights: torch.Tensor) -> torch.Tensor:
        """LongcatFlashMoE's output for the selection (``index``, ``weights``) [T, k], op for op."""
        num, zero = layer.num_experts, layer.identity_experts
        identity = index >= num
        identity_output = hidden * weights.masked_fill(~identity, 0.0).sum(dim=-1, keepdim=True)
        index = torch.where(identity, (index - num) * num // zero, index)
        out = layer.experts(hidden, index, weights.masked_fill(identity, 0.0))
        return out + identity_output.to(out.dtype)

    def routed_output(self, layer: MoELayer, router_input: torch.Tensor, expert_input: torch.Tensor,
                      expert_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The block's output (FFN and zero experts) on ``router_input``, ``expert_mask`` experts removed."""
        _, weights, index = self.route(layer, router_input, expert_mask)
        return self._block_output(layer, expert_input, index, weights.to(expert_input.dtype))

    def observed_block(self, layer: MoELayer, observe: Callable[..., torch.Tensor],
                       expert_rows: Callable[..., torch.Tensor]) -> Callable[..., Any]:
        """LongcatFlashMoE's forward with the selection over all E + Z ids handed to ``observe`` (a zero expert's
        output its input); the block's output is the weighted sum of those outputs."""
        block = layer.block

        def forward(hidden_states: torch.Tensor) -> torch.Tensor:
            hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
            _, weights, index = block.router(hidden)
            outputs = observe(hidden, index, weights, lambda extra: selection_outputs(
                index, extra, lambda tokens, ids: self.selected_rows(layer, hidden, tokens, ids, expert_rows)))
            return weighted_sum(outputs, weights, hidden.dtype).reshape(hidden_states.shape)

        return forward
