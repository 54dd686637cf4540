"""Tiny configs of the text MoE families (the geometry every tiny model shares, hand-written builders and the
families built generically from `_GENERIC_FAMILIES`); `lightprune.testing.tiny` is the public entry."""

from __future__ import annotations

from typing import Any

__all__ = ["TEXT_BUILDERS"]

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


def _longcat_flash(**kw: Any):
    from transformers import LongcatFlashConfig

    return LongcatFlashConfig(**{"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 4,
                                 "vocab_size": 128, "max_position_embeddings": 128, "num_layers": 2,
                                 "ffn_hidden_size": 24, "expert_ffn_hidden_size": 16, "n_routed_experts": 8,
                                 "zero_expert_num": 2, "num_experts_per_tok": 3, "routed_scaling_factor": 2.0,
                                 "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                                 "v_head_dim": 8, "head_dim": 8, "tie_word_embeddings": False, **kw})


def _dbrx(**kw: Any):
    from transformers import DbrxConfig

    return DbrxConfig(**{"d_model": 32, "n_heads": 4, "n_layers": 2, "max_seq_len": 128, "vocab_size": 128,
                         "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
                         "ffn_config": {"ffn_hidden_size": 16, "moe_num_experts": 8, "moe_top_k": 2},
                         "tie_word_embeddings": False, **kw})


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
    """A tiny config of ``model_type`` from `_GENERIC`: the fields its config class takes, then ``kw``."""
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
    # Llama 4: the first layer dense (moe_layers), a NoPE layer, chunked attention over 4 tokens
    "llama4_text": {"intermediate_size": 16, "intermediate_size_mlp": 24, "moe_layers": [1, 2],
                    "no_rope_layers": [1, 0, 1], "attention_chunk_size": 4},
    # Inkling 2: sliding (hybrid_sliding) / full (hybrid) / sliding layers with their short convolutions, attention
    # residuals over blocks of 2 layers, relative position biases
    "inkling2_text": {"swa_num_attention_heads": 4, "swa_num_key_value_heads": 2, "swa_head_dim": 8,
                      "sliding_window_size": 4, "unpadded_vocab_size": 128, "n_layers_per_attn_res_block": 2,
                      "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding"], "d_rel": 4, "rel_extent": 16},
    # Inkling 2 Loop: Inkling 2's layers, the last two looped twice per forward (their MoE blocks run twice)
    "inkling2_loop_text": {"swa_num_attention_heads": 4, "swa_num_key_value_heads": 2, "swa_head_dim": 8,
                           "sliding_window_size": 4, "unpadded_vocab_size": 128, "n_layers_per_attn_res_block": 2,
                           "num_hidden_layers": 4, "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding",
                                                                   "hybrid"], "d_rel": 4, "rel_extent": 16,
                           "loop_layer_index_start": 2, "loop_layer_index_end": 4, "loop_num_passes": 2,
                           "loop_gate_rank": 4},
    # Ergo: the first layer dense, a sliding and a full attention layer after it
    "ergo": {"num_dense_blocks": 1, "first_dense_intermediate_size": 24, "shared_intermediate_size": 16,
             "sliding_window": 4, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
    # multi-head latent attention with YaRN rotary on the 8 rope dims of its 16-wide heads and Llama 4's
    # position-dependent query scaling (from position 4 on); built by AutoModelForImageTextToText (transformers
    # maps Mistral4ForCausalLM only there)
    "mistral4": {**_MLA, "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0,
                                             "original_max_position_embeddings": 4, "beta_fast": 32.0,
                                             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                             "llama_4_scaling_beta": 0.1}},
}


#: family -> builder of its tiny config (``**overrides`` -> config)
TEXT_BUILDERS = {
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "olmoe": _olmoe,
    "deepseek_v3": _deepseek_v3,
    "glm4_moe": _glm4_moe,
    "dots1": _dots1,
    "minimax": _minimax,
    "flex_olmo": _flex_olmo,
    "longcat_flash": _longcat_flash,
    "dbrx": _dbrx,
}
