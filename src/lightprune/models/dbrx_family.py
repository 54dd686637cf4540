"""DBRX (``dbrx``): each expert's weights stored as a block of rows of three tensors shared by all experts.

DbrxExpertGLU holds ``w1`` (gate), ``v1`` (up) and ``w2`` (down, transposed), each [E * I, H] with I =
``ffn_config.ffn_hidden_size``: expert e owns rows e * I .. (e + 1) * I - 1 of each, and

    f_e(x) = (act(x W1_e^T) * (x V1_e^T)) W2_e.

The router (DbrxRouter, ``layer.weight`` [E, H]) and DbrxFFN's selection: p = softmax(W x) in the logits' dtype, the k
largest p chosen, their weights p_S / ||p_S||_q with q = ``moe_normalize_expert_weights`` (None: p_S as they are).
A normalised selection depends on the chosen experts' logits alone, so removing an expert a token did not choose
leaves its routing as it was.

Pruning keeps each kept expert's I rows of ``w1``, ``v1`` and ``w2`` (`DbrxFamily.expert_sub_tensors`) and its
router row; ``ffn_config.moe_num_experts`` follows. Masking sets a removed expert's logit to -inf: its probability is
0 and the block never chooses it (the block, not the router, takes the top-k, over all E columns: where kept experts'
logits tie exactly, it may break the tie otherwise than the pruned block over E' columns). The experts do not
dispatch through transformers' ExpertsInterface: calibration observes them in the block's own forward
(`DbrxFamily.observed_block`), each (token, expert) row run from the expert's rows (`DbrxFamily.selected_rows`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from lightprune.models.base import MoEFamily
from lightprune.models.layer import MoELayer, RoutingOutput, config_value
from lightprune.models.routing_ops import mask_logits
from lightprune.models.selection import selection_outputs, weighted_sum

__all__ = ["DbrxFamily"]


class DbrxFamily(MoEFamily):
    """DBRX: softmax, top-k, the k normalised by their q-norm; experts as row blocks of ``mlp.w1`` / ``v1`` / ``w2``
    (see the module docstring). Every block (``transformer.blocks``) holds an MoE ``ffn``."""

    routing = "softmax, top-k, normalised by the k's q-norm"
    model_types = ("dbrx",)
    num_experts_key = "ffn_config.moe_num_experts"
    mlp_attr = "ffn"
    router_attr = "router"
    router_weight_attr = "layer"
    expert_sub_tensors = (("mlp", "w1"), ("mlp", "v1"), ("mlp", "w2"))
    expert_rows_key = "ffn_config.ffn_hidden_size"

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def top_k(self) -> int:
        return int(config_value(self.text_config, "ffn_config.moe_top_k"))

    @property
    def _norm(self) -> float | None:
        return self.text_config.ffn_config.moe_normalize_expert_weights

    @property
    def unselected_removal_is_free(self) -> bool:  # type: ignore[override]
        return self._norm is not None  # the k weights normalised: they read the chosen logits alone

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = layer.router_linear.weight
        return F.linear(hidden_states.reshape(-1, weight.shape[1]), weight)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        """DbrxFFN.route_tokens_to_experts, op for op, on the masked logits."""
        router_logits = mask_logits(router_logits, expert_mask)
        scores = torch.softmax(router_logits, dim=1, dtype=router_logits.dtype)
        top, index = torch.topk(scores, layer.top_k, dim=-1)
        if self._norm is not None:
            top = top / torch.norm(top, p=self._norm, dim=-1, keepdim=True)
        return router_logits, top, index

    def router_output(self, layer: MoELayer, routed: RoutingOutput) -> torch.Tensor:
        """DbrxRouter returns the logits alone (the block selects from them)."""
        return routed[0]

    def expert_output_width(self, layer: MoELayer) -> int:
        return int(layer.experts.mlp.w2.shape[1])

    def selected_rows(self, layer: MoELayer, hidden: torch.Tensor, tokens: torch.Tensor, ids: torch.Tensor,
                      expert_rows: Callable[..., torch.Tensor]) -> torch.Tensor:
        """Unweighted outputs [n, H]: row i expert ``ids[i]`` on ``hidden[tokens[i]]``, each expert run once on its
        rows with DbrxExpertGLU's own ops on its slices of ``w1``, ``v1`` and ``w2``."""
        mlp = layer.experts.mlp
        rows = self.rows_per_expert()
        out = torch.empty(ids.numel(), mlp.w2.shape[1], dtype=hidden.dtype, device=hidden.device)
        ids, order = torch.sort(ids, stable=True)
        counts = torch.bincount(ids, minlength=layer.num_experts).tolist()
        x = hidden.index_select(0, tokens.index_select(0, order))
        start = 0
        for expert, count in enumerate(counts):
            if count:
                part = slice(expert * rows, (expert + 1) * rows)
                out[order[start:start + count]] = mlp(x[start:start + count], mlp.w1[part], mlp.v1[part],
                                                      mlp.w2[part]).to(out.dtype)
                start += count
        return out

    def routed_output(self, layer: MoELayer, router_input: torch.Tensor, expert_input: torch.Tensor,
                      expert_mask: torch.Tensor | None = None) -> torch.Tensor:
        """DbrxExperts on the selection, [T, H] (the module returns [T, 1, H] for a [T, H] input)."""
        _, weights, index = self.route(layer, router_input, expert_mask)
        out = layer.experts(expert_input, index, weights.to(expert_input.dtype))
        return out.reshape(expert_input.shape[0], -1)

    def observed_block(self, layer: MoELayer, observe: Callable[..., torch.Tensor],
                       expert_rows: Callable[..., torch.Tensor]) -> Callable[..., Any]:
        """DbrxFFN's forward with the selected experts' outputs computed here (`selected_rows`) and handed to
        ``observe``; the output is their weighted sum, [B, S, H] as DbrxExperts returns it."""
        block = layer.block

        def forward(hidden_states: torch.Tensor) -> torch.Tensor:
            logits = block.router(hidden_states)
            weights, index = block.route_tokens_to_experts(logits)
            hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
            outputs = observe(hidden, index, weights, lambda extra: selection_outputs(
                index, extra, lambda tokens, ids: self.selected_rows(layer, hidden, tokens, ids, expert_rows)))
            out = weighted_sum(outputs, weights, hidden.dtype)
            return out.view(hidden_states.shape[0], -1, out.shape[-1])

        return forward
