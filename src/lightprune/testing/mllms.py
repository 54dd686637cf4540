"""Tiny configs of the multimodal families: the MoE MLLMs (vision towers as small as the text models) and the dense
MLLMs of MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"); `lightprune.testing.tiny`
is the public entry."""

from __future__ import annotations

from typing import Any

from lightprune.testing.text import (
    _ATTN,
    _GEMMA4_TEXT,
    _GENERIC_FAMILIES,
    _MLA,
    _deepseek_v3,
    _generic,
    _sparse_after_first,
)

__all__ = ["MLLM_BUILDERS", "DENSE_BUILDERS"]

#: a Qwen-VL-style vision tower: one block, 4-pixel patches merged 2 x 2, frames in pairs
_QWEN_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32,
                "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2}
def _mrope(**extra: Any) -> dict[str, Any]:
    """Interleaved M-RoPE over (time, height, width) for head_dim 8 (a fresh dict: configs may normalise it)."""
    return {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1], "mrope_interleaved": True,
            **extra}
#: image / video placeholders and the markers around a Qwen-VL-style image
_QWEN_IDS = {"image_token_id": 120, "video_token_id": 121, "vision_start_token_id": 122, "vision_end_token_id": 123}


def _mllm(config_class, text: dict[str, Any], vision: dict[str, Any], kw: dict[str, Any], **top: Any):
    """``config_class`` of an MLLM from its tiny ``text`` and ``vision`` sub-configs, with ``kw``'s ``text_config``
    / ``vision_config`` entries merged into them and its other keys set on the top-level config."""
    text = {**text, **kw.pop("text_config", {})}
    vision = {**vision, **kw.pop("vision_config", {})}
    return config_class(text_config=text, vision_config=vision, tie_word_embeddings=False, **top, **kw)


def _qwen3_vl_moe(**kw: Any):
    from transformers import Qwen3VLMoeConfig

    text = {**_ATTN, "num_hidden_layers": 2, "intermediate_size": 24, "moe_intermediate_size": 16,
            "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "rope_parameters": _mrope()}
    vision = {**_QWEN_VISION, "num_position_embeddings": 16, "deepstack_visual_indexes": []}
    return _mllm(Qwen3VLMoeConfig, text, vision, kw, **_QWEN_IDS)


def _qwen3_5_moe(**kw: Any):
    from transformers import Qwen3_5MoeConfig

    text = {**_ATTN, "num_hidden_layers": 2, "intermediate_size": 24, "moe_intermediate_size": 16,
            "shared_expert_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2,
            "layer_types": ["linear_attention", "full_attention"], "linear_num_value_heads": 4,
            "linear_num_key_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
            "linear_conv_kernel_dim": 2, "rope_parameters": _mrope(partial_rotary_factor=1.0)}
    return _mllm(Qwen3_5MoeConfig, text, {**_QWEN_VISION, "num_position_embeddings": 16}, kw, **_QWEN_IDS)


def _qwen4_exp(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    text = {**_ATTN, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "num_experts": 8,
            "num_experts_per_tok": 2, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
            **_GENERIC_FAMILIES["qwen4_exp_text"], "rope_parameters": _mrope()}
    return _mllm(CONFIG_MAPPING["qwen4_exp"], text, {**_QWEN_VISION, "num_position_embeddings": 16}, kw, **_QWEN_IDS)


def _kimi_k25(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    text = {"model_type": "deepseek_v3", **_deepseek_v3().to_dict()}
    vision = {"patch_size": 4, "pos_emb_height": 8, "pos_emb_width": 8, "pos_emb_time": 2, "num_attention_heads": 2,
              "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 32, "merge_kernel_size": [2, 2]}
    return _mllm(CONFIG_MAPPING["kimi_k25"], text, vision, kw, projection_hidden_size=32, **_QWEN_IDS)


def _hy_v4_vl(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # Hy4's tiny language model with M-RoPE over its 8 rotary dimensions; its sparse-attention indexer keeps 4 keys
    # per query, fewer than a tiny image batch has
    text = _generic("hy_v4_vl_text", **_sparse_after_first(), index_topk=4, index_n_heads=2, index_head_dim=16,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]})
    # 4-pixel patches merged 2 x 2, a newline token after every merged row
    vision = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "out_hidden_size": 32, "patch_size": 4, "spatial_merge_size": 2, "max_image_size": 16}
    return _mllm(CONFIG_MAPPING["hy_v4_vl"], text.to_dict(), vision, kw, image_token_id=120, video_token_id=121)


def _dots3_note(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    text = _generic("dots3_note_text", **_GENERIC_FAMILIES["dots3_note_text"])
    # a dense vision block, then one with 4 routed vision experts (not the language model's: never pruned)
    vision = {"hidden_size": 32, "intermediate_size": 32, "moe_intermediate_size": 16, "num_hidden_layers": 2,
              "num_attention_heads": 2, "patch_size": 4, "spatial_merge_size": 2, "adapter_in_dim": 32,
              "adapter_out_dim": 32, "adapter_merge_size": 2, "pyramid_num_routed": [-1, 4]}
    audio = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
             "feature_size": 16, "downsample_hidden_size": 8, "adapter_input_size": 32, "adapter_out_dim": 32}
    return _mllm(CONFIG_MAPPING["dots3_note"], text.to_dict(), vision, kw, audio_config=audio, image_token_id=120,
                 video_token_id=121, audio_token_id=122)


#: DeepSeek-OCR 2's vision tower: a SAM encoder (32-pixel images, 4-pixel patches, 4 x 4 downsampled to 2 x 2)
#: whose features and 144 learned queries run through a one-layer encoder; every image is its 144 query features and
#: a view separator, 145 placeholders
_OCR2_VISION = {"sam_config": {"hidden_size": 32, "output_channels": 16, "num_hidden_layers": 2,
                               "num_attention_heads": 2, "image_size": 32, "patch_size": 4, "window_size": 4,
                               "global_attn_indexes": [1], "mlp_dim": 32, "downsample_channels": [16, 32]},
                "encoder_config": {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
                                   "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 16}}


def _deepseek_ocr2(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # DeepSeek-V2's router, group-limited (2 groups, 1 kept), multi-head attention; the first layer dense
    text = _generic("deepseek_ocr2_text", **_sparse_after_first(num_key_value_heads=4),
                    topk_method="group_limited_greedy")
    return _mllm(CONFIG_MAPPING["deepseek_ocr2"], text.to_dict(), _OCR2_VISION, kw, image_token_id=120)


#: Unlimited-OCR's vision tower: a SAM encoder (48-pixel images, 4-pixel patches, 12 x 12 downsampled to 3 x 3) and a
#: one-layer CLIP encoder on its features; every image is 3 rows of 3 features and a newline, then a view separator
_UNLIMITED_OCR_VISION = {
    "sam_config": {"hidden_size": 32, "output_channels": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "image_size": 48, "patch_size": 4, "window_size": 4, "global_attn_indexes": [1], "mlp_dim": 32,
                   "downsample_channels": [16, 32]},
    "encoder_config": {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 16, "patch_size": 4}}


def _unlimited_ocr(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # DeepSeek-V2's router, group-limited (2 groups, 1 kept), multi-head attention; the first layer dense
    text = _generic("unlimited_ocr_text", **_sparse_after_first(num_key_value_heads=4),
                    topk_method="group_limited_greedy")
    return _mllm(CONFIG_MAPPING["unlimited_ocr"], text.to_dict(), _UNLIMITED_OCR_VISION, kw, image_token_id=120)


def _aria(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # an Idefics3 vision tower (16-pixel images, 4-pixel patches: 16 patches), whose features the projector's
    # cross-attention reads into 6 learned queries: 6 placeholders per image
    text = _generic("aria_text", **_GENERIC_FAMILIES["aria_text"])
    vision = {"model_type": "idefics3_vision", "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "image_size": 16, "patch_size": 4}
    return _mllm(CONFIG_MAPPING["aria"], text.to_dict(), vision, kw, image_token_index=120,
                 projector_patch_to_query_dict={16: 6})


def _minimax_m3_vl(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # a Qwen-VL-style tower: 4-pixel patches in frame pairs, merged 2 x 2 by the projector
    text = _generic("minimax_m3_vl_text", **_GENERIC_FAMILIES["minimax_m3_vl_text"])
    vision = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 16, "patch_size": 4, "temporal_patch_size": 2, "spatial_merge_size": 2}
    return _mllm(CONFIG_MAPPING["minimax_m3_vl"], text.to_dict(), vision, kw, image_token_index=120,
                 video_token_index=121, projector_hidden_size=32)


def _glm5_next(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # GLM-5: hyper-connected layers (2 streams), a linear-attention layer, then two DSA layers (the second reuses the
    # first's index mask); every layer sparse, as the linear-attention ones are in the model. A Qwen-VL-style tower,
    # 4-pixel patches merged 2 x 2
    text = _generic("glm5_next_text", mlp_layer_types=["sparse"] * 3, num_key_value_heads=4, qk_rope_head_dim=0,
                    qk_nope_head_dim=8, v_head_dim=8, layer_types=["linear_attention", "indexed_attention",
                                                                   "indexed_attention"],
                    indexer_types=["full", "full", "shared"], index_topk=4, index_kpool=2, index_n_heads=2,
                    index_head_dim=8, linear_head_dim=8, linear_num_heads=4, linear_conv_kernel_dim=2, hc_mult=2)
    vision = {**_QWEN_VISION, "image_size": 16, "projection_intermediate_size": 32}
    return _mllm(CONFIG_MAPPING["glm5_next"], text.to_dict(), vision, kw, image_token_id=120, video_token_id=121,
                 image_start_token_id=122, image_end_token_id=123, video_start_token_id=124, video_end_token_id=125)


def _mistral_large4(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # multi-head latent attention with a DSA indexer keeping 4 keys per query, fewer than a tiny image batch has;
    # 2 groups of 4 experts, 1 kept; the first layer dense
    text = _generic("mistral_large4_text", **_sparse_after_first(**_MLA), head_dim=8, index_topk=4, index_n_heads=2,
                    index_head_dim=8, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    # a Pixtral tower: 4-pixel patches up to 32 x 32 pixels, merged 2 x 2 by the projector
    vision = {"model_type": "pixtral", "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "head_dim": 16, "patch_size": 4, "image_size": 32, "hidden_act": "silu"}
    return _mllm(CONFIG_MAPPING["mistral_large4"], text.to_dict(), vision, kw, image_token_index=120)


def _llama4(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # Llama 4's tower: 4-pixel patches of 16-pixel images, pixel-shuffled by 1/2 (4 x the channels into the
    # projector's MLP): 4 placeholders per image
    text = _generic("llama4_text", **_GENERIC_FAMILIES["llama4_text"])
    vision = {"hidden_size": 32, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 16, "patch_size": 4, "vision_output_dim": 32, "projector_input_dim": 32,
              "projector_output_dim": 32, "pixel_shuffle_ratio": 0.5}
    return _mllm(CONFIG_MAPPING["llama4"], text.to_dict(), vision, kw, image_token_index=120, boi_token_index=121,
                 eoi_token_index=122)


def _step3p7(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # Step 3.7's language model: the first layer dense, sliding / full / sliding attention, the routed sum scaled;
    # a tower of 4-pixel patches of 32-pixel images, downsampled 4 x 4 by two strided convolutions: 4 placeholders
    text = _generic("step3p5", **_sparse_after_first(moe_router_scaling_factor=2.5, share_expert_dim=16,
                                                     sliding_window=4, layer_types=["sliding_attention",
                                                                                    "full_attention",
                                                                                    "sliding_attention"]))
    vision = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 4, "max_position_embeddings": 64}
    return _mllm(CONFIG_MAPPING["step3p7"], text.to_dict(), vision, kw, image_token_id=120)


_INKLING2_VISION = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "patch_size": 4,
                    "spatial_merge_size": 2, "posemb_grid_size": 4, "projection_hidden_dim": 32, "text_hidden_size": 32,
                    "mlp_ratio": 1.0}


def _inkling2(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # Inkling 2's tower: 4-pixel patches merged 2 x 2 into one placeholder, a class token per image, a 4 x 4 position
    # grid interpolated to each image's
    text = _generic("inkling2_text", **_GENERIC_FAMILIES["inkling2_text"])
    return _mllm(CONFIG_MAPPING["inkling2"], text.to_dict(), _INKLING2_VISION, kw, image_token_id=120)


def _nemotron_h_omni(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # Nemotron-H's tiny language model; a RADIO tower on 4-pixel patches, its features downsampled 2 x 2 into one
    # placeholder; a one-layer Parakeet audio encoder (built, not fed)
    text = _generic("nemotron_h", **_GENERIC_FAMILIES["nemotron_h"])
    vision = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "patch_size": 4, "image_size": 16,
              "max_img_size": 32, "num_cls_tokens": 1, "num_registers": 1, "mlp_ratio": 1.0,
              "video_temporal_patch_size": 2}
    audio = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
             "intermediate_size": 32, "subsampling_conv_channels": 8, "num_mel_bins": 16,
             "projection_hidden_size": 32, "projection_bias": False}
    return _mllm(CONFIG_MAPPING["nemotron_h_omni"], text.to_dict(), vision, kw, audio_config=audio,
                 image_token_id=120, vision_hidden_size=32, projector_hidden_size=32)


def _muse_spark(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # Muse Spark: a sliding and a full attention layer, both sparse, the experts on a 16-wide projection; a tower of
    # 4-pixel patches in frame pairs merged 2 x 2 (a 4 x 4 position grid interpolated); a two-stage audio encoder
    text = _generic("muse_spark_text", num_hidden_layers=2, moe_hidden_size=16, sliding_window=4)
    vision = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "patch_size": 4, "pos_emb_height": 4, "pos_emb_width": 4, "max_position_embeddings": 16}
    audio = {"patch_sizes": [4, 2], "hidden_sizes": [8, 16], "depths": [1, 1], "num_hidden_layers": 2,
             "out_hidden_size": 32, "mlp_ratio": 1.0}
    return _mllm(CONFIG_MAPPING["muse_spark"], text.to_dict(), vision, kw, audio_config=audio, image_token_id=120,
                 video_token_id=121, out_hidden_size=128, projector_hidden_size=32)


def _inkling2_loop(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    # Inkling 2 Loop: its looped language model and Inkling 2's tower
    text = _generic("inkling2_loop_text", **_GENERIC_FAMILIES["inkling2_loop_text"])
    return _mllm(CONFIG_MAPPING["inkling2_loop"], text.to_dict(), _INKLING2_VISION, kw, image_token_id=120)


def _qwen3_omni_moe_thinker(**kw: Any):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    text = {**_ATTN, "num_hidden_layers": 2, "intermediate_size": 24, "moe_intermediate_size": 16, "num_experts": 8,
            "num_experts_per_tok": 2, "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "rope_parameters": _mrope()}
    vision = {**_QWEN_VISION, "num_position_embeddings": 16, "deepstack_visual_indexes": []}
    audio = {"num_mel_bins": 16, "encoder_layers": 1, "encoder_attention_heads": 4, "encoder_ffn_dim": 16,
             "d_model": 32, "output_dim": 32, "downsample_hidden_size": 8}
    return _mllm(CONFIG_MAPPING["qwen3_omni_moe_thinker"], text, vision, kw, audio_config=audio, **_QWEN_IDS,
                 audio_token_id=124, audio_start_token_id=125)


def _glm4v_moe(**kw: Any):
    from transformers import Glm4vMoeConfig

    text = {**_ATTN, "num_hidden_layers": 3, "intermediate_size": 24, "moe_intermediate_size": 16,
            "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
            "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 0],
                                "partial_rotary_factor": 0.5}}
    return _mllm(Glm4vMoeConfig, text, {**_QWEN_VISION, "image_size": 16}, kw, image_token_id=120,
                 video_token_id=121, image_start_token_id=122, image_end_token_id=123, video_start_token_id=124,
                 video_end_token_id=125)


def _internvl(**kw: Any):
    from transformers import InternVLConfig

    text = {"model_type": "qwen3_moe", **_ATTN, "num_hidden_layers": 2, "intermediate_size": 24,
            "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": []}
    vision = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": [16, 16], "patch_size": [4, 4]}
    return _mllm(InternVLConfig, text, vision, kw, image_token_id=120, downsample_ratio=0.5)


def _gemma4(**kw: Any):
    from transformers import Gemma4Config

    text = {**_ATTN, "intermediate_size": 24, "moe_intermediate_size": 16, **_GEMMA4_TEXT}
    # 4x4-pixel patches pooled 2x2: an image of (2..3)*2 x (2..3)*2 patches gives 4 to 9 placeholders
    vision = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 2, "head_dim": 16, "patch_size": 4, "pooling_kernel_size": 2,
              "position_embedding_size": 64}
    return _mllm(Gemma4Config, text, vision, kw, audio_config=None, image_token_id=120, video_token_id=121,
                 boi_token_id=122, eoi_token_id=123, boa_token_id=124, eoa_token_index=125, audio_token_id=126)


def _llava_onevision(**kw: Any):
    from transformers import LlavaOnevisionConfig

    text = {"model_type": "qwen2", **_ATTN, "num_hidden_layers": 2, "intermediate_size": 24,
            "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
    text.update(kw.pop("text_config", {}))
    # one 16x16 tile is 4x4 = 16 patch features (SigLIP has no CLS token: "full" keeps all); anyres grids of
    # up to 2x2 tiles keep a tiny image's placeholder count in the tens
    vision = {"model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 32,
              "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": 16, "patch_size": 4,
              "vision_use_head": False}
    vision.update(kw.pop("vision_config", {}))
    return LlavaOnevisionConfig(text_config=text, vision_config=vision, image_token_index=120,
                                video_token_index=121, vision_feature_select_strategy="full",
                                vision_feature_layer=-1, vision_aspect_ratio="anyres_max_9",
                                image_grid_pinpoints=[[16, 16], [16, 32], [32, 16], [32, 32]],
                                tie_word_embeddings=False, **kw)


def _qwen2_5_vl(**kw: Any):
    from transformers import Qwen2_5_VLConfig

    text = {**_ATTN, "num_hidden_layers": 2, "intermediate_size": 24, "bos_token_id": 2, "eos_token_id": 1,
            "pad_token_id": 0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}}
    text.update(kw.pop("text_config", {}))
    # a window of 16 pixels is 2x2 merged blocks, so block 0 attends within windows and block 1 globally
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32,
              "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 16,
              "fullatt_block_indexes": [1]}
    vision.update(kw.pop("vision_config", {}))
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=120, video_token_id=121,
                            vision_start_token_id=122, vision_end_token_id=123, tie_word_embeddings=False, **kw)


#: MoE MLLM family -> builder of its tiny config
MLLM_BUILDERS = {
    "qwen3_vl_moe": _qwen3_vl_moe,
    "internvl": _internvl,
    "gemma4": _gemma4,
    "qwen3_5_moe": _qwen3_5_moe,
    "qwen3_omni_moe_thinker": _qwen3_omni_moe_thinker,
    "glm4v_moe": _glm4v_moe,
    "qwen4_exp": _qwen4_exp,
    "kimi_k25": _kimi_k25,
    "hy_v4_vl": _hy_v4_vl,
    "dots3_note": _dots3_note,
    "deepseek_ocr2": _deepseek_ocr2,
    "unlimited_ocr": _unlimited_ocr,
    "aria": _aria,
    "minimax_m3_vl": _minimax_m3_vl,
    "glm5_next": _glm5_next,
    "mistral_large4": _mistral_large4,
    "llama4": _llama4,
    "step3p7": _step3p7,
    "inkling2": _inkling2,
    "nemotron_h_omni": _nemotron_h_omni,
    "muse_spark": _muse_spark,
    "inkling2_loop": _inkling2_loop,
}
#: dense MLLM family -> builder of its tiny config
DENSE_BUILDERS = {"llava_onevision": _llava_onevision, "qwen2_5_vl": _qwen2_5_vl}
