"""Tiny random models of every supported family, built from configs (nothing downloaded).

Used by the tests, the benchmarks and the README's default job. Each builder returns a
transformers 5 config small enough to run a forward pass in milliseconds on one CPU core,
with the family's routing switches set so that its distinctive path is exercised.

:data:`TINY_FAMILIES` are the MoE families (text and multimodal) that expert pruning runs on.
:data:`TINY_DENSE_MLLMS` are dense multimodal LLMs for MWOP width pruning (paper 002): LLaVA-OneVision
(SigLIP tower, anyres tiles with unpadding and ``image_newline``) and Qwen2.5-VL (windowed vision
attention, M-RoPE). Their text models have the MoE families' attention geometry (hidden 32, 4 heads,
2 kv heads, head_dim 8) and a dense MLP of width 24.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["TINY_DENSE_MLLMS", "TINY_FAMILIES", "tiny_config", "tiny_model"]

_ATTN = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=128,
             max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False)


def _mixtral(**kw: Any):
    from transformers import MixtralConfig

    return MixtralConfig(**{**_ATTN, "num_hidden_layers": 2, "intermediate_size": 16, "num_local_experts": 8,
                            "num_experts_per_tok": 2, **kw})


def _qwen2_moe(**kw: Any):
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(**{**_ATTN, "num_hidden_layers": 3, "intermediate_size": 24, "moe_intermediate_size": 16,
                             "shared_expert_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2,
                             "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [1], **kw})


def _qwen3_moe(**kw: Any):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**{**_ATTN, "num_hidden_layers": 3, "intermediate_size": 24, "moe_intermediate_size": 16,
                             "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
                             "decoder_sparse_step": 1, "mlp_only_layers": [], **kw})


def _olmoe(**kw: Any):
    from transformers import OlmoeConfig

    return OlmoeConfig(**{**_ATTN, "num_hidden_layers": 2, "intermediate_size": 16, "num_experts": 8,
                          "num_experts_per_tok": 2, "norm_topk_prob": False, **kw})


def _deepseek_v3(**kw: Any):
    from transformers import DeepseekV3Config

    return DeepseekV3Config(**{"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 4,
                               "vocab_size": 128, "max_position_embeddings": 128, "num_hidden_layers": 3,
                               "intermediate_size": 24, "moe_intermediate_size": 16, "n_routed_experts": 8,
                               "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
                               "first_k_dense_replace": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
                               "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                               "v_head_dim": 8, "tie_word_embeddings": False, **kw})


def _glm4_moe(**kw: Any):
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(**{**_ATTN, "num_hidden_layers": 3, "intermediate_size": 24, "moe_intermediate_size": 16,
                            "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2,
                            "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
                            "norm_topk_prob": True, "use_qk_norm": True, **kw})


def _dots1(**kw: Any):
    from transformers import Dots1Config

    return Dots1Config(**{**_ATTN, "num_hidden_layers": 3, "intermediate_size": 24, "moe_intermediate_size": 16,
                          "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2,
                          "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 1.5,
                          "norm_topk_prob": False, **kw})


def _minimax(**kw: Any):
    from transformers import MiniMaxConfig

    # one lightning (linear) attention layer and one full one: the routing is the same in both
    return MiniMaxConfig(**{**_ATTN, "num_hidden_layers": 2, "intermediate_size": 16, "num_local_experts": 8,
                            "num_experts_per_tok": 2, "layer_types": ["linear_attention", "full_attention"],
                            "block_size": 4, **kw})


def _flex_olmo(**kw: Any):
    from transformers import FlexOlmoConfig

    return FlexOlmoConfig(**{**_ATTN, "num_hidden_layers": 2, "intermediate_size": 16, "num_experts": 8,
                             "num_experts_per_tok": 2, "norm_topk_prob": True, "pad_token_id": 0, "bos_token_id": 2,
                             "eos_token_id": 1, **kw})


#: the tiny values of every config field a family may have (a family's builder keeps the ones its config takes)
_GENERIC = {**_ATTN, "intermediate_size": 24, "moe_intermediate_size": 16, "num_hidden_layers": 3,
            "n_routed_experts": 8, "num_experts": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "n_group": 2,
            "topk_group": 1, "first_k_dense_replace": 1, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
            "norm_topk_prob": True, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
            "v_head_dim": 8, "shared_expert_intermediate_size": 16, "pad_token_id": 0, "bos_token_id": 2,
            "eos_token_id": 1, "decoder_sparse_step": 1, "mlp_only_layers": []}


def _generic(model_type: str, **kw: Any):
    """A tiny config of ``model_type`` from :data:`_GENERIC`: the fields its config class takes, then ``kw``."""
    import inspect

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    fields = set(inspect.signature(cls.__init__).parameters) | set(getattr(cls, "__dataclass_fields__", {}))
    return cls(**{k: v for k, v in {**_GENERIC, **kw}.items() if k in fields or k in kw})


def _sparse_after_first(**kw: Any) -> dict[str, Any]:
    return {"mlp_layer_types": ["dense", "sparse", "sparse"], **kw}


#: Gemma 4's language model: a sliding and a full attention layer (global head_dim as the local one), no per-layer
#: input embeddings, a router and experts beside the dense MLP in every layer
_GEMMA4_TEXT = {"num_hidden_layers": 2, "num_experts": 8, "top_k_experts": 2, "enable_moe_block": True,
                "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 128, "sliding_window": 4,
                "layer_types": ["sliding_attention", "full_attention"], "global_head_dim": 8}

#: families built by :func:`_generic`: model type -> family-specific fields
_MLA = {"num_key_value_heads": 4}  # multi-head latent attention: as many kv heads as query heads
_HYBRID = {"layer_types": ["linear_attention", "full_attention", "full_attention"]}
_GENERIC_FAMILIES: dict[str, dict[str, Any]] = {
    "exaone_moe": {}, "solar_open": {}, "mimo_v2_flash": _sparse_after_first(), "hy_v4": _sparse_after_first(),
    # Sarvam-30B: built by transformers as a GLM-4.5 model (Glm4MoeForCausalLM), full-head rotary, q/k norms
    "sarvam_moe": {"use_qk_norm": True},
    # Param-2 MoE: built as a GLM-4.5 model too (Glm4MoeForCausalLM), q/k norms
    "param2moe": {"use_qk_norm": True},
    # Sarvam-105B: built as a DeepSeek-V3 model (DeepseekV3ForCausalLM), MLA without a query low-rank projection
    "sarvam_mla": {**_MLA, "q_lora_rank": None},
    "deepseek_v32": _MLA, "glm_moe_dsa": _MLA, "glm4_moe_lite": _sparse_after_first(**_MLA),
    "axk1": _sparse_after_first(**_MLA), "kimi_linear": _sparse_after_first(**_HYBRID, **_MLA),
    "bailing_hybrid": _sparse_after_first(**_HYBRID, **_MLA),
    "mellum": {},
    "minicpm5_moe": _sparse_after_first(),
    # a gated-delta-net layer and two full-attention ones, each with the MoE block and its ungated shared expert
    "lara_mini": {**_HYBRID, "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
                  "linear_value_head_dim": 8, "linear_conv_kernel_dim": 2, "norm_topk_prob": False},
    # the middle layer dense (Qwen3-MoE's rule), a sliding-window layer, the routed weights renormalised
    "flint": {"mlp_only_layers": [1], "layer_types": ["sliding_attention", "full_attention", "full_attention"],
              "sliding_window": 4},
    "kolibri1": {"num_hidden_layers": 2, "norm_topk_prob": False},
    # the first layer dense (mlp_only_layers), a sliding-window layer, then an indexer layer whose K/V the last
    # (indexed) layer reuses; heads of 16 (the config's NVFP4 rounding of keys and values needs a multiple of 16)
    "kolibri1_1": {"norm_topk_prob": False, "head_dim": 16, "mlp_only_layers": [0], "mlp_only_intermediate_size": 24,
                   "layer_types": ["sliding_attention", "indexed_attention", "indexed_attention"],
                   "sliding_window": 4, "index_layers": [1], "kv_source_layers": [0, 1, 1], "index_topk": 4,
                   "index_pool_size": 8, "index_compression": 2, "index_num_heads": 2, "index_num_local_tokens": 2,
                   "index_num_sink_tokens": 1},
    # the first layer dense; the block scales the routed sum after the experts
    "beam": _sparse_after_first(),
    # expert groups (the larger A.X K2 releases; A.X K2 Light has none), the first layer dense
    "axk2": _sparse_after_first(**_MLA),
    # one gated-delta-net (linear attention) layer and two full ones, the middle layer dense
    "qwen3_next": {"mlp_only_layers": [1], **_HYBRID},
    "deepseek_v2": {**_MLA, "topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1},
    "ernie4_5_moe": {"moe_num_experts": 8, "moe_k": 2, "moe_layer_start_index": 1, "moe_layer_interval": 1,
                     "moe_num_shared_experts": 1},
    "granitemoe": {"num_hidden_layers": 2},
    "granitemoeshared": {"num_hidden_layers": 2, "shared_intermediate_size": 16},
    "granitemoe_swa": {"num_hidden_layers": 2},
    # a Mamba-2 layer and an attention layer, each with the MoE block and the shared MLP
    "granitemoehybrid": {"num_hidden_layers": 2, "shared_intermediate_size": 16, "intermediate_size": 16,
                         "layer_types": ["linear_attention", "attention"], "mamba_n_heads": 4, "mamba_d_state": 8,
                         "mamba_d_head": 16, "mamba_chunk_size": 8, "mamba_n_groups": 1},
    # mamba, attention+MoE, mamba, attention+MoE
    "jamba": {"num_hidden_layers": 4, "expert_layer_period": 2, "expert_layer_offset": 1, "attn_layer_period": 2,
              "attn_layer_offset": 1, "mamba_d_state": 4, "mamba_d_conv": 2, "mamba_expand": 2, "mamba_dt_rank": 4},
    "cohere2_moe": {"num_hidden_layers": 2},
    "qwen3_5_moe_text": {**_HYBRID, "linear_num_value_heads": 4, "linear_num_key_heads": 2,
                         "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 2},
    "gpt_oss": {"num_hidden_layers": 2, "intermediate_size": 16, "layer_types": ["sliding_attention", "full_attention"],
                "sliding_window": 4},
    "gemma4_text": _GEMMA4_TEXT,
    # per-layer experts per token (a list, as the config allows): layer 1 routes to 3
    "hunyuan_v1_moe": {"num_hidden_layers": 2, "intermediate_size": 16, "moe_topk": [2, 3], "use_qk_norm": True},
    "minimax_m2": {"num_hidden_layers": 2, "intermediate_size": 16},
    "aria_text": {"num_hidden_layers": 2, "intermediate_size": 16, "moe_num_experts": 8, "moe_topk": 2,
                  "moe_num_shared_experts": 1},
    # hyper-connected layers: a gated-delta-net layer and an indexed (sparse) attention one
    "qwen4_exp_text": {"num_hidden_layers": 2, "layer_types": ["linear_attention", "indexed_attention"],
                       "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
                       "linear_value_head_dim": 8, "linear_conv_kernel_dim": 2, "hc_count": 2, "hc_lowrank": 8,
                       "indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 8, "indexer_budget": 4,
                       "indexer_compress_ratio": 2},
    # multi-head latent attention with a sparse indexer; the last layer a sliding-window one with its own sizes
    "dots3_note_text": _sparse_after_first(**_MLA, shared_experts_intermediate_size=16, head_dim=16, index_topk=4,
                                           index_head_dim=8, index_n_heads=2, sliding_window=4,
                                           swa_num_attention_heads=4, swa_num_key_value_heads=4, swa_q_lora_rank=16,
                                           swa_kv_lora_rank=16, swa_head_dim=16, swa_qk_nope_head_dim=8,
                                           swa_v_head_dim=8),
    # a sparse-attention (indexed blocks) layer between two full ones; the middle and last layers sparse
    "minimax_m3_vl_text": _sparse_after_first(intermediate_size=16, dense_intermediate_size=24,
                                              shared_intermediate_size=16, routed_scaling_factor=2.5, rotary_dim=4,
                                              layer_types=["full_attention", "minimax_m3_sparse", "full_attention"],
                                              index_n_heads=2, index_head_dim=8, index_block_size=2,
                                              index_topk_blocks=2, index_local_blocks=1),
    "laguna": _sparse_after_first(moe_routed_scaling_factor=2.5, moe_router_logit_softcapping=2.0, sliding_window=16),
    # Mamba-2, MoE, attention, MoE mixers; the experts read a 16-wide latent projection of the hidden states
    "nemotron_h": {"layers_block_type": ["linear_attention", "moe", "full_attention", "moe"], "intermediate_size": 16,
                   "moe_shared_expert_intermediate_size": 16, "moe_latent_size": 16, "mamba_num_heads": 4,
                   "mamba_head_dim": 16, "ssm_state_size": 8, "n_groups": 1, "chunk_size": 8},
    # a jitter epsilon wide enough that sparsemixer's threshold masks some experts out of its softmaxes
    "phimoe": {"num_hidden_layers": 2, "intermediate_size": 16, "router_jitter_noise": 0.2},
    "hy_v3": _sparse_after_first(num_shared_experts=1, router_scaling_factor=2.5),
    "afmoe": {"num_dense_layers": 1, "num_shared_experts": 1, "route_scale": 2.5},
    "lfm2_moe": {"num_dense_layers": 1, "use_expert_bias": True, "routed_scaling_factor": 2.5,
                 "layer_types": ["conv", "full_attention", "conv"], "conv_L_cache": 3},
    # multi-head latent attention with YaRN rotary on the 8 rope dims of its 16-wide heads and Llama 4's
    # position-dependent query scaling (from position 4 on); built by AutoModelForImageTextToText (transformers
    # maps Mistral4ForCausalLM only there)
    "mistral4": {**_MLA, "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0,
                                             "original_max_position_embeddings": 4, "beta_fast": 32.0,
                                             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                             "llama_4_scaling_beta": 0.1}},
}


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


_BUILDERS = {
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "olmoe": _olmoe,
    "deepseek_v3": _deepseek_v3,
    "qwen3_vl_moe": _qwen3_vl_moe,
    "internvl": _internvl,
    "glm4_moe": _glm4_moe,
    "dots1": _dots1,
    "minimax": _minimax,
    "flex_olmo": _flex_olmo,
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
    **{t: (lambda t, extra: lambda **kw: _generic(t, **{**extra, **kw}))(t, extra)
       for t, extra in _GENERIC_FAMILIES.items()},
}

TINY_FAMILIES: tuple[str, ...] = tuple(_BUILDERS)

_DENSE_BUILDERS = {"llava_onevision": _llava_onevision, "qwen2_5_vl": _qwen2_5_vl}

TINY_DENSE_MLLMS: tuple[str, ...] = tuple(_DENSE_BUILDERS)

_MLLMS = ("qwen3_vl_moe", "internvl", "gemma4", "qwen3_5_moe", "qwen3_omni_moe_thinker", "glm4v_moe", "qwen4_exp",
          "kimi_k25", "hy_v4_vl", "dots3_note",
          "deepseek_ocr2", "unlimited_ocr", "aria", "minimax_m3_vl", "glm5_next", "mistral_large4", *TINY_DENSE_MLLMS)


def tiny_config(family: str, **overrides: Any):
    """A tiny config of ``family`` (one of :data:`TINY_FAMILIES` or :data:`TINY_DENSE_MLLMS`), overrides applied."""
    builders = {**_BUILDERS, **_DENSE_BUILDERS}
    if family not in builders:
        raise ValueError(f"unknown tiny family {family!r}; choose one of {sorted(builders)}")
    return builders[family](**overrides)


def tiny_model(family: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """A randomly initialised tiny model of ``family`` in eval mode, fp32, seeded.

    Text-only families build ``AutoModelForCausalLM``; the MLLM families, and a text model that transformers
    maps only to ``AutoModelForImageTextToText`` (Mistral 4), build ``AutoModelForImageTextToText``. In the MoE families, router weights are re-drawn with a larger
    scale so that routing is decisive (random init otherwise gives near-uniform, tie-prone router
    logits); the dense MLLMs keep transformers' initialisation.
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    config = tiny_config(family, **overrides)
    torch.manual_seed(seed)
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    # a text model that transformers maps only to the image-text auto class (Mistral 4) is built by that one
    text_only = family not in _MLLMS and config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    auto = AutoModelForCausalLM if text_only else AutoModelForImageTextToText
    model = auto.from_config(config, dtype=torch.float32)
    if family in TINY_DENSE_MLLMS:
        return model.eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight", "mlp.router.weight",
                              "block_sparse_moe.router.weight", "feed_forward.router.weight", "router.proj.weight",
                              "mlp.gate.wg.weight", "mlp.router.gate.weight", "feed_forward.gate.weight")):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
            elif name.endswith("router.per_expert_scale"):  # Gemma 4: distinct per expert, so pruning must slice it
                param.copy_(0.5 + torch.rand(param.shape, generator=gen))
            elif "experts" in name and param.dim() == 3:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        for name, buf in [*model.named_buffers(), *model.named_parameters()]:
            if name.endswith(("e_score_correction_bias", "expert_bias")):  # a buffer (DeepSeek-V3) or a parameter
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.1)
    return model.eval()
