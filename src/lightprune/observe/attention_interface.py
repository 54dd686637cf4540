"""Wrapping a language model's attention implementation through transformers' attention registries.

Shared by the attention probe (`attention_probe`) of MAEP ("Modality-Aware Expert Pruning for MoE-Based
Multimodal Large Language Models", arXiv 2611.05927), section 4.2, and the path attention (`path_attention`)
of MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), section 3. No eager switch and
no module hooks: a wrapper function is registered in ``AttentionInterface`` under ``"<prefix><original>"`` (and
the original's mask builder in ``AttentionMaskInterface`` under the same name, so the model builds exactly the
mask the original would get), and the language model's configs are switched to that name while the wrapper is
active. Names are reference-counted: the last user unregisters them. The vision tower's configs are never
switched.

`dense_mask` turns whatever mask the implementation received (4D bool, 4D additive float, a
flex ``BlockMask``, or ``None`` with ``is_causal``) into the boolean [B, H, Q, K] pattern it applies.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["interfaces", "eager_function", "original_function", "register_wrapper", "unregister_wrapper",
           "language_model_configs", "switch_attention", "restore_attention", "dense_mask", "wrappable"]

_REGISTERED: dict[str, int] = {}  # names registered here -> number of active users


def interfaces():
    """(AttentionInterface, ALL_ATTENTION_FUNCTIONS, AttentionMaskInterface, ALL_MASK_ATTENTION_FUNCTIONS)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    return AttentionInterface, ALL_ATTENTION_FUNCTIONS, AttentionMaskInterface, ALL_MASK_ATTENTION_FUNCTIONS


def eager_function(module: nn.Module) -> Callable:
    """The model file's own ``eager_attention_forward`` (what ``get_interface("eager", ...)`` falls back to)."""
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if fn is None:
        from transformers.models.llama.modeling_llama import eager_attention_forward as fn
    return fn


def original_function(original: str, module: nn.Module) -> Callable:
    """The attention function registered as ``original`` (the model file's eager function for ``"eager"``)."""
    return eager_function(module) if original == "eager" else interfaces()[1][original]


def wrappable(prefixes: tuple[str, ...] = ()) -> list[str]:
    """Implementations a wrapper may wrap: the registered ones (no paged, no lightprune wrapper) and eager."""
    names = [k for k in interfaces()[1] if not k.startswith(("paged|", *prefixes))]
    return sorted(set(names) | {"eager"})


def _mask_builder(original: str) -> Callable:
    def mask_builder(*args, **kwargs):
        return interfaces()[3][original](*args, **kwargs)

    return mask_builder


def register_wrapper(prefix: str, original: str, make_attention: Callable[[str], Callable]) -> str:
    """Register ``make_attention(original)`` as ``prefix + original`` (once; reference-counted); its name."""
    attn_cls, _, mask_cls, _ = interfaces()
    name = prefix + original
    if name not in _REGISTERED:
        attn_cls.register(name, make_attention(original))
        # an implementation without a mask builder gets no mask (transformers' early exit): keep it so
        if original in mask_cls._global_mapping:
            mask_cls.register(name, _mask_builder(original))
        _REGISTERED[name] = 0
    _REGISTERED[name] += 1
    return name


def unregister_wrapper(name: str) -> None:
    """Drop one user of ``name``; the last one removes it from both registries."""
    attn_cls, _, mask_cls, _ = interfaces()
    _REGISTERED[name] -= 1
    if _REGISTERED[name] == 0:
        del _REGISTERED[name]
        attn_cls._global_mapping.pop(name, None)
        mask_cls._global_mapping.pop(name, None)


def language_model_configs(decoder: nn.ModuleList, parent: nn.Module) -> list[Any]:
    """Every distinct config the language model's attention and mask builders read: each decoder layer's
    ``self_attn.config`` and the config of the module holding the layers (the vision tower's are not)."""
    configs = [getattr(layer.self_attn, "config", None) for layer in decoder if hasattr(layer, "self_attn")]
    configs.append(getattr(parent, "config", None))
    return list({id(c): c for c in configs if c is not None}.values())


def switch_attention(configs: list[Any], register: Callable[[str], str]) -> list[tuple[Any, Any, str]]:
    """Point every config at ``register(current implementation)``; the saved state for
    `restore_attention`. On an error everything switched so far is restored."""
    saved: list[tuple[Any, Any, str]] = []
    try:
        for cfg in configs:
            current = cfg.__dict__.get("_attn_implementation_internal")
            name = register(current or "eager")
            saved.append((cfg, current, name))
            cfg._attn_implementation_internal = name
    except BaseException:
        restore_attention(saved)
        raise
    return saved


def restore_attention(saved: list[tuple[Any, Any, str]]) -> None:
    """Undo `switch_attention` (in place: ``saved`` ends empty)."""
    while saved:
        cfg, current, name = saved.pop()
        cfg._attn_implementation_internal = current
        unregister_wrapper(name)


def dense_mask(module: nn.Module, attention_mask: Any, batch: int, q_len: int, k_len: int,
               device: torch.device, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(allowed [Bm, Hm, Q, K] bool, additive float mask or None) of what the implementation applies."""
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
        if attention_mask.dtype == torch.bool:
            return attention_mask, None
        allowed = attention_mask > torch.finfo(attention_mask.dtype).min / 2
        return allowed, torch.where(allowed, attention_mask.float(), 0.0)
    if attention_mask is not None and type(attention_mask).__name__ == "BlockMask":
        from torch.nn.attention.flex_attention import create_mask

        return create_mask(attention_mask.mask_mod, batch, 1, q_len, k_len, device=device), None
    # no 4D mask (sdpa's is_causal path, flash attention's 2D padding mask): causal, window, padding
    is_causal = kwargs.get("is_causal")
    is_causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    q_pos = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    k_pos = torch.arange(k_len, device=device)[None, :]
    allowed = k_pos <= q_pos if is_causal else torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    window = kwargs.get("sliding_window")
    if window:
        allowed = allowed & (k_pos > q_pos - window)
    allowed = allowed[None, None]
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        allowed = allowed & attention_mask.to(device).bool()[:, None, None, :]
    return allowed, None
