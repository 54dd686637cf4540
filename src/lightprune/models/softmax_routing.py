"""Softmax top-k routing as the transformers 5 softmax families implement it, and those families.

Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, Qwen3-VL-MoE, Jamba, Hunyuan-A13B and the families that route as one of them
share the rule ``p = softmax(W h)``, ``S = top-k(p)``, ``w_S = p_S`` or ``p_S / sum(p_S)`` (renormalised), and
differ only in whether they renormalise and in the dtype of the returned weights. Masking an expert sets its logit
to -inf before the softmax, which is exactly the model with its router row removed (MAEP ("Modality-Aware Expert
Pruning for MoE-Based Multimodal Large Language Models", arXiv 2611.05927), section 3). Removals have a closed form
(`softmax_topk_removal`). Mistral 4 and Mistral Large 4 add a group limit to the softmax (groups scored by their
top-2 probabilities), with DeepSeek-V3's dense-layer rule.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from lightprune.models.base import MoEFamily, RemovalEffect
from lightprune.models.deepseek_families import DeepseekV3Family
from lightprune.models.deepseek_v3_routing import RENORM_EPS
from lightprune.models.family_rows import family_row
from lightprune.models.layer import MoELayer, RoutingOutput
from lightprune.models.routing_ops import (
    chosen_group_leaders,
    group_limited_top_k,
    mask_logits,
    renormalized,
    softmax_removal_growth,
    softmax_topk_removal,
)

__all__ = ["softmax_topk_select", "MixtralFamily", "OlmoeFamily", "Qwen2MoeFamily", "Qwen3MoeFamily",
           "Qwen3VLMoeFamily", "Qwen3OmniMoeThinkerFamily", "InternVLFamily", "MiniMaxFamily", "FlexOlmoFamily",
           "Qwen3_5MoeTextFamily", "Qwen3_5MoeFamily", "MellumFamily", "Qwen3NextFamily", "Qwen4ExpTextFamily",
           "Qwen4ExpFamily", "LaraMiniFamily", "JambaFamily", "HunYuanMoEV1Family", "Mistral4Family",
           "MistralLarge4Family"]


def softmax_topk_select(router_logits: torch.Tensor, expert_mask: torch.Tensor | None, top_k: int,
                        renormalize: bool, cast_back: bool) -> RoutingOutput:
    """The softmax families' selection from logits, op for op.

    ``expert_mask`` is [E] or broadcastable to the logits (one mask per token row).
    ``cast_back``: Qwen / OLMoE cast the selected weights back to the logits' dtype; Mixtral keeps fp32.
    """
    if expert_mask is not None:
        router_logits = router_logits.masked_fill(expert_mask.to(router_logits.device), float("-inf"))
    router_probs = F.softmax(router_logits, dtype=torch.float, dim=-1)
    top_value, top_index = torch.topk(router_probs, top_k, dim=-1)
    if renormalize:
        top_value = renormalized(top_value)
    if cast_back:
        top_value = top_value.to(router_logits.dtype)
    return router_logits, top_value, top_index


class _SoftmaxFamily(MoEFamily):
    """Softmax top-k (`softmax_topk_select`), renormalised when the config's ``norm_topk_prob`` (True when absent) or
    always (``renormalize_always``)."""

    cast_back: ClassVar[bool] = True
    #: True: the router renormalises whatever the config says (Mixtral, Qwen3-VL-MoE, Qwen3.5-MoE)
    renormalize_always: ClassVar[bool] = False
    routing = "softmax, top-k, renormalised when norm_topk_prob"

    def renormalize(self) -> bool:
        return self.renormalize_always or bool(getattr(self.text_config, "norm_topk_prob", True))

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        return softmax_topk_select(router_logits, expert_mask, layer.top_k, self.renormalize(), self.cast_back)

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor, selected: torch.Tensor,
                       routing_state: Any = None) -> RemovalEffect:
        """Softmax top-k in closed form (`lightprune.models.routing_ops.softmax_topk_removal`)."""
        return softmax_topk_removal(router_logits, selected, self.renormalize())


class MixtralFamily(_SoftmaxFamily):
    """Mixtral (``mixtral``): softmax of fp32 logits, top-k, always renormalised, the weights kept in fp32; every
    layer sparse."""

    routing = "softmax of fp32 logits, top-k, renormalised"
    model_types = ("mixtral",)
    num_experts_key = "num_local_experts"
    cast_back = False
    renormalize_always = True

    def is_sparse_layer(self, index: int) -> bool:
        return True


class OlmoeFamily(_SoftmaxFamily):
    """OLMoE (``olmoe``): softmax, top-k, ``norm_topk_prob``; every layer sparse."""

    model_types = ("olmoe",)

    def is_sparse_layer(self, index: int) -> bool:
        return True


class LaraMiniFamily(_SoftmaxFamily):
    """Lara Mini (``lara_mini``): fp32 logits (hidden states and weight cast up), softmax, top-k, renormalised when
    ``norm_topk_prob``, cast to the hidden states' dtype (LaraMiniTopKRouter); every layer sparse, a shared expert
    added ungated."""

    routing = "softmax of fp32 logits, top-k, renormalised when norm_topk_prob"
    model_types = ("lara_mini",)
    shared_attrs = ("shared_expert",)

    def is_sparse_layer(self, index: int) -> bool:
        return True

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        return F.linear(hidden_states.reshape(-1, router.weight.shape[1]).float(), router.weight.float())

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router_logits, weights, top_index = softmax_topk_select(router_logits, expert_mask, layer.top_k,
                                                                self.renormalize(), cast_back=False)
        return router_logits, weights.to(layer.router.weight.dtype), top_index


class JambaFamily(_SoftmaxFamily):
    """Jamba: softmax of fp32 logits, top-k, no renormalisation, cast to the hidden states' dtype; an MoE block in
    layer i when ``i % expert_layer_period == expert_layer_offset`` (``config.layers_num_experts``)."""

    routing = "softmax, top-k, not renormalised"
    model_types = ("jamba",)
    mlp_attr = "feed_forward"
    router_attr = "router"

    def is_sparse_layer(self, index: int) -> bool:
        cfg = self.text_config
        return int(cfg.num_experts) > 1 and index % cfg.expert_layer_period == cfg.expert_layer_offset

    def renormalize(self) -> bool:
        return False  # whatever the config says (the closed form of softmax_topk_removal without renormalising)


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
        return softmax_topk_select(router_logits, expert_mask, layer.top_k, renormalize=True, cast_back=True)

    unselected_removal_is_free = True  # top-k of the softmax, renormalised over the k


# ------------------------------------------------------------------------------------------------ the table rows
# families that route exactly as one above and differ from it only in settings: one row each (family_row)
_IMAGES_AND_VIDEOS = ("image_token_id", "video_token_id")

Qwen2MoeFamily = family_row(__name__, _SoftmaxFamily, "qwen2_moe",
                            "Qwen2-MoE (``qwen2_moe``): softmax, top-k, ``norm_topk_prob``; a shared expert.",
                            shared_attrs=("shared_expert",))
Qwen3MoeFamily = family_row(__name__, _SoftmaxFamily, "qwen3_moe",
                            "Qwen3-MoE (``qwen3_moe``): softmax, top-k, ``norm_topk_prob``.")
Qwen3VLMoeFamily = family_row(__name__, _SoftmaxFamily, "qwen3_vl_moe",
                              "Qwen3-VL-MoE (``qwen3_vl_moe``): softmax, top-k, always renormalised; image and video "
                              "placeholders.", name="Qwen3VLMoeFamily", routing="softmax, top-k, renormalised",
                              multimodal=True, renormalize_always=True, vision_token_keys=_IMAGES_AND_VIDEOS)
Qwen3OmniMoeThinkerFamily = family_row(
    __name__, _SoftmaxFamily, "qwen3_omni_moe_thinker",
    "Qwen3-Omni's thinker (``qwen3_omni_moe_thinker``): a Qwen3-MoE language model (softmax, top-k, "
    "``norm_topk_prob``) reading text, image, video and audio; images and videos are its vision tokens.",
    multimodal=True, vision_token_keys=_IMAGES_AND_VIDEOS)
InternVLFamily = family_row(__name__, _SoftmaxFamily, "internvl",
                            "InternVL (``internvl``) with a Qwen3-MoE language model (softmax, top-k, "
                            "``norm_topk_prob``); image placeholders.", name="InternVLFamily", multimodal=True,
                            language_model_type="qwen3_moe", vision_token_keys=("image_token_id",))
MiniMaxFamily = family_row(__name__, MixtralFamily, "minimax",
                           "MiniMax-Text-01 (``minimax``): Mixtral's router (softmax of fp32 logits, top-k, "
                           "renormalised) in every layer, whatever its attention type.", name="MiniMaxFamily")
FlexOlmoFamily = family_row(__name__, OlmoeFamily, "flex_olmo", "FlexOlmo (``flex_olmo``): OLMoE's router.")
Qwen3_5MoeTextFamily = family_row(__name__, Qwen2MoeFamily, "qwen3_5_moe_text",
                                  "Qwen3.5-MoE's language model (``qwen3_5_moe_text``): Qwen2-MoE's block, its router "
                                  "always renormalised.", name="Qwen3_5MoeTextFamily",
                                  routing="softmax, top-k, renormalised", renormalize_always=True)
Qwen3_5MoeFamily = family_row(__name__, Qwen3_5MoeTextFamily, "qwen3_5_moe",
                              "Qwen3.5-MoE MLLM (``qwen3_5_moe``): its Qwen3.5-MoE language model, with image and "
                              "video placeholders.", name="Qwen3_5MoeFamily", multimodal=True,
                              vision_token_keys=_IMAGES_AND_VIDEOS)
MellumFamily = family_row(__name__, OlmoeFamily, "mellum", "``mellum``: OLMoE's router.")
Qwen3NextFamily = family_row(__name__, Qwen2MoeFamily, "qwen3_next",
                             "``qwen3_next``: Qwen2-MoE's router and shared expert with its sigmoid gate.")
Qwen4ExpTextFamily = family_row(__name__, Qwen2MoeFamily, "qwen4_exp_text",
                                "``qwen4_exp_text``: Qwen2-MoE's router and shared expert with its sigmoid gate (in "
                                "hyper-connected decoder layers with linear and indexed attention).")
Qwen4ExpFamily = family_row(__name__, Qwen4ExpTextFamily, "qwen4_exp",
                            "``qwen4_exp``: its Qwen4-exp language model (Qwen2-MoE's router), with image and video "
                            "placeholders.", multimodal=True, vision_token_keys=_IMAGES_AND_VIDEOS)


class Mistral4Family(MoEFamily):
    """Mistral 4 (``mistral4``): softmax of the logits (in their dtype) over all experts, groups scored by the sum of
    their top-2 probabilities, ``topk_group`` groups kept (the others' probabilities set to 0 for the choice), top-k,
    the k probabilities renormalised (+1e-20) when ``norm_topk_prob``, times ``routed_scaling_factor``
    (Mistral4TopkRouter); no selection bias. Masking sets a pruned expert's logit to -inf (probability 0, the softmax's
    denominator as without it) and its selection score to -inf, so it is never chosen."""

    routing = "softmax, group-limited (top-2 sums) top-k, renormalised, scaled"
    model_types = ("mistral4",)
    num_experts_key = "n_routed_experts"
    shared_attrs = ("shared_experts",)
    group_limited = True
    #: True: the router computes fp32 logits from an fp32 weight (Mistral Large 4)
    fp32_logits = False
    #: True: the router renormalises whatever the config says (Mistral Large 4)
    renormalize_always = False

    is_sparse_layer = DeepseekV3Family.is_sparse_layer  # the same dense-layer rule
    group_limits = DeepseekV3Family.group_limits

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        hidden_states = hidden_states.view(-1, router.weight.shape[1])
        if self.fp32_logits:
            return F.linear(hidden_states.float(), router.weight.float())
        return F.linear(hidden_states, router.weight)

    def renormalize(self, layer: MoELayer) -> bool:
        return self.renormalize_always or bool(layer.router.norm_topk_prob)

    def select(self, layer: MoELayer, router_logits: torch.Tensor,
               expert_mask: torch.Tensor | None = None) -> RoutingOutput:
        router = layer.router
        router_logits = mask_logits(router_logits, expert_mask)
        scores = router_logits.softmax(-1)
        top_index = group_limited_top_k(scores, router.num_group, router.topk_group, router.top_k, fill=0.0,
                                        expert_mask=expert_mask)
        top_weights = scores.gather(1, top_index)
        if self.renormalize(layer):
            top_weights = renormalized(top_weights, RENORM_EPS)
        return router_logits, top_weights * router.routed_scaling_factor, top_index

    def removal_effect(self, layer: MoELayer, router_logits: torch.Tensor, selected: torch.Tensor,
                       routing_state: Any = None) -> RemovalEffect:
        """Softmax over all experts: removing an unselected expert j scales every probability by 1 / (1 - p_j), which
        keeps each group's top-2 sum in order and the top-k within the chosen groups; the selected weights grow by
        that factor unless renormalised. A chosen group's top-2 expert lowers its group's score: a candidate too."""
        router = layer.router
        growth = None if self.renormalize(layer) else softmax_removal_growth(router_logits)
        if router.num_group <= router.topk_group:
            return RemovalEffect(rerun=selected, growth=growth)
        leaders = chosen_group_leaders(router_logits.softmax(-1), router.num_group, router.topk_group, selected,
                                       sorted=False)
        return RemovalEffect(rerun=leaders, growth=growth)


MistralLarge4Family = family_row(
    __name__, Mistral4Family, "mistral_large4",
    "Mistral Large 4 (``mistral_large4``): its language model (``mistral_large4_text``) routes with "
    "MistralLarge4TextTopkRouter, Mistral 4's router line for line but for fp32 logits (the hidden states and the "
    "fp32 weight cast to fp32) and the top-k always renormalised (+1e-20); the MoE layers those ``mlp_layer_types`` "
    "says; image placeholders (Pixtral vision tower) are its vision tokens.",
    multimodal=True, language_model_type="mistral_large4_text", vision_token_keys=("image_token_id",),
    fp32_logits=True, renormalize_always=True)
