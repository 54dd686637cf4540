"""One family class per supported model type (selected by ``config.model_type``).

| family | routing | dense layers | shared experts |
|---|---|---|---|
| mixtral | softmax, renormalised, fp32 weights | none | none |
| qwen2_moe | softmax, ``norm_topk_prob`` | mlp_only_layers, decoder_sparse_step | shared_expert (+ sigmoid gate) |
| qwen3_moe | softmax, ``norm_topk_prob`` | mlp_only_layers, decoder_sparse_step | none |
| olmoe | softmax, ``norm_topk_prob`` (default off) | none | none |
| deepseek_v3 | sigmoid + e_score_correction_bias, n_group/topk_group, routed_scaling_factor | first_k_dense_replace | shared_experts |
| qwen3_vl_moe | softmax, always renormalised | mlp_only_layers, decoder_sparse_step | none |
| internvl | its Qwen3-MoE language model | as qwen3_moe | none |
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from lightprune.models.base import MoEFamily, MoELayer, RoutingOutput
from lightprune.models.softmax_routing import softmax_logits, softmax_topk_select

__all__ = ["MixtralFamily", "Qwen2MoeFamily", "Qwen3MoeFamily", "OlmoeFamily", "DeepseekV3Family",
           "Qwen3VLMoeFamily", "InternVLFamily"]


class _SoftmaxFamily(MoEFamily):
    cast_back: ClassVar[bool] = True

    def renormalize(self) -> bool:
        return bool(getattr(self.text_config, "norm_topk_prob", True))

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        return softmax_logits(layer.router, hidden_states)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        return softmax_topk_select(router_logits, expert_mask, layer.top_k, self.renormalize(), self.cast_back)


class MixtralFamily(_SoftmaxFamily):
    model_types = ("mixtral",)
    num_experts_key = "num_local_experts"
    cast_back = False

    def renormalize(self) -> bool:
        return True

    def is_sparse_layer(self, index: int) -> bool:
        return True


class Qwen2MoeFamily(_SoftmaxFamily):
    model_types = ("qwen2_moe",)
    shared_attrs = ("shared_expert",)


class Qwen3MoeFamily(_SoftmaxFamily):
    model_types = ("qwen3_moe",)


class OlmoeFamily(_SoftmaxFamily):
    model_types = ("olmoe",)

    def is_sparse_layer(self, index: int) -> bool:
        return True


class Qwen3VLMoeFamily(_SoftmaxFamily):
    model_types = ("qwen3_vl_moe",)
    multimodal = True

    def renormalize(self) -> bool:
        return True

    def vision_token_ids(self) -> tuple[int, ...]:
        """``image_token_id`` and ``video_token_id`` of the top-level config."""
        return _config_ids(self.config, ("image_token_id", "video_token_id"))


class InternVLFamily(_SoftmaxFamily):
    model_types = ("internvl",)
    multimodal = True

    def __init__(self, model):
        super().__init__(model)
        lm_type = self.text_config.model_type
        if lm_type != "qwen3_moe":
            raise ValueError(f"InternVL is supported with a qwen3_moe language model, got {lm_type!r}")

    def vision_token_ids(self) -> tuple[int, ...]:
        """``image_token_id`` of the top-level config (InternVL has no video placeholder of its own)."""
        return _config_ids(self.config, ("image_token_id",))


def _config_ids(config, keys: tuple[str, ...]) -> tuple[int, ...]:
    """The integer values of ``keys`` on ``config`` that are set, in order, without repeats."""
    found: list[int] = []
    for key in keys:
        value = getattr(config, key, None)
        if value is not None and int(value) not in found:
            found.append(int(value))
    return tuple(found)


class DeepseekV3Family(MoEFamily):
    """DeepSeek-V3: sigmoid scores, correction bias for selection only, group-limited top-k,
    optional renormalisation, then ``routed_scaling_factor``.

    Masking sets the expert's logit to -inf (score 0) and its selection score to -inf (the
    correction bias alone could otherwise still select it), so a masked expert takes no part in
    group scores or selection: exactly the model with that expert removed.
    """

    model_types = ("deepseek_v3",)
    num_experts_key = "n_routed_experts"
    shared_attrs = ("shared_experts",)
    group_limited = True

    def is_sparse_layer(self, index: int) -> bool:
        cfg = self.text_config
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
        router = layer.router
        num_experts, num_group = router.weight.shape[0], router.num_group
        bias = router.e_score_correction_bias
        if expert_mask is not None:
            expert_mask = expert_mask.to(router_logits.device)
            router_logits = router_logits.masked_fill(expert_mask, float("-inf"))
            bias = bias.masked_fill(expert_mask, float("-inf"))
        scores = router_logits.sigmoid()
        scores_for_choice = scores + bias
        group_scores = scores_for_choice.view(-1, num_group, num_experts // num_group).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=router.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores)
        group_mask.scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, num_group, num_experts // num_group).reshape(-1, num_experts)
        scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
        topk_indices = torch.topk(scores_for_choice, k=router.top_k, dim=-1, sorted=False)[1]
        topk_weights = scores.gather(1, topk_indices)
        if router.norm_topk_prob:
            topk_weights /= topk_weights.sum(dim=-1, keepdim=True) + 1e-20
        topk_weights = topk_weights * router.routed_scaling_factor
        return router_logits, topk_weights, topk_indices
