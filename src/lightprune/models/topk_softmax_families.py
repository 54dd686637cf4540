"""Routers that take the top k of the logits first, then a softmax (or a sigmoid) over the k alone: gpt-oss, Granite
MoE, Cohere2 MoE and Aria's language model. An unselected expert's removal changes nothing (the k and their weights
stay), a selected one's is re-run; a pruned expert's logit is -inf before the top-k."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightprune.models.base import MoEFamily
from lightprune.models.layer import MoELayer, RoutingOutput
from lightprune.models.routing_ops import mask_logits, renormalized

__all__ = ["GptOssFamily", "GraniteMoeFamily", "Cohere2MoeFamily", "AriaTextFamily"]


class GptOssFamily(MoEFamily):
    """gpt-oss: router logits with a bias, top-k of the logits, softmax over the k selected (GptOssTopKRouter);
    experts with biases and a clamped SwiGLU (pruned like every other per-expert tensor). Masking sets a pruned
    expert's logit to -inf before the top-k: it is never selected and the softmax over the k is unchanged."""

    routing = "biased logits, top-k, softmax over the k"
    model_types = ("gpt_oss",)
    num_experts_key = "num_local_experts"
    router_attr = "router"

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        return F.linear(hidden_states.reshape(-1, router.weight.shape[1]), router.weight, router.bias)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = mask_logits(router_logits, expert_mask)
        top_value, top_index = torch.topk(router_logits, layer.top_k, dim=-1)
        return router_logits, torch.softmax(top_value, dim=1, dtype=top_value.dtype), top_index

    unselected_removal_is_free = True  # top-k of the logits, softmax over the k


class GraniteMoeFamily(MoEFamily):
    """Granite MoE (``granitemoe``, ``granitemoeshared``, ``granitemoe_swa``, and the Mamba-2 hybrid
    ``granitemoehybrid``, whose every layer has the block beside its mamba or attention mixer): fp32 logits, top-k
    of the logits, softmax over the k in the hidden states' dtype (GraniteMoeTopKRouter); every layer sparse. A
    pruned expert's logit is -inf before the top-k."""

    routing = "top-k of fp32 logits, softmax over the k"
    model_types = ("granitemoe", "granitemoeshared", "granitemoe_swa", "granitemoehybrid")
    num_experts_key = "num_local_experts"
    mlp_attr = "block_sparse_moe"
    router_attr = "router"

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().router_logits(layer, hidden_states).float()

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = mask_logits(router_logits, expert_mask)
        top_logits, top_index = router_logits.topk(layer.top_k, dim=-1)
        return router_logits, torch.softmax(top_logits, dim=-1).type(layer.router.weight.dtype), top_index

    unselected_removal_is_free = True  # top-k of the logits, softmax over the k


class Cohere2MoeFamily(MoEFamily):
    """Cohere2 MoE: top-k of the logits, then softmax over the k (fp32) or sigmoid (renormalised with
    ``norm_topk_prob``), as ``expert_selection_fn`` says; cast to the hidden states' dtype."""

    routing = "top-k of the logits, softmax or sigmoid over the k"
    model_types = ("cohere2_moe",)

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = mask_logits(router_logits, expert_mask)
        scores, top_index = torch.topk(router_logits, layer.top_k, dim=-1)
        how = self.text_config.expert_selection_fn
        if how == "softmax":
            scores = torch.softmax(scores, dim=1, dtype=torch.float)
        elif how == "sigmoid":
            scores = torch.sigmoid(scores)
            if self.text_config.norm_topk_prob:
                scores = renormalized(scores)
        else:
            raise ValueError(f"cohere2_moe expert_selection_fn {how!r}: lightprune knows 'softmax' and 'sigmoid'")
        return router_logits, scores.to(router_logits.dtype), top_index

    unselected_removal_is_free = True  # top-k of the logits, softmax or sigmoid over the k


class AriaTextFamily(MoEFamily):
    """Aria's language model (``aria_text``): every layer sparse, shared experts; top-k of the logits, softmax over
    the k in the logits' dtype (AriaTextTopKRouter); experts stored transposed (experts still on dimension 0).
    Masking: logit -inf before the top-k."""

    routing = "top-k of the logits, softmax over the k"
    model_types = ("aria_text",)
    num_experts_key = "moe_num_experts"
    router_attr = "router"
    shared_attrs = ("shared_experts",)

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def top_k(self) -> int:
        return int(self.text_config.moe_topk)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = mask_logits(router_logits, expert_mask)
        top_logits, top_index = torch.topk(router_logits, layer.top_k, dim=-1)
        return router_logits, F.softmax(top_logits, dim=-1), top_index

    unselected_removal_is_free = True  # top-k of the logits, softmax over the k
