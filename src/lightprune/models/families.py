"""One family class per supported model type (selected by ``config.model_type``).

Each class states its routing rule in its docstring and in ``routing``; the table of every registered
family (routing, shared experts, multimodal) and of every refused model type with its reason is generated
by :func:`lightprune.models.family_table` (the README's "Add a model family" shows it). A family that reuses
another's rule says so by subclassing it: the transformers router of each was compared line by line, and the
conformance tests check route == the family's own router bitwise, masked == pruned == reloaded, and the
calibration statistics against brute force.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from lightprune.models.base import MoEFamily, MoELayer, RoutingOutput, mlp_layer_type
from lightprune.models.softmax_routing import softmax_logits, softmax_topk_select

__all__ = ["MixtralFamily", "Qwen2MoeFamily", "Qwen3MoeFamily", "OlmoeFamily", "DeepseekV3Family",
           "Qwen3VLMoeFamily", "InternVLFamily", "Glm4MoeFamily", "Dots1Family", "MiniMaxFamily", "FlexOlmoFamily",
           "DEEPSEEK_ALIKE", "MellumFamily", "Qwen3NextFamily", "GptOssFamily", "GraniteMoeFamily",
           "JambaFamily", "Cohere2MoeFamily", "Qwen3_5MoeTextFamily", "DeepseekV2Family", "Ernie4_5MoeFamily",
           "Gemma4TextFamily", "Gemma4Family", "HunYuanMoEV1Family", "MiniMaxM2Family", "HYV3Family", "AfmoeFamily",
           "Lfm2MoeFamily", "Qwen3_5MoeFamily", "Qwen3OmniMoeThinkerFamily", "Glm4vMoeFamily", "PhimoeFamily",
           "NemotronHFamily", "LagunaFamily", "AriaTextFamily", "Qwen4ExpTextFamily", "Qwen4ExpFamily",
           "Dots3NoteTextFamily", "MiniMaxM3VLTextFamily", "KimiK25Family",
           "BUILT_IN",
           "REFUSED_TYPES"]


class _SoftmaxFamily(MoEFamily):
    cast_back: ClassVar[bool] = True
    routing = "softmax, top-k, renormalised when norm_topk_prob"

    def renormalize(self) -> bool:
        return bool(getattr(self.text_config, "norm_topk_prob", True))

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        return softmax_logits(layer.router, hidden_states)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        return softmax_topk_select(router_logits, expert_mask, layer.top_k, self.renormalize(), self.cast_back)

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Removing an unselected expert j keeps the top-k (the softmax over the rest is p_i / (1 - p_j), the same
        order); renormalised weights are unchanged, plain softmax weights scale by 1 / (1 - p_j)."""
        if self.renormalize():
            return selected, None
        return selected, _softmax_removal_scale(router_logits)


class MixtralFamily(_SoftmaxFamily):
    routing = "softmax of fp32 logits, top-k, renormalised"
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
    routing = "softmax, top-k, renormalised"
    model_types = ("qwen3_vl_moe",)
    multimodal = True

    def renormalize(self) -> bool:
        return True

    def vision_token_ids(self) -> tuple[int, ...]:
        """``image_token_id`` and ``video_token_id`` of the top-level config."""
        return _config_ids(self.config, ("image_token_id", "video_token_id"))


class Qwen3OmniMoeThinkerFamily(_SoftmaxFamily):
    """Qwen3-Omni's thinker (``qwen3_omni_moe_thinker``): a Qwen3-MoE language model (softmax, top-k,
    ``norm_topk_prob``) reading text, image, video and audio; images and videos are its vision tokens."""

    model_types = ("qwen3_omni_moe_thinker",)
    multimodal = True

    def vision_token_ids(self) -> tuple[int, ...]:
        """``image_token_id`` and ``video_token_id`` of the thinker's config (audio placeholders are not vision)."""
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

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Sigmoid scores are per expert and the weights are the selected ones' (renormalised or not): an
        unselected expert matters only through its group's score, the sum of the group's top-2 selection scores,
        when not every group is chosen, and only in a chosen group (an unchosen group's score can only fall);
        candidates are the selected experts and the top 2 of each chosen group."""
        router = layer.router
        num_group, num_experts = router.num_group, router_logits.shape[-1]
        if num_group <= router.topk_group:
            return selected, None
        choice = router_logits.sigmoid() + router.e_score_correction_bias
        size = num_experts // num_group
        top2 = choice.view(-1, num_group, size).topk(2, dim=-1)
        chosen = top2[0].sum(dim=-1).topk(router.topk_group, dim=-1, sorted=False)[1]        # [T, topk_group]
        leaders = top2[1].gather(1, chosen.unsqueeze(-1).expand(-1, -1, 2)) + chosen.unsqueeze(-1) * size
        return _unique_rows(torch.cat([selected, leaders.reshape(selected.shape[0], -1)], dim=1)), None


class Glm4MoeFamily(DeepseekV3Family):
    """GLM-4.5 / 4.6 (``glm4_moe``): DeepSeek-V3's router (Glm4MoeTopkRouter is the same computation)."""

    model_types = ("glm4_moe",)


class Glm4vMoeFamily(DeepseekV3Family):
    """GLM-4.5V / 4.6V (``glm4v_moe``): a GLM-4.5 language model (DeepSeek-V3's router) with image and video
    placeholders."""

    model_types = ("glm4v_moe",)
    multimodal = True

    def vision_token_ids(self) -> tuple[int, ...]:
        """``image_token_id`` and ``video_token_id`` of the top-level config (begin / end markers are text)."""
        return _config_ids(self.config, ("image_token_id", "video_token_id"))


class KimiK25Family(DeepseekV3Family):
    """Kimi K2.5 / K2.6 (``kimi_k25``): a DeepSeek-V3 language model (``text_config.model_type`` deepseek_v3) behind a
    MoonViT vision tower; images and videos are its vision tokens."""

    model_types = ("kimi_k25",)
    multimodal = True

    def __init__(self, model):
        super().__init__(model)
        lm_type = self.text_config.model_type
        if lm_type != "deepseek_v3":
            raise ValueError(f"Kimi K2.5 is supported with a deepseek_v3 language model, got {lm_type!r}")

    def vision_token_ids(self) -> tuple[int, ...]:
        """``image_token_id`` and ``video_token_id`` of the top-level config (vision_start / end are markers)."""
        return _config_ids(self.config, ("image_token_id", "video_token_id"))


class NemotronHFamily(DeepseekV3Family):
    """Nemotron-H / Nemotron 3 (``nemotron_h``): DeepSeek-V3's router (NemotronHTopkRouter is the same computation)
    in the layers whose ``layers_block_type`` is "moe" (the others are Mamba-2, attention or MLP mixers); ungated
    relu^2 experts (``up_proj``, ``down_proj``), fed a latent projection of the router's input when
    ``moe_latent_size`` is set."""

    model_types = ("nemotron_h",)
    mlp_attr = "mixer"

    def is_sparse_layer(self, index: int) -> bool:
        return self.text_config.layers_block_type[index] == "moe"


class Dots1Family(DeepseekV3Family):
    """dots.llm1 (``dots1``): DeepSeek-V3's router and dense-layer rule."""

    model_types = ("dots1",)


class MiniMaxFamily(MixtralFamily):
    """MiniMax-Text-01 (``minimax``): Mixtral's router (softmax of fp32 logits, top-k, renormalised) in every
    layer, whatever its attention type."""

    model_types = ("minimax",)


class FlexOlmoFamily(OlmoeFamily):
    """FlexOlmo (``flex_olmo``): OLMoE's router."""

    model_types = ("flex_olmo",)


def _unique_rows(ids: torch.Tensor) -> torch.Tensor:
    """Each row's distinct values (ascending), padded with the row's first value to the longest row."""
    ids = ids.sort(dim=-1).values
    repeat = torch.zeros_like(ids, dtype=torch.bool)
    repeat[:, 1:] = ids[:, 1:] == ids[:, :-1]
    width = int((~repeat).sum(dim=-1).max())
    order = torch.sort(repeat.to(torch.int8), dim=-1, stable=True).indices[:, :width]     # distinct values first
    out = ids.gather(1, order)
    return torch.where(repeat.gather(1, order), ids[:, :1], out)


def _softmax_removal_scale(router_logits: torch.Tensor) -> torch.Tensor:
    """1 / (1 - p_j) [T, E] (float64): the factor every softmax probability takes when expert j is removed."""
    p = torch.softmax(router_logits.double(), dim=-1)
    return 1.0 / (1.0 - p).clamp_min(1e-300)


def _mask_logits(router_logits: torch.Tensor, expert_mask: torch.Tensor | None) -> torch.Tensor:
    """Router logits with the masked experts at -inf: never selected, and out of every softmax."""
    if expert_mask is None:
        return router_logits
    return router_logits.masked_fill(expert_mask.to(router_logits.device), float("-inf"))


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
        router_logits = _mask_logits(router_logits, expert_mask)
        top_value, top_index = torch.topk(router_logits, layer.top_k, dim=-1)
        return router_logits, torch.softmax(top_value, dim=1, dtype=top_value.dtype), top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An unselected expert's removal changes nothing: top-k of the logits, softmax over the k."""
        return selected, None


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
        return F.linear(hidden_states.reshape(-1, layer.router.weight.shape[1]), layer.router.weight).float()

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = _mask_logits(router_logits, expert_mask)
        top_logits, top_index = router_logits.topk(layer.top_k, dim=-1)
        return router_logits, torch.softmax(top_logits, dim=-1).type(layer.router.weight.dtype), top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An unselected expert's removal changes nothing: top-k of the logits, softmax over the k."""
        return selected, None


class JambaFamily(MoEFamily):
    """Jamba: softmax of fp32 logits, top-k, no renormalisation, cast to the hidden states' dtype; an MoE block in
    layer i when ``i % expert_layer_period == expert_layer_offset`` (``config.layers_num_experts``)."""

    routing = "softmax, top-k, not renormalised"
    model_types = ("jamba",)
    mlp_attr = "feed_forward"
    router_attr = "router"

    def is_sparse_layer(self, index: int) -> bool:
        cfg = self.text_config
        return int(cfg.num_experts) > 1 and index % cfg.expert_layer_period == cfg.expert_layer_offset

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states.reshape(-1, layer.router.weight.shape[1]), layer.router.weight)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = _mask_logits(router_logits, expert_mask)
        weights = torch.softmax(router_logits, dim=-1, dtype=torch.float)
        top_weights, top_index = torch.topk(weights, layer.top_k, dim=-1)
        return router_logits, top_weights.to(router_logits.dtype), top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Softmax over all experts, not renormalised: an unselected expert's removal scales by 1 / (1 - p_j)."""
        return selected, _softmax_removal_scale(router_logits)


class Cohere2MoeFamily(MoEFamily):
    """Cohere2 MoE: top-k of the logits, then softmax over the k (fp32) or sigmoid (renormalised with
    ``norm_topk_prob``), as ``expert_selection_fn`` says; cast to the hidden states' dtype."""

    routing = "top-k of the logits, softmax or sigmoid over the k"
    model_types = ("cohere2_moe",)

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states.reshape(-1, layer.router.weight.shape[1]), layer.router.weight)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = _mask_logits(router_logits, expert_mask)
        scores, top_index = torch.topk(router_logits, layer.top_k, dim=-1)
        how = self.text_config.expert_selection_fn
        if how == "softmax":
            scores = torch.softmax(scores, dim=1, dtype=torch.float)
        elif how == "sigmoid":
            scores = torch.sigmoid(scores)
            if self.text_config.norm_topk_prob:
                scores = scores / torch.sum(scores, dim=-1, keepdim=True)
        else:
            raise ValueError(f"cohere2_moe expert_selection_fn {how!r}: lightprune knows 'softmax' and 'sigmoid'")
        return router_logits, scores.to(router_logits.dtype), top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An unselected expert's removal changes nothing: top-k of the logits, softmax or sigmoid over the k."""
        return selected, None


class Qwen3_5MoeTextFamily(Qwen2MoeFamily):
    """Qwen3.5-MoE's language model (``qwen3_5_moe_text``): Qwen2-MoE's block, its router always renormalised."""

    routing = "softmax, top-k, renormalised"
    model_types = ("qwen3_5_moe_text",)

    def renormalize(self) -> bool:
        return True


class Qwen3_5MoeFamily(Qwen3_5MoeTextFamily):
    """Qwen3.5-MoE MLLM (``qwen3_5_moe``): its Qwen3.5-MoE language model, with image and video placeholders."""

    model_types = ("qwen3_5_moe",)
    multimodal = True

    def vision_token_ids(self) -> tuple[int, ...]:
        """``image_token_id`` and ``video_token_id`` of the top-level config."""
        return _config_ids(self.config, ("image_token_id", "video_token_id"))


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
            group_scores = scores.view(-1, num_group, num_experts // num_group).max(dim=-1).values
            group_idx = torch.topk(group_scores, k=router.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores)
            group_mask.scatter_(1, group_idx, 1)
            score_mask = group_mask.unsqueeze(-1).expand(-1, num_group, num_experts // num_group).reshape(-1, num_experts)
            scores = scores.masked_fill(~score_mask.bool(), 0.0)
        elif router.topk_method != "greedy":
            raise ValueError(f"deepseek_v2 topk_method {router.topk_method!r}: lightprune knows 'greedy' and "
                             "'group_limited_greedy'")
        choice = scores if expert_mask is None else scores.masked_fill(expert_mask, float("-inf"))
        top_index = torch.topk(choice, k=router.top_k, dim=-1, sorted=False)[1]
        top_weights = scores.gather(1, top_index) if expert_mask is not None else \
            torch.topk(scores, k=router.top_k, dim=-1, sorted=False)[0]
        return router_logits, top_weights * router.routed_scaling_factor, top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Softmax over all experts, not renormalised: an unselected expert's removal scales every probability by
        1 / (1 - p_j), which keeps the top-k and each group's order; under group-limited greedy a group's best
        expert is also a candidate (its removal lowers the group's score)."""
        scale = _softmax_removal_scale(router_logits)
        router = layer.router
        if router.topk_method != "group_limited_greedy" or router.num_group <= router.topk_group:
            return selected, scale
        num_group, num_experts = router.num_group, router_logits.shape[-1]
        size = num_experts // num_group
        best = router_logits.view(-1, num_group, size).max(dim=-1)
        chosen = best[0].topk(router.topk_group, dim=-1, sorted=False)[1]          # an unchosen group can only fall
        leaders = best[1].gather(1, chosen) + chosen * size
        return _unique_rows(torch.cat([selected, leaders], dim=1)), scale


class Ernie4_5MoeFamily(MoEFamily):
    """ERNIE-4.5-MoE: softmax of fp32 logits, top-k of the probabilities plus a selection bias
    (``gate.moe_statics.e_score_correction_bias`` [1, E], pruned with the experts), the k probabilities renormalised
    (clamped at ``moe_norm_min``), cast to the hidden states' dtype. Masking: logit -inf (probability 0, the softmax
    as without the expert) and selection score -inf."""

    routing = "softmax + selection bias, top-k, renormalised"
    model_types = ("ernie4_5_moe",)
    num_experts_key = "moe_num_experts"
    shared_attrs = ("shared_experts",)
    router_sub_tensors = (("moe_statics", "e_score_correction_bias", -1),)

    def is_sparse_layer(self, index: int) -> bool:
        cfg = self.text_config
        return ((index + 1) % cfg.moe_layer_interval == 0 and cfg.moe_layer_start_index <= index
                and index <= cfg.moe_layer_end_index)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states.reshape(-1, layer.router.weight.shape[1]).float(), layer.router.weight.float())

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router = layer.router
        if expert_mask is not None:
            expert_mask = expert_mask.to(router_logits.device)
            router_logits = router_logits.masked_fill(expert_mask, float("-inf"))
        weights = torch.softmax(router_logits, dim=1, dtype=torch.float)
        choice = router.moe_statics(weights)
        if expert_mask is not None:
            choice = choice.masked_fill(expert_mask, float("-inf"))
        top_index = torch.topk(choice, router.top_k, dim=-1)[1]
        top = torch.gather(weights, dim=-1, index=top_index)
        top = top / torch.clamp(top.sum(dim=-1, keepdim=True), min=router.norm_min)
        return router_logits, top.to(layer.experts.down_proj.dtype), top_index


class Gemma4TextFamily(MoEFamily):
    """Gemma 4 (``gemma4_text``): every decoder layer with ``enable_moe_block`` holds a router and experts of its
    own beside its dense MLP (the MoE block is the decoder layer). The router (Gemma4TextRouter) sees the layer's
    residual stream, RMS-normed without scale, times ``scale`` and ``hidden_size ** -0.5``; ``proj`` gives the
    logits, softmax in fp32, top-k, renormalised over the k, times ``per_expert_scale`` of the chosen experts
    (pruned with the experts). The experts get a separately normed copy of the same tokens. Masking: logit -inf
    (probability 0, the softmax as without the expert); the route returns the probabilities, as the router does."""

    routing = "RMS-normed input, softmax, top-k, renormalised, times per_expert_scale"
    model_types = ("gemma4_text",)
    mlp_attr = ""
    router_attr = "router"
    router_weight_attr = "proj"
    router_sub_tensors = (("", "per_expert_scale", 0),)

    def is_sparse_layer(self, index: int) -> bool:
        return bool(self.text_config.enable_moe_block)

    def top_k(self) -> int:
        return int(self.text_config.top_k_experts)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        hidden_states = router.norm(hidden_states.reshape(-1, router.hidden_size))
        return router.proj(hidden_states * router.scale * router.scalar_root_size)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        probabilities = torch.softmax(_mask_logits(router_logits, expert_mask), dim=-1, dtype=torch.float32)
        top_weights, top_index = torch.topk(probabilities, k=layer.top_k, dim=-1)
        top_weights /= top_weights.sum(dim=-1, keepdim=True)
        return probabilities, top_weights * layer.router.per_expert_scale[top_index], top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An unselected expert's removal changes nothing: top-k of the softmax, renormalised over the k."""
        return selected, None


class Gemma4Family(Gemma4TextFamily):
    """Gemma 4 MLLM (``gemma4``): its Gemma 4 language model, with image and video placeholders."""

    model_types = ("gemma4",)
    multimodal = True

    def vision_token_ids(self) -> tuple[int, ...]:
        """``image_token_id`` and ``video_token_id`` of the top-level config (audio placeholders are not vision)."""
        return _config_ids(self.config, ("image_token_id", "video_token_id"))


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

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states.reshape(-1, layer.router.weight.shape[1]), layer.router.weight)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = _mask_logits(router_logits, expert_mask)
        top_logits, top_index = torch.topk(router_logits, layer.top_k, dim=-1)
        return router_logits, F.softmax(top_logits, dim=-1), top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An unselected expert's removal changes nothing: top-k of the logits, softmax over the k."""
        return selected, None


class HunYuanMoEV1Family(MoEFamily):
    """Hunyuan-A13B (``hunyuan_v1_moe``): every layer sparse, a shared MLP beside the experts; the router keeps its
    weight in ``gate.wg`` (fp32: the hidden states are cast up), softmax in fp32, top-k (``moe_topk``, one per layer
    when a list), renormalised, cast to the logits' dtype (HunYuanMoEV1Gate). Masking: logit -inf."""

    routing = "softmax of fp32 logits, top-k, renormalised"
    model_types = ("hunyuan_v1_moe",)
    router_weight_attr = "wg"
    shared_attrs = ("shared_mlp",)

    def __init__(self, model):
        super().__init__(model)
        if not isinstance(self.text_config.num_experts, int):
            raise ValueError(f"hunyuan_v1_moe with a per-layer num_experts list {self.text_config.num_experts!r}: "
                             "its experts are built with one count; lightprune prunes an integer num_experts")

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def top_k(self) -> int:
        top_k = self.text_config.moe_topk
        return int(top_k if isinstance(top_k, int) else max(top_k))

    def layer_top_k(self, index: int) -> int:
        top_k = self.text_config.moe_topk
        return int(top_k if isinstance(top_k, int) else top_k[index])

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        wg = layer.router.wg
        hidden_states = hidden_states.reshape(-1, hidden_states.shape[-1])
        if wg.weight.dtype == torch.float32:
            hidden_states = hidden_states.float()
        return wg(hidden_states)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = _mask_logits(router_logits, expert_mask)
        weights = F.softmax(router_logits, dim=1, dtype=torch.float)
        weights, top_index = torch.topk(weights, layer.top_k, dim=-1)
        weights /= weights.sum(dim=-1, keepdim=True)
        return router_logits, weights.to(router_logits.dtype), top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An unselected expert's removal changes nothing: top-k of the softmax, renormalised over the k."""
        return selected, None


class PhimoeFamily(MoEFamily):
    """Phi-3.5-MoE (``phimoe``): every layer sparse; the router's logits go through sparsemixer (arXiv 2409.12136):
    in eval, the best expert, then the best of the rest, each weighted by a softmax over the experts within
    ``2 * router_jitter_noise`` (relative) of it; two experts whatever ``num_experts_per_tok`` says, not
    renormalised. transformers' own ``sparsemixer`` runs on the masked logits: a pruned expert's logit is -inf, so
    it is never chosen and drops out of both softmaxes and thresholds, exactly as if removed. In training mode
    sparsemixer samples (Gumbel), as the model does."""

    routing = "sparsemixer: two experts, each a thresholded softmax"
    model_types = ("phimoe",)
    num_experts_key = "num_local_experts"
    router_attr = "router"

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def top_k(self) -> int:
        return 2  # sparsemixer's fixed choice of two

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states.reshape(-1, layer.router.weight.shape[1]), layer.router.weight,
                        layer.router.bias)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        from transformers.models.phimoe.modeling_phimoe import sparsemixer

        router = layer.router
        router_logits = _mask_logits(router_logits, expert_mask)
        weights, top_index = sparsemixer(router_logits, jitter_eps=router.router_jitter_noise,
                                         training=router.training, top_k=2)
        return router_logits, weights, top_index


class LagunaFamily(MoEFamily):
    """Laguna (``laguna``): fp32 logits, optionally soft-capped (``moe_router_logit_softcapping``), sigmoid, top-k of
    the scores plus the router's ``e_score_correction_bias``, renormalised, cast to the hidden states' dtype
    (LagunaTopKRouter); the block multiplies the routed sum by ``moe_routed_scaling_factor`` after the experts;
    sparse layers from ``mlp_layer_types``; shared experts. Masking sets the soft-capped logit to -inf (a cap of
    -inf would be finite) and the selection score to -inf."""

    routing = "(soft-capped) sigmoid + correction bias, top-k, renormalised; routed sum scaled"
    model_types = ("laguna",)
    score_function = "sigmoid"
    shared_attrs = ("shared_experts",)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        logits = F.linear(hidden_states.reshape(-1, router.weight.shape[1]), router.weight).float()
        if router.router_logit_softcapping > 0.0:
            logits = torch.tanh(logits / router.router_logit_softcapping) * router.router_logit_softcapping
        return logits

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router = layer.router
        router_logits = _mask_logits(router_logits, expert_mask)
        scores = torch.sigmoid(router_logits)
        choice = _masked_choice(scores, router.e_score_correction_bias.to(scores.dtype), expert_mask)
        top_index = torch.topk(choice, layer.top_k, dim=-1)[1]
        weights = scores.gather(-1, top_index)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return router_logits, weights.to(router.weight.dtype), top_index

    def output_scale(self, layer: MoELayer) -> float:
        return float(layer.block.routed_scaling_factor)

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An unselected expert's removal changes nothing: per-expert sigmoid scores, renormalised over the k."""
        return selected, None


def _masked_choice(scores: torch.Tensor, bias: torch.Tensor | None,
                   expert_mask: torch.Tensor | None) -> torch.Tensor:
    """Selection scores ``scores + bias`` (``scores`` without a bias) with the masked experts at -inf."""
    choice = scores if bias is None else scores + bias
    if expert_mask is not None:
        choice = choice.masked_fill(expert_mask.to(choice.device), float("-inf"))
    return choice


class MiniMaxM2Family(MoEFamily):
    """MiniMax-M2 (``minimax_m2``): every layer sparse; sigmoid of the fp32 logits, top-k of the scores plus the
    block's ``e_score_correction_bias`` (passed to the router, pruned with the experts), the k scores renormalised
    (MiniMaxM2TopKRouter). Masking: logit -inf (score 0) and selection score -inf."""

    routing = "sigmoid + block's correction bias, top-k, renormalised"
    model_types = ("minimax_m2",)
    num_experts_key = "num_local_experts"
    score_function = "sigmoid"
    block_sub_tensors = (("", "e_score_correction_bias", 0),)

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = layer.router.weight
        return F.linear(hidden_states.reshape(-1, weight.shape[1]).to(weight.dtype), weight)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = _mask_logits(router_logits, expert_mask)
        weights = torch.sigmoid(router_logits.float())
        choice = _masked_choice(weights, self.selection_bias(layer), expert_mask)
        top_index = torch.topk(choice, layer.top_k, dim=-1, sorted=False)[1]
        top = weights.gather(1, top_index)
        top /= top.sum(dim=-1, keepdim=True)
        return router_logits, top, top_index

    def selection_bias(self, layer: MoELayer) -> torch.Tensor:
        """The correction bias added to the scores for selection only (MiniMax-M2: the block's)."""
        return layer.block.e_score_correction_bias

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An unselected expert's removal changes nothing: per-expert sigmoid scores, renormalised over the k."""
        return selected, None


class MiniMaxM3VLTextFamily(MiniMaxM2Family):
    """MiniMax-M3-VL's language model (``minimax_m3_vl_text``): MiniMax-M2's router with the correction bias on the
    router (pruned with its rows), shared experts, the routed sum times ``routed_scaling_factor`` in the block;
    sparse layers from ``mlp_layer_types``."""

    routing = "sigmoid + correction bias, top-k, renormalised; routed sum scaled"
    model_types = ("minimax_m3_vl_text",)
    shared_attrs = ("shared_experts",)
    block_sub_tensors = ()
    is_sparse_layer = MoEFamily.is_sparse_layer

    def selection_bias(self, layer: MoELayer) -> torch.Tensor:
        return layer.router.e_score_correction_bias

    def output_scale(self, layer: MoELayer) -> float:
        return float(layer.block.routed_scaling_factor)


class HYV3Family(MoEFamily):
    """Hunyuan 3 (``hy_v3``): sigmoid of fp32 logits, top-k of the scores plus the block's
    ``e_score_correction_bias``, renormalised (+1e-20), times ``router_scaling_factor`` (HYV3TopKRouter); sparse
    layers from ``mlp_layer_types``; shared experts. Masking: logit -inf and selection score -inf."""

    routing = "sigmoid + block's correction bias, top-k, renormalised, scaled"
    model_types = ("hy_v3",)
    score_function = "sigmoid"
    shared_attrs = ("shared_experts",)
    block_sub_tensors = (("", "e_score_correction_bias", 0),)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = layer.router.weight
        return F.linear(hidden_states.reshape(-1, weight.shape[1]).float(), weight.float())

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = _mask_logits(router_logits, expert_mask)
        weights = torch.sigmoid(router_logits)
        choice = _masked_choice(weights, layer.block.e_score_correction_bias, expert_mask)
        top_index = torch.topk(choice, layer.top_k, dim=-1, sorted=False)[1]
        top = weights.gather(1, top_index)
        top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        return router_logits, top * layer.router.router_scaling_factor, top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An unselected expert's removal changes nothing: per-expert sigmoid scores, renormalised over the k."""
        return selected, None


class AfmoeFamily(MoEFamily):
    """AFMoE (``afmoe``): the router module keeps its linear in ``router.gate``; fp32 logits, sigmoid, top-k of the
    scores plus the block's ``expert_bias``, renormalised (+1e-20), times ``route_scale`` (AfmoeTokenChoiceRouter);
    layers from ``num_dense_layers`` on are sparse; shared experts. Masking: logit -inf and selection score -inf."""

    routing = "sigmoid + block's expert bias, top-k, renormalised, scaled"
    model_types = ("afmoe",)
    router_attr = "router"
    router_weight_attr = "gate"
    score_function = "sigmoid"
    shared_attrs = ("shared_experts",)
    block_sub_tensors = (("", "expert_bias", 0),)

    def is_sparse_layer(self, index: int) -> bool:
        return index >= int(self.text_config.num_dense_layers)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        gate = layer.router.gate
        return gate(hidden_states.reshape(-1, hidden_states.shape[-1])).to(torch.float32)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits = _mask_logits(router_logits, expert_mask)
        scores = torch.sigmoid(router_logits)
        top_index = torch.topk(_masked_choice(scores, layer.block.expert_bias, expert_mask), k=layer.top_k, dim=1)[1]
        top = scores.gather(dim=1, index=top_index)
        top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        return router_logits, top * layer.router.route_scale, top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An unselected expert's removal changes nothing: per-expert sigmoid scores, renormalised over the k."""
        return selected, None


class Lfm2MoeFamily(MoEFamily):
    """LFM2-MoE (``lfm2_moe``): sigmoid of the logits, top-k of the scores (plus the block's ``expert_bias`` when
    ``use_expert_bias``), renormalised (+1e-6) when ``norm_topk_prob``, times ``routed_scaling_factor``
    (Lfm2MoeTopKRouter); layers from ``num_dense_layers`` on are sparse. Masking: logit -inf, selection -inf."""

    routing = "sigmoid (+ block's expert bias), top-k, renormalised, scaled"
    model_types = ("lfm2_moe",)
    mlp_attr = "feed_forward"
    score_function = "sigmoid"
    block_sub_tensors = (("", "expert_bias", 0),)

    def is_sparse_layer(self, index: int) -> bool:
        return index >= int(self.text_config.num_dense_layers)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden_states.reshape(-1, layer.router.weight.shape[1]), layer.router.weight)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router, cfg = layer.router, self.text_config
        router_logits = _mask_logits(router_logits, expert_mask)
        weights = router_logits.sigmoid()
        if router.use_expert_bias:
            top_index = torch.topk(_masked_choice(weights, layer.block.expert_bias, expert_mask), k=layer.top_k,
                                   dim=-1)[1]
            weights = torch.gather(weights, dim=1, index=top_index).type_as(router_logits)
        elif expert_mask is None:
            weights, top_index = torch.topk(weights, k=layer.top_k, dim=-1)
        else:  # a masked expert's score is 0, never above a kept one's: select on -inf to be exact
            top_index = torch.topk(_masked_choice(weights, None, expert_mask), k=layer.top_k, dim=-1)[1]
            weights = torch.gather(weights, dim=1, index=top_index)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-6)
        return router_logits, weights * router.routed_scaling_factor, top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor,
                       selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """An unselected expert's removal changes nothing: per-expert sigmoid scores, the k renormalised or not."""
        return selected, None


def _alike(base: type[MoEFamily], model_type: str, doc: str, count_key: str | None = None) -> type[MoEFamily]:
    """A family of ``model_type`` that routes exactly as ``base`` (its transformers router's forward is ``base``'s);
    ``count_key``: the config field counting routed experts, when it is not ``base``'s."""
    name = "".join(part.capitalize() for part in model_type.split("_")) + "Family"
    attrs = {"model_types": (model_type,), "__doc__": doc, "__module__": __name__}
    if count_key is not None:
        attrs["num_experts_key"] = count_key
    return type(name, (base,), attrs)


#: families whose transformers router computes what DeepSeek-V3's does (its forward, line for line), with
#: DeepSeek-V3's attribute names; the dense-layer rule is first_k_dense_replace or the config's mlp_layer_types
DEEPSEEK_ALIKE: tuple[type[MoEFamily], ...] = tuple(
    _alike(DeepseekV3Family, t, f"``{t}``: DeepSeek-V3's router (sigmoid, correction bias, groups, scaling).", key)
    for t, key in (("exaone_moe", "num_experts"), ("solar_open", None), ("mimo_v2_flash", None), ("hy_v4", None),
                   ("deepseek_v32", None), ("glm_moe_dsa", None), ("glm4_moe_lite", None), ("axk1", None),
                   ("kimi_linear", "num_local_experts"), ("bailing_hybrid", "num_local_experts")))
MellumFamily = _alike(OlmoeFamily, "mellum", "``mellum``: OLMoE's router.")
Qwen3NextFamily = _alike(Qwen2MoeFamily, "qwen3_next",
                         "``qwen3_next``: Qwen2-MoE's router and shared expert with its sigmoid gate.")
Qwen4ExpTextFamily = _alike(Qwen2MoeFamily, "qwen4_exp_text",
                            "``qwen4_exp_text``: Qwen2-MoE's router and shared expert with its sigmoid gate (in "
                            "hyper-connected decoder layers with linear and indexed attention).")
Qwen4ExpFamily = type("Qwen4ExpFamily", (Qwen4ExpTextFamily,), {
    "model_types": ("qwen4_exp",), "multimodal": True, "__module__": __name__,
    "__doc__": "``qwen4_exp``: its Qwen4-exp language model (Qwen2-MoE's router), with image and video placeholders.",
    "vision_token_ids": lambda self: _config_ids(self.config, ("image_token_id", "video_token_id"))})
Dots3NoteTextFamily = _alike(DeepseekV3Family, "dots3_note_text",
                             "``dots3_note_text``: DeepSeek-V3's router (sigmoid, correction bias, groups, scaling).")

#: the families lightprune registers itself (:mod:`lightprune.models` does it at import)
BUILT_IN: tuple[type[MoEFamily], ...] = (MixtralFamily, Qwen2MoeFamily, Qwen3MoeFamily, OlmoeFamily, DeepseekV3Family,
                                         Qwen3VLMoeFamily, InternVLFamily, Glm4MoeFamily, Dots1Family, MiniMaxFamily,
                                         FlexOlmoFamily, *DEEPSEEK_ALIKE, MellumFamily, Qwen3NextFamily, GptOssFamily,
                                         GraniteMoeFamily, JambaFamily, Cohere2MoeFamily, Qwen3_5MoeTextFamily,
                                         DeepseekV2Family, Ernie4_5MoeFamily, Gemma4TextFamily, Gemma4Family,
                                         HunYuanMoEV1Family, MiniMaxM2Family, HYV3Family, AfmoeFamily,
                                         Lfm2MoeFamily, Qwen3_5MoeFamily, Qwen3OmniMoeThinkerFamily, Glm4vMoeFamily,
                                         PhimoeFamily, NemotronHFamily, LagunaFamily, AriaTextFamily,
                                         Qwen4ExpTextFamily, Qwen4ExpFamily, Dots3NoteTextFamily,
                                         MiniMaxM3VLTextFamily, KimiK25Family)


#: model types whose structure lightprune cannot prune exactly yet, and why (:func:`registry.refuse_family`)
REFUSED_TYPES: dict[str, str] = {
    "switch_transformers": "an encoder-decoder model whose experts are separate modules (no fused gate_up_proj / "
                           "down_proj); lightprune prunes decoder-only models with fused expert tensors",
    "nllb_moe": "an encoder-decoder model whose experts are separate modules (no fused gate_up_proj / down_proj); "
                "lightprune prunes decoder-only models with fused expert tensors",
    "jetmoe": "a mixture of attention heads besides its MLP experts, which are not stored as fused gate_up_proj / "
              "down_proj tensors",
    "dbrx": "its experts are not stored as per-expert gate_up_proj / down_proj tensors (a layout lightprune's "
            "surgery does not slice yet)",
    "llama4": "its router's sigmoid score scales each expert's input (f_j(s x), every expert run densely) rather "
              "than weighting the expert's output, and its experts do not dispatch through transformers' "
              "ExpertsInterface: lightprune's calibration criteria assume H = sum_j w_j f_j(x)",
    "llama4_text": "its router's sigmoid score scales each expert's input (f_j(s x), every expert run densely) "
                   "rather than weighting the expert's output, and its experts do not dispatch through "
                   "transformers' ExpertsInterface: lightprune's calibration criteria assume H = sum_j w_j f_j(x)",
    "ernie4_5_vl_moe": "each MoE layer holds two expert sets (text_moe and vision_moe, chosen per token by "
                       "moe_mm_token_type_ids); lightprune models one router and one expert set per layer",
    "longcat_flash": "zero-computation (identity) experts share the router with the routed ones ([E + Z] router "
                     "rows and gate_up_proj rows but [E] down_proj rows), and its experts do not dispatch through "
                     "transformers' ExpertsInterface",
    "deepseek_v4": "its first layers route by token id (hash MoE: tid2eid maps a token to fixed experts, so a removed "
                   "expert's tokens cannot be re-routed exactly) and it mixes hyper-connection streams around "
                   "every block",
    "zaya": "its router is an MLP with a state carried from layer to layer and a skip class, with no per-expert "
            "[E, H] router row to prune",
}
