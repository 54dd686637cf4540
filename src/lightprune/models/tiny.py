"""Tiny random MoE models of every supported family, built from configs (nothing downloaded).

Used by the tests, the benchmarks and the README's default job. Each builder returns a
transformers 5 config small enough to run a forward pass in milliseconds on one CPU core,
with the family's routing switches set so that its distinctive path is exercised.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["TINY_FAMILIES", "tiny_config", "tiny_model"]

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


def _qwen3_vl_moe(**kw: Any):
    from transformers import Qwen3VLMoeConfig

    text = {**_ATTN, "num_hidden_layers": 2, "intermediate_size": 24, "moe_intermediate_size": 16,
            "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                                "mrope_interleaved": True}}
    text.update(kw.pop("text_config", {}))
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32,
              "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 16,
              "deepstack_visual_indexes": []}
    return Qwen3VLMoeConfig(text_config=text, vision_config=vision, image_token_id=120, video_token_id=121,
                            vision_start_token_id=122, vision_end_token_id=123, tie_word_embeddings=False, **kw)


def _internvl(**kw: Any):
    from transformers import InternVLConfig

    text = {"model_type": "qwen3_moe", **_ATTN, "num_hidden_layers": 2, "intermediate_size": 24,
            "moe_intermediate_size": 16, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": []}
    text.update(kw.pop("text_config", {}))
    vision = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": [16, 16], "patch_size": [4, 4]}
    return InternVLConfig(text_config=text, vision_config=vision, image_token_id=120, downsample_ratio=0.5,
                          tie_word_embeddings=False, **kw)


_BUILDERS = {
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "olmoe": _olmoe,
    "deepseek_v3": _deepseek_v3,
    "qwen3_vl_moe": _qwen3_vl_moe,
    "internvl": _internvl,
}

TINY_FAMILIES: tuple[str, ...] = tuple(_BUILDERS)


def tiny_config(family: str, **overrides: Any):
    """A tiny config of ``family`` (one of :data:`TINY_FAMILIES`), keyword overrides applied."""
    if family not in _BUILDERS:
        raise ValueError(f"unknown tiny family {family!r}; choose one of {sorted(_BUILDERS)}")
    return _BUILDERS[family](**overrides)


def tiny_model(family: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """A randomly initialised tiny model of ``family`` in eval mode, fp32, seeded.

    Text-only families build ``AutoModelForCausalLM``; the MLLM families build
    ``AutoModelForImageTextToText``. Router weights are re-drawn with a larger scale so that
    routing is decisive (random init otherwise gives near-uniform, tie-prone router logits).
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    config = tiny_config(family, **overrides)
    torch.manual_seed(seed)
    auto = AutoModelForImageTextToText if family in ("qwen3_vl_moe", "internvl") else AutoModelForCausalLM
    model = auto.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
            elif "experts" in name and param.dim() == 3:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.1)
    return model.eval()
