"""Tiny random models of every supported family, built from configs (nothing downloaded).

Used by the tests, the benchmarks and the README's default job. Each builder returns a
transformers 5 config small enough to run a forward pass in milliseconds on one CPU core,
with the family's routing switches set so that its distinctive path is exercised.

`TINY_FAMILIES` are the MoE families (text and multimodal) that expert pruning runs on.
`TINY_DENSE_MLLMS` are dense multimodal LLMs for the width pruning of MWOP ("MWOP: Modality-aware Width-wise
Operation Pruning for Efficient MLLMs"), appendix D.1: LLaVA-OneVision (SigLIP tower, anyres tiles with unpadding
and ``image_newline``) and Qwen2.5-VL (windowed vision attention, M-RoPE). Their text models have the MoE
families' attention geometry (hidden 32, 4 heads, 2 kv heads, head_dim 8) and a dense MLP of width 24.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from lightprune.core.suggestions import did_you_mean
from lightprune.testing.mllms import DENSE_BUILDERS, MLLM_BUILDERS
from lightprune.testing.text import _GENERIC_FAMILIES, TEXT_BUILDERS, _generic

__all__ = ["TINY_DENSE_MLLMS", "TINY_FAMILIES", "check_tiny_family", "check_tiny_overrides",
           "tiny_config", "tiny_model"]


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


#: how alike (difflib's ratio) a name must be to a tiny family or a config field to be suggested
_ALIKE = 0.75


def check_tiny_family(family: Any, what: str = "tiny family") -> None:
    """A ValueError naming ``family`` when it is none of `TINY_FAMILIES` and `TINY_DENSE_MLLMS`: the
    closest name, a few MoE families and the dense MLLMs (the whole list is 80 names)."""
    families = (*TINY_FAMILIES, *TINY_DENSE_MLLMS)
    if isinstance(family, str) and family in families:
        return
    raise ValueError(f"{what} {family!r} is not one of the {len(families)} tiny families"
                     f"{did_you_mean(family, families, _ALIKE)}; "
                     f"for example {', '.join(TINY_FAMILIES[:5])} and the dense MLLMs {', '.join(TINY_DENSE_MLLMS)} "
                     "(lightprune.testing.tiny.TINY_FAMILIES lists the MoE ones)")


def _field_names(config: Any) -> frozenset[str]:
    """The fields a transformers config has: its own (set at construction), its class's and their aliases."""
    names = set(config.to_dict()) | set(getattr(type(config), "__dataclass_fields__", {}))
    for cls in type(config).__mro__[:-1]:
        names |= set(getattr(cls, "attribute_map", None) or {})
        try:
            parameters = inspect.signature(cls.__init__).parameters.values()
        except (TypeError, ValueError):
            continue
        names |= {p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"}
    return frozenset(names)


@functools.lru_cache(maxsize=None)
def _fields(family: str) -> tuple[str, dict[str, Any]]:
    """(config class name, {"": its field names, "text_config": the sub-config's (class name, field names), ...})."""
    from transformers import PretrainedConfig

    config = {**_BUILDERS, **DENSE_BUILDERS}[family]()
    subs = {key: (type(value).__name__, _field_names(value)) for key, value in vars(config).items()
            if isinstance(value, PretrainedConfig)}
    return type(config).__name__, {"": _field_names(config), **subs}


def check_tiny_overrides(family: str, overrides: dict[str, Any], what: str = "tiny overrides") -> None:
    """A ValueError naming an override key that ``family``'s tiny config has no field for (transformers would keep it
    as an attribute that nothing reads), with the closest field; a sub-config's keys (``text_config``) too."""
    check_tiny_family(family)
    name, fields = _fields(family)
    for key, value in overrides.items():
        if key not in fields[""]:
            raise ValueError(f"{what}: {name} (the {family} tiny config) has no field {key!r}"
                             f"{did_you_mean(key, fields[''], _ALIKE)}; an override sets one of its fields")
        if key in fields and isinstance(value, dict):
            sub, known = fields[key]
            stray = next((k for k in value if k not in known), None)
            if stray is not None:
                raise ValueError(f"{what}: {key}: {sub} (of the {family} tiny config) has no field {stray!r}"
                                 f"{did_you_mean(stray, known, _ALIKE)}")


def tiny_config(family: str, **overrides: Any):
    """A tiny config of ``family`` (one of `TINY_FAMILIES` or `TINY_DENSE_MLLMS`), overrides applied; an
    override that is no field of the config is refused (`check_tiny_overrides`)."""
    check_tiny_family(family)
    if overrides:
        check_tiny_overrides(family, overrides)
    return {**_BUILDERS, **DENSE_BUILDERS}[family](**overrides)


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
                              "mlp.gate.linear.weight", "mlp.router.classifier.weight",
                              "ffn.router.layer.weight")):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
            elif name.endswith(("router.per_expert_scale", "experts.post_expert_norm.weight")):
                # Gemma 4's scales, Ergo's per-expert output norms: distinct per expert, so pruning must slice them
                # (Muse Spark's one shared norm: away from 1)
                param.copy_(0.5 + torch.rand(param.shape, generator=gen))
            elif "experts" in name and (param.dim() == 3 or name.endswith(("mlp.w1", "mlp.v1", "mlp.w2"))):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        for name, buf in [*model.named_buffers(), *model.named_parameters()]:
            if name.endswith(("e_score_correction_bias", "expert_bias")):  # a buffer (DeepSeek-V3) or a parameter
                buf.copy_(torch.randn(buf.shape, generator=gen) * 0.1)
    return model.eval()
