"""One family class per supported model type (selected by ``config.model_type``): the built-in list, the refusals, the
table rows of the MLLMs and the routers of no other module here (ERNIE-4.5, Gemma 4, sparsemixer). The others: softmax
top-k in `softmax_routing`, top-k then softmax in `topk_softmax_families`, DeepSeek-V3's in
`deepseek_families` and `group_limited_families`, DeepSeek-V2's in `deepseek_v2_family`, the biased
sigmoid ones in `sigmoid_families`.

Each class states its routing rule in its docstring and in ``routing``; the table of every registered
family (routing, shared experts, multimodal) and of every refused model type with its reason is generated
by [`lightprune.models.family_table`][..registry.family_table] (docs/extending/family.md shows it). A family that reuses
another's rule says so by subclassing it, or, when it differs from it only in settings, by a row of
`family_row`: the transformers router of each was compared line by line, and
the conformance tests check route == the family's own router bitwise, masked == pruned == reloaded, and the
calibration statistics against brute force.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightprune.models.base import MoEFamily, SelectsKept, SelectsWithExpertTensor
from lightprune.models.dbrx_family import DbrxFamily
from lightprune.models.deepseek_families import (
    DEEPSEEK_ALIKE,
    DeepseekV3Family,
    Dots1Family,
    Dots3NoteTextFamily,
    Glm4MoeFamily,
    Glm4vMoeFamily,
    KimiK25Family,
    MiniCPM5MoeFamily,
    NemotronHFamily,
    Param2MoeFamily,
    SarvamMlaFamily,
    SarvamMoeFamily,
)
from lightprune.models.deepseek_v2_family import DeepseekV2Family
from lightprune.models.ergo_family import ErgoFamily
from lightprune.models.family_rows import family_row
from lightprune.models.group_limited_families import AXK2Family, BeamFamily
from lightprune.models.layer import MoELayer, RoutingOutput, kept_entries
from lightprune.models.llama4_family import Llama4Family, Llama4TextFamily
from lightprune.models.longcat_family import LongcatFlashFamily
from lightprune.models.refusals import REFUSED_TYPES
from lightprune.models.routing_ops import mask_logits, renormalized
from lightprune.models.sigmoid_families import (
    AfmoeFamily,
    FlintFamily,
    HYV3Family,
    Inkling2Family,
    Inkling2LoopFamily,
    Inkling2LoopTextFamily,
    Inkling2TextFamily,
    Kolibri1_1Family,
    Kolibri1Family,
    LagunaFamily,
    Lfm2MoeFamily,
    MiniMaxM2Family,
    MiniMaxM3VLTextFamily,
    MuseSparkFamily,
)
from lightprune.models.softmax_routing import (
    FlexOlmoFamily,
    HunYuanMoEV1Family,
    InternVLFamily,
    JambaFamily,
    LaraMiniFamily,
    MellumFamily,
    MiniMaxFamily,
    Mistral4Family,
    MistralLarge4Family,
    MixtralFamily,
    OlmoeFamily,
    Qwen2MoeFamily,
    Qwen3_5MoeFamily,
    Qwen3_5MoeTextFamily,
    Qwen3MoeFamily,
    Qwen3NextFamily,
    Qwen3OmniMoeThinkerFamily,
    Qwen3VLMoeFamily,
    Qwen4ExpFamily,
    Qwen4ExpTextFamily,
)
from lightprune.models.topk_softmax_families import AriaTextFamily, Cohere2MoeFamily, GptOssFamily, GraniteMoeFamily

__all__ = ["MixtralFamily", "Qwen2MoeFamily", "Qwen3MoeFamily", "OlmoeFamily", "DeepseekV3Family",
           "Qwen3VLMoeFamily", "InternVLFamily", "Glm4MoeFamily", "Dots1Family", "MiniMaxFamily", "FlexOlmoFamily",
           "DEEPSEEK_ALIKE", "MellumFamily", "Qwen3NextFamily", "GptOssFamily", "GraniteMoeFamily",
           "JambaFamily", "Cohere2MoeFamily", "Qwen3_5MoeTextFamily", "DeepseekV2Family", "Ernie4_5MoeFamily",
           "Gemma4TextFamily", "Gemma4Family", "HunYuanMoEV1Family", "MiniMaxM2Family", "HYV3Family", "AfmoeFamily",
           "Lfm2MoeFamily", "Qwen3_5MoeFamily", "Qwen3OmniMoeThinkerFamily", "Glm4vMoeFamily", "PhimoeFamily",
           "NemotronHFamily", "LagunaFamily", "AriaTextFamily", "Qwen4ExpTextFamily", "Qwen4ExpFamily",
           "Dots3NoteTextFamily", "MiniMaxM3VLTextFamily", "KimiK25Family", "MiniCPM5MoeFamily", "LaraMiniFamily",
           "FlintFamily",
           "Kolibri1Family", "BeamFamily", "AXK2Family", "Mistral4Family", "Param2MoeFamily",
           "SarvamMlaFamily", "Kolibri1_1Family",
           "HYV4VLFamily", "Dots3NoteFamily", "DeepseekOcr2Family", "UnlimitedOcrFamily", "AriaFamily",
           "MiniMaxM3VLFamily", "Glm5NextFamily", "MistralLarge4Family", "MLLM_VARIANTS",
           "BUILT_IN",
           "REFUSED_TYPES"]


class Ernie4_5MoeFamily(SelectsKept, MoEFamily):
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

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                kept: torch.Tensor | None) -> RoutingOutput:
        """The rule; ``kept``: the logits are the kept experts' columns, the selection bias taken at ``kept`` and
        added as ``moe_statics`` adds its own (``scores + bias.squeeze()``)."""
        router = layer.router
        if expert_mask is not None:
            expert_mask = expert_mask.to(router_logits.device)
            router_logits = router_logits.masked_fill(expert_mask, float("-inf"))
        weights = torch.softmax(router_logits, dim=1, dtype=torch.float)
        if kept is None:
            choice = router.moe_statics(weights)
        else:
            choice = weights + kept_entries(router.moe_statics.e_score_correction_bias, kept, dim=-1).squeeze()
        if expert_mask is not None:
            choice = choice.masked_fill(expert_mask, float("-inf"))
        top_index = torch.topk(choice, router.top_k, dim=-1)[1]
        top = torch.gather(weights, dim=-1, index=top_index)
        top = top / torch.clamp(top.sum(dim=-1, keepdim=True), min=router.norm_min)
        return router_logits, top.to(layer.experts.down_proj.dtype), top_index


class Gemma4TextFamily(SelectsWithExpertTensor, MoEFamily):
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
    router_returns_logits = False  # Gemma4TextRouter returns the probabilities

    def is_sparse_layer(self, index: int) -> bool:
        return bool(self.text_config.enable_moe_block)

    def top_k(self) -> int:
        return int(self.text_config.top_k_experts)

    def router_logits(self, layer: MoELayer, hidden_states: torch.Tensor) -> torch.Tensor:
        router = layer.router
        hidden_states = router.norm(hidden_states.reshape(-1, router.hidden_size))
        return router.proj(hidden_states * router.scale * router.scalar_root_size)

    def selection_tensor(self, layer: MoELayer) -> torch.Tensor:
        return layer.router.per_expert_scale

    def _select(self, layer: MoELayer, router_logits: torch.Tensor, expert_mask: torch.Tensor | None,
                per_expert_scale: torch.Tensor) -> RoutingOutput:
        probabilities = torch.softmax(mask_logits(router_logits, expert_mask), dim=-1, dtype=torch.float32)
        top_weights, top_index = torch.topk(probabilities, k=layer.top_k, dim=-1)
        return probabilities, renormalized(top_weights) * per_expert_scale[top_index], top_index

    unselected_removal_is_free = True  # top-k of the softmax, renormalised over the k


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
        router_logits = mask_logits(router_logits, expert_mask)
        weights, top_index = sparsemixer(router_logits, jitter_eps=router.router_jitter_noise,
                                         training=router.training, top_k=2)
        return router_logits, weights, top_index


# ------------------------------------------------------------------------------------------------ the table rows
# a family that routes exactly as another one here and differs from it only in settings: one row (family_row)
Gemma4Family = family_row(__name__, Gemma4TextFamily, "gemma4",
                          "Gemma 4 MLLM (``gemma4``): its Gemma 4 language model, with image and video placeholders.",
                          multimodal=True, vision_token_keys=("image_token_id", "video_token_id"))

_IMAGES_AND_VIDEOS = ("image_token_id", "video_token_id")
#: MLLMs whose language model is another family's text model, its router line for line (their image and video
#: placeholders are the vision tokens); each with its text model's type, which the family is exact for
HYV4VLFamily = family_row(__name__, DeepseekV3Family, "hy_v4_vl",
                          "Hy4-VL (``hy_v4_vl``): its language model (``hy_v4_vl_text``) is Hy4's (``hy_v4``) with "
                          "M-RoPE: HYV4VLTopkRouter is DeepSeek-V3's router (sigmoid, correction bias, groups, "
                          "scaling), the MoE layers those ``mlp_layer_types`` says; image and video placeholders.",
                          name="HYV4VLFamily", multimodal=True, language_model_type="hy_v4_vl_text",
                          vision_token_keys=_IMAGES_AND_VIDEOS)
Dots3NoteFamily = family_row(
    __name__, Dots3NoteTextFamily, "dots3_note",
    "dots3-note (``dots3_note``): its language model is ``dots3_note_text`` (Dots3NoteTextModel, DeepSeek-V3's "
    "router); image and video placeholders are its vision tokens, audio ones are not. The vision tower's own MoE "
    "blocks are not decoder layers of the language model and are left as they are.",
    multimodal=True, language_model_type="dots3_note_text", vision_token_keys=_IMAGES_AND_VIDEOS)
DeepseekOcr2Family = family_row(
    __name__, DeepseekV2Family, "deepseek_ocr2",
    "DeepSeek-OCR 2 (``deepseek_ocr2``): its language model (``deepseek_ocr2_text``) routes with "
    "DeepseekOcr2TextTopkRouter, DeepSeek-V2's router line for line (softmax, greedy or group-limited top-k, scaled), "
    "its MoE layers those ``mlp_layer_types`` says; image placeholders are its vision tokens.",
    multimodal=True, language_model_type="deepseek_ocr2_text", vision_token_keys=("image_token_id",))
UnlimitedOcrFamily = family_row(
    __name__, DeepseekV2Family, "unlimited_ocr",
    "Unlimited-OCR (``unlimited_ocr``): its language model (``unlimited_ocr_text``) routes with "
    "UnlimitedOcrTextTopkRouter, DeepSeek-V2's router line for line (softmax, greedy or group-limited top-k, scaled), "
    "its MoE layers those ``mlp_layer_types`` says; image placeholders are its vision tokens.",
    multimodal=True, language_model_type="unlimited_ocr_text", vision_token_keys=("image_token_id",))
AriaFamily = family_row(
    __name__, AriaTextFamily, "aria",
    "Aria (``aria``): its language model is ``aria_text`` (AriaTextModel: AriaTextTopKRouter, every layer sparse, "
    "shared experts); image placeholders are its vision tokens.",
    multimodal=True, language_model_type="aria_text", vision_token_keys=("image_token_id",))
MiniMaxM3VLFamily = family_row(
    __name__, MiniMaxM3VLTextFamily, "minimax_m3_vl",
    "MiniMax-M3 VL (``minimax_m3_vl``): its language model is ``minimax_m3_vl_text`` (MiniMaxM3VLTextModel: "
    "MiniMaxM3VLTopKRouter, sigmoid with the router's correction bias, the routed sum scaled); image and video "
    "placeholders are its vision tokens.",
    name="MiniMaxM3VLFamily", multimodal=True, language_model_type="minimax_m3_vl_text",
    vision_token_keys=_IMAGES_AND_VIDEOS)
Glm5NextFamily = family_row(
    __name__, DeepseekV3Family, "glm5_next",
    "GLM-5 (``glm5_next``): its language model (``glm5_next_text``) routes with Glm5NextTextTopkRouter, DeepSeek-V3's "
    "router line for line (sigmoid of fp32 logits, correction bias, groups, scaling) in the layers ``mlp_layer_types`` "
    "says are sparse; hyper-connected layers, linear and DSA attention; image and video placeholders.",
    multimodal=True, language_model_type="glm5_next_text", vision_token_keys=_IMAGES_AND_VIDEOS)
Step3p7Family = family_row(
    __name__, MiniMaxM3VLTextFamily, "step3p7",
    "Step 3.7 Flash (``step3p7``): its language model (``step3p5``, built inside the MLLM) routes with "
    "Step3p7TopKRouter, MiniMax-M3 VL's router line for line (sigmoid of the logits in the weight's dtype, the "
    "router's correction bias for the choice, top-k unsorted, renormalised), the routed sum times the block's "
    "``routed_scaling_factor``, shared experts; sparse layers from ``mlp_layer_types``; image placeholders. Its "
    "config declares ``num_local_experts`` beside ``n_routed_experts``, the count its experts are built with.",
    multimodal=True, language_model_type="step3p5", num_experts_key="n_routed_experts",
    vision_token_keys=("image_token_id",))
NemotronHOmniFamily = family_row(
    __name__, NemotronHFamily, "nemotron_h_omni",
    "Nemotron-H Omni (``nemotron_h_omni``): its language model is a Nemotron-H causal LM (``nemotron_h``: "
    "NemotronHTopkRouter, DeepSeek-V3's router, the MoE mixers those ``layers_block_type`` says); images and videos "
    "fill the image placeholders (its videos reuse them), audio ones are not vision. Calibrate with "
    "``video_pruning_rate`` 0 (the default): above 0 the model drops video positions inside its forward.",
    name="NemotronHOmniFamily", multimodal=True, language_model_type="nemotron_h",
    vision_token_keys=("image_token_id",))
MLLM_VARIANTS: tuple[type[MoEFamily], ...] = (HYV4VLFamily, Dots3NoteFamily, DeepseekOcr2Family, UnlimitedOcrFamily,
                                              AriaFamily, MiniMaxM3VLFamily, Glm5NextFamily, MistralLarge4Family,
                                              Step3p7Family, NemotronHOmniFamily)

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
                                         MiniMaxM3VLTextFamily, KimiK25Family, *MLLM_VARIANTS,
                                         SarvamMoeFamily, MiniCPM5MoeFamily,
                                         LaraMiniFamily, FlintFamily, Kolibri1Family,
                                         BeamFamily, AXK2Family, Mistral4Family,
                                         Param2MoeFamily, SarvamMlaFamily, Kolibri1_1Family,
                                         Llama4TextFamily, Llama4Family, Inkling2TextFamily, Inkling2Family,
                                         MuseSparkFamily, Inkling2LoopTextFamily, Inkling2LoopFamily, ErgoFamily,
                                         LongcatFlashFamily, DbrxFamily)
