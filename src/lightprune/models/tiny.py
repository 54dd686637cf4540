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

from lightprune.models.tiny_mllms import DENSE_BUILDERS, MLLM_BUILDERS
from lightprune.models.tiny_text import _GENERIC_FAMILIES, TEXT_BUILDERS, _generic

__all__ = ["TINY_DENSE_MLLMS", "TINY_FAMILIES", "tiny_config", "tiny_model"]


_TEXT_ORDER = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3")
#: family -> tiny config builder; the order is the tests' (the seed families first)
_BUILDERS = {
    **{t: TEXT_BUILDERS[t] for t in _TEXT_ORDER},
    "qwen3_vl_moe": MLLM_BUILDERS["qwen3_vl_moe"],
    "internvl": MLLM_BUILDERS["internvl"],
    **{t: b for t, b in TEXT_BUILDERS.items() if t not in _TEXT_ORDER},
    **MLLM_BUILDERS,
    **{t: (lambda t, extra: lambda **kw: _generic(t, **{**extra, **kw}))(t, extra)
       for t, extra in _GENERIC_FAMILIES.items()},
}

TINY_FAMILIES: tuple[str, ...] = tuple(_BUILDERS)
TINY_DENSE_MLLMS: tuple[str, ...] = tuple(DENSE_BUILDERS)
_MLLMS = (*MLLM_BUILDERS, *TINY_DENSE_MLLMS)


def tiny_config(family: str, **overrides: Any):
    """A tiny config of ``family`` (one of :data:`TINY_FAMILIES` or :data:`TINY_DENSE_MLLMS`), overrides applied."""
    builders = {**_BUILDERS, **DENSE_BUILDERS}
    if family not in builders:
        raise ValueError(f"unknown tiny family {family!r}; choose one of {sorted(builders)}")
    return builders[family](**overrides)


def tiny_model(family: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """A randomly initialised tiny model of ``family`` in eval mode, fp32, seeded.

    Text-only families build ``AutoModelForCausalLM``; the MLLM families, and a text model that transformers
    maps only to ``AutoModelForImageTextToText`` (Mistral 4), build ``AutoModelForImageTextToText``. In the MoE
    families, router weights are re-drawn with a larger scale so that routing is decisive (random init otherwise
    gives near-uniform, tie-prone router logits); the dense MLLMs keep transformers' initialisation.
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
                              "mlp.gate.wg.weight", "mlp.router.gate.weight", "feed_forward.gate.weight",
                              "mlp.gate.linear.weight")):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
            elif name.endswith(("router.per_expert_scale", "experts.post_expert_norm.weight")):
                # Gemma 4's scales, Ergo's per-expert output norms: distinct per expert, so pruning must slice them
                # (Muse Spark's one shared norm: away from 1)
                param.copy_(0.5 + torch.rand(param.shape, generator=gen))
            elif "experts" in name and param.dim() == 3:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        for name, buf in [*model.named_buffers(), *model.named_parameters()]:
            if name.endswith(("e_score_correction_bias", "expert_bias")):  # a buffer (DeepSeek-V3) or a parameter
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.1)
    return model.eval()
