"""Llama 4 (``llama4_text``, and ``llama4``'s language model): a router whose score scales each expert's *input*.

Llama4TextMoe: logits l = W_r x; the k largest logits are chosen, s_j = sigmoid(l_j) for them and 0 for the others
(Llama4Router returns the dense scores [T, E] and the logits); every expert runs on every token with its input scaled,
and the block adds the shared expert::

    H(x) = shared(x) + sum_j f_j(s_j x) = shared(x) + sum_{j in S} f_j(s_j x)      (f_j(0) = 0: no biases)

so the routed part is a sum of per-expert *contributions* c_j(x) = f_j(s_j x), each a function of its own logit alone.
What each criterion observes (the MAEP, REAP and EAN definitions with the contribution in place of w_j f_j(x)):

- the observer gets c_j(x) as the expert's output and weight 1 (``observed_block``), so REAP = mean ||c_j||, EAN sums
  ||c_j||, frequency counts the tokens whose top-k holds j;
- Delta-H (MAEP eq. 2): removing a selected expert j keeps the other k - 1 (their scores read their own logits)
  and promotes the (k+1)-th largest logit n with its own score: H - H^(-j) = c_j - c_n, in closed form
  (`Llama4TextFamily.removal_effect`, weight 1); removing an unselected expert changes nothing.

Masking and pruning: the mask sets a removed expert's logit to -inf before the top-k (score 0: sigmoid(-inf), input
scaled to 0, output exactly 0), so the masked block computes what the block holding only the kept experts computes
(up to the order of the sum over the experts and the matmuls' blocking at another expert count, as in any family).
The experts (Llama4TextExperts) do not dispatch through transformers' ExpertsInterface: calibration observes them in the
block's own forward, which already runs every expert on every token (the contributions are read from its output).
Their weights are stored as transformers' transposed experts are (``gate_up_proj [E, H, 2I]``, ``down_proj
[E, I, H]``); the family marks the module ``is_transposed`` so that lightprune runs and aligns them as such.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lightprune.models.base import MoEFamily, RemovalEffect
from lightprune.models.family_rows import family_row
from lightprune.models.layer import MoELayer, RoutingOutput
from lightprune.models.routing_ops import mask_logits

__all__ = ["Llama4Family", "Llama4TextFamily"]


class Llama4TextFamily(MoEFamily):
    """Llama 4's language model (``llama4_text``): top-k of the logits, sigmoid of the chosen ones scaling each chosen
    expert's input, a shared expert; sparse layers from ``moe_layers`` (every ``interleave_moe_layer_step``-th)."""

    routing = "top-k of the logits, sigmoid of the k scaling each expert's input"
    model_types = ("llama4_text",)
    num_experts_key = "num_local_experts"
    mlp_attr = "feed_forward"
    router_attr = "router"
    shared_attrs = ("shared_expert",)
    score_function = "sigmoid"
    router_returns_logits = False  # Llama4Router returns (dense scores, logits)
    unselected_removal_is_free = True  # top-k of the logits, each chosen score its own logit's sigmoid

    experts_read_router_input = True  # the block scales the router's input for each expert

    def is_sparse_layer(self, index: int) -> bool:
        return index in set(self.text_config.moe_layers)

    def layers(self) -> list[MoELayer]:
        found = super().layers()
        for layer in found:  # Llama4TextExperts: [E, H, 2I] and [E, I, H], transformers' transposed layout
            layer.experts.is_transposed = True
        return found

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = mask_logits(router_logits, expert_mask)
        top_logits, top_index = torch.topk(router_logits, layer.top_k, dim=1)
        return router_logits, torch.sigmoid(top_logits.float()).to(router_logits.dtype), top_index

    def select_pruned(self, layer: MoELayer, router_logits: torch.Tensor, kept: torch.Tensor) -> RoutingOutput:
        """The base rule, the removed experts' logits at -inf (the first output here is the logits, not the scores the
        router returns first)."""
        logits, weights, index = super().select_pruned(layer, router_logits, kept)
        removed = torch.ones(logits.shape[-1], dtype=torch.bool, device=logits.device)
        return logits.masked_fill(removed.index_fill_(0, kept.to(logits.device), False), float("-inf")), weights, index

    def router_output(self, layer: MoELayer, routed: RoutingOutput) -> tuple[torch.Tensor, torch.Tensor]:
        """(dense scores [T, E]: the chosen experts' weights, 0 elsewhere; the logits), as Llama4Router returns them
        (its sigmoid of -inf is exactly 0)."""
        logits, weights, index = routed
        return torch.zeros_like(logits).scatter_(1, index, weights), logits

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor, selected: torch.Tensor,
                       routing_state: Any = None) -> RemovalEffect:
        """Removing selected expert j: the others stay (weight 1 each, the contribution view) and the (k+1)-th largest
        logit's expert enters with its own contribution (weight 1); with k = E nothing enters (weight 0). Exact up to
        a tie between the k-th and (k+1)-th logit."""
        num_tokens, k = selected.shape
        factor = torch.zeros(num_tokens, k, dtype=torch.float32, device=router_logits.device)
        if k >= router_logits.shape[-1]:
            return RemovalEffect(rerun=selected[:, :0], swap_factor=factor, swap_expert=selected[:, 0],
                                 swap_weight=factor)
        promoted = torch.topk(router_logits, k + 1, dim=-1).indices[:, k]
        return RemovalEffect(rerun=selected[:, :0], swap_factor=factor, swap_expert=promoted,
                             swap_weight=torch.ones_like(factor))

    def routed_output(self, layer: MoELayer, router_input: torch.Tensor, expert_input: torch.Tensor,
                      expert_mask: torch.Tensor | None = None) -> torch.Tensor:
        """sum_j f_j(s_j x) [T, H]: the experts module on the router's input scaled by each expert's dense score, as
        Llama4TextMoe runs it (``expert_input`` is the router's input)."""
        scores, _ = self.router_output(layer, self.route(layer, router_input, expert_mask))
        routed_in = expert_input.repeat(scores.shape[1], 1) * scores.transpose(0, 1).reshape(-1, 1)
        return layer.experts(routed_in).reshape(scores.shape[1], *expert_input.shape).sum(dim=0)

    def observed_block(self, layer: MoELayer, observe: Callable[..., torch.Tensor],
                       expert_rows: Callable[..., torch.Tensor]) -> Callable[..., Any]:
        """Llama4TextMoe's forward, op for op, with the chosen experts' contributions read from its dense expert
        output and handed to ``observe`` (weights 1); an extra (token, expert) row's contribution c_e(x_t) =
        f_e(sigmoid(l_te) x_t), the input scaled as the block scales it, run by ``expert_rows``."""
        block = layer.block

        def contributions(hidden, logits, tokens, experts):
            scores = torch.sigmoid(logits[tokens, experts].float()).to(hidden.dtype)
            scaled = hidden.index_select(0, tokens) * scores.unsqueeze(-1)
            return expert_rows(layer.experts, scaled, torch.arange(tokens.numel(), device=tokens.device), experts)

        def forward(hidden_states: torch.Tensor):
            hidden = hidden_states.reshape(-1, block.hidden_dim)
            scores, logits = block.router(hidden)
            routed_in = hidden.repeat(scores.shape[1], 1) * scores.transpose(0, 1).reshape(-1, 1)
            routed_out = block.experts(routed_in).reshape(scores.shape[1], -1, routed_in.shape[-1])   # [E, T, H]
            out = block.shared_expert(hidden)
            out.add_(routed_out.sum(dim=0))
            # the chosen experts: a nonzero score (the k largest logits of the router, masked or not)
            index = torch.topk(logits.masked_fill(scores == 0, float("-inf")), layer.top_k, dim=-1).indices
            chosen = routed_out.permute(1, 0, 2).gather(1, index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))

            def run(rows):
                extra = None if rows is None else contributions(hidden, logits, *rows)
                return chosen, extra

            observe(hidden, index, torch.ones(index.shape, dtype=hidden.dtype, device=hidden.device), run)
            return out, logits

        return forward


Llama4Family = family_row(__name__, Llama4TextFamily, "llama4",
                          "Llama 4 (``llama4``: Scout, Maverick): Llama4ForConditionalGeneration, its language model "
                          "Llama 4's text model (Llama4TextMoe blocks, the same router and experts).",
                          name="Llama4Family", multimodal=True, vision_token_keys=("image_token_index",),
                          language_model_type="llama4_text")
