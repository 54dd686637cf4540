"""MWOP path-sparse attention: one entry point over three backends (MWOP ("MWOP: Modality-aware Width-wise
Operation Pruning for Efficient MLLMs"), section 3 and appendix D.5).

MWOP appendix D.5: with the retained causal key set of query i for layer l and head h,
``A_(l,h)(i) = {j <= i : key j not PAD, path (modality(i) -> modality(j)) kept for h}`` (SYSTEM keys
always, SYSTEM queries and every pair other than V2V / T2V / T2T never pruned),

    o_i = sum_{j in A(i)} exp(s_ij) v_j / sum_{j in A(i)} exp(s_ij),   s_ij = q_i . k_j * scale,

i.e. the pruned keys are removed BEFORE the softmax, exactly as mask mode
(`lightprune.width.attention`, whose ``path_masks`` / ``path_keep`` define the rule here
too). A query with no retained key outputs zeros. Backends (`BACKENDS`):

- ``"triton"``: `path_attention_triton`, walks only the retained key intervals with one online
  softmax (CUDA, or the CPU interpreter under ``TRITON_INTERPRET=1``);
- ``"flex"``: ``torch.nn.attention.flex_attention`` with a BlockMask from the same rule (compiled on
  CUDA, eager on CPU, forward-only there);
- ``"span"``: `span_attention`, dense SDPA calls on the kept key spans, one per sample, kept-path pattern
  and query run (the pruned keys never read; any device);
- ``"sdpa"``: the dense boolean [B, H, Q, K] mask and torch SDPA (the fallback and reference).

An unavailable backend is an error from `check_backend`, never a silent fallback.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import torch

from lightprune.width.kernels.intervals import NUM_CODES, class_table
from lightprune.width.paths import PAD, path_keep, path_masks

__all__ = ["BACKENDS", "path_sparse_attention", "check_backend", "check_inputs", "path_keep_mask",
           "sdpa_path_attention", "flex_path_attention", "path_block_mask"]

BACKENDS = ("triton", "flex", "span", "sdpa")
_FLEX_DEVICES = ("cpu", "cuda")
_COMPILED_FLEX = None


def _interpret_env() -> bool:
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def check_backend(backend: str, device: torch.device | str) -> None:
    """Raise when ``backend`` cannot run on ``device``: the message names both and what is missing."""
    device = torch.device(device)
    if backend not in BACKENDS:
        raise ValueError(f"unknown path attention backend {backend!r}; choose one of {list(BACKENDS)}")
    if backend in ("sdpa", "span"):
        return
    if backend == "flex":
        if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
            raise RuntimeError(f"backend 'flex' on {device}: torch {torch.__version__} has no "
                               f"torch.nn.attention.flex_attention (needs torch >= 2.5)")
        if device.type not in _FLEX_DEVICES:
            raise RuntimeError(f"backend 'flex' on {device}: FlexAttention runs on {list(_FLEX_DEVICES)} here")
        return
    if importlib.util.find_spec("triton") is None:
        from lightprune.core.extras import missing

        raise missing("triton", f"backend 'triton' on {device}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"backend 'triton' on {device}: CUDA is not available in this torch "
                               f"({torch.__version__})")
        return
    if device.type == "cpu":
        if not _interpret_env():
            raise RuntimeError(f"backend 'triton' on {device}: Triton compiles for CUDA GPUs; on CPU it needs its "
                               f"interpreter, set TRITON_INTERPRET=1 before triton is used (slow, for tests), "
                               f"or choose backend 'flex' or 'sdpa'")
        from lightprune.width.kernels import path_attention_triton as kernel

        if not (kernel.interpreting() and kernel.interpreter_usable()):
            raise RuntimeError(f"backend 'triton' on {device}: TRITON_INTERPRET=1 was set after triton was imported; "
                               f"triton picks its interpreter at import, so set it before the process imports "
                               f"triton (e.g. in the environment of the command)")
        return
    raise RuntimeError(f"backend 'triton' on {device}: supported devices are cuda, and cpu under TRITON_INTERPRET=1")


def check_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, modality: torch.Tensor,
                 keep: torch.Tensor) -> None:
    """Shape / dtype / device checks shared by every backend; errors name the bad value and what is expected."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError(f"query, key and value must be [B, H, T, D], got {tuple(query.shape)}, {tuple(key.shape)}, "
                         f"{tuple(value.shape)}")
    batch, heads, q_len, dim = query.shape
    if key.shape != value.shape or key.shape[0] != batch or key.shape[3] != dim:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must both be [B={batch}, H_kv, K, "
                         f"D={dim}] for query {tuple(query.shape)}")
    kv_heads, k_len = key.shape[1], key.shape[2]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"query heads {heads} must be a multiple of key/value heads {kv_heads} (GQA)")
    if not 0 < q_len <= k_len:
        raise ValueError(f"the queries are the last Q of the K keys: need 0 < Q <= K, got Q={q_len}, K={k_len}")
    if tuple(modality.shape) != (batch, k_len):
        raise ValueError(f"modality must be [B, K] = {(batch, k_len)}, got {tuple(modality.shape)}")
    if modality.dtype.is_floating_point or modality.dtype == torch.bool:
        raise ValueError(f"modality must hold integer codes 0..{NUM_CODES - 1}, got dtype {modality.dtype}")
    if tuple(keep.shape) != (heads, 3) or keep.dtype != torch.bool:
        raise ValueError(f"keep must be bool [H={heads}, 3] (columns v2v, t2v, t2t), got {keep.dtype} "
                         f"{tuple(keep.shape)}")
    for name, t in (("key", key), ("value", value), ("modality", modality), ("keep", keep)):
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device}, query on {query.device}: all inputs must share a device")
    if query.dtype != key.dtype or query.dtype != value.dtype:
        raise ValueError(f"query, key and value dtypes differ: {query.dtype}, {key.dtype}, {value.dtype}")


def path_keep_mask(modality: torch.Tensor, keep: torch.Tensor, q_len: int | None = None) -> torch.Tensor:
    """bool [B, H, Q, K]: key j retained for query i of head h (causal, not PAD, path kept; mask mode's rule)."""
    batch, k_len = modality.shape
    q_len = k_len if q_len is None else int(q_len)
    key_mod = modality
    query_mod = modality[:, k_len - q_len:]
    pos = torch.arange(k_len, device=modality.device)
    causal = pos[None, :] <= pos[k_len - q_len:, None]  # [Q, K]
    allowed = causal[None, None] & (key_mod != PAD)[:, None, None, :]  # [B, 1, Q, K]
    return allowed & path_keep(path_masks(query_mod, key_mod), keep.to(modality.device))


def sdpa_path_attention(query, key, value, modality, keep, *, scale: float | None = None) -> torch.Tensor:
    """Masked SDPA with `path_keep_mask` (materialises [B, H, Q, K]); fp32 on CPU, input dtype on GPU."""
    q_len = query.shape[2]
    mask = path_keep_mask(modality, keep, q_len)
    empty = ~mask.any(dim=-1, keepdim=True)
    mask = mask | empty  # keyless rows softmax over every key (finite) and are zeroed below
    upcast = query.device.type == "cpu" and query.dtype in (torch.bfloat16, torch.float16)
    q, k, v = (t.float() for t in (query, key, value)) if upcast else (query, key, value)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.masked_fill(empty, 0.0).to(query.dtype)


def path_block_mask(modality: torch.Tensor, keep: torch.Tensor, heads: int, q_len: int | None = None,
                    block_size: int = 128):
    """FlexAttention BlockMask of `path_keep_mask` (mask_mod over ``class_table`` + causality)."""
    from torch.nn.attention.flex_attention import create_block_mask

    batch, k_len = modality.shape
    q_len = k_len if q_len is None else int(q_len)
    offset = k_len - q_len
    allowed = class_table(keep.to(modality.device))  # [H, 4, 4], PAD keys False
    codes = modality.long()

    def mask_mod(b, h, q_idx, kv_idx):
        q_pos = q_idx + offset
        return (kv_idx <= q_pos) & allowed[h, codes[b, q_pos], codes[b, kv_idx]]

    # on CUDA the mask is built by a compiled kernel block by block, not as a [B, H, Q, K] tensor
    return create_block_mask(mask_mod, batch, heads, q_len, k_len, device=modality.device, BLOCK_SIZE=block_size,
                             _compile=modality.device.type == "cuda")


def flex_path_attention(query, key, value, modality, keep, *, scale: float | None = None, block_mask=None,
                        compile: bool | None = None) -> torch.Tensor:
    """FlexAttention with `path_block_mask` (pass ``block_mask`` to reuse one); compiled by default
    on CUDA, eager (unfused, forward-only) by default on CPU. Keyless queries give zeros."""
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import flex_attention

    batch, heads, q_len, _ = query.shape
    if block_mask is None:
        block_mask = path_block_mask(modality, keep, heads, q_len)
    compile = query.device.type == "cuda" if compile is None else compile
    if compile:
        if _COMPILED_FLEX is None:
            _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
        fn = _COMPILED_FLEX
    else:
        fn = flex_attention
    gqa = key.shape[1] != heads
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        out = fn(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    return out


def path_sparse_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, modality: torch.Tensor,
                          keep: torch.Tensor, *, scale: float | None = None, backend: str = "sdpa") -> torch.Tensor:
    """[B, H, Q, D] attention of the last Q positions over K keys with the MWOP path rule (module docstring).

    ``query`` [B, H, Q, D]; ``key`` / ``value`` [B, H_kv, K, D] (head h reads kv head ``h // (H // H_kv)``);
    ``modality`` int [B, K] (SYSTEM 0, VISION 1, TEXT 2, PAD 3); ``keep`` bool [H, 3] (v2v, t2v, t2t);
    ``scale`` defaults to ``D ** -0.5``. Output in query's dtype, fp32 accumulation.
    """
    check_backend(backend, query.device)
    check_inputs(query, key, value, modality, keep)
    if backend == "sdpa":
        return sdpa_path_attention(query, key, value, modality, keep, scale=scale)
    if backend == "flex":
        return flex_path_attention(query, key, value, modality, keep, scale=scale)
    if backend == "span":
        from lightprune.width.kernels.span_attention import span_path_attention

        return span_path_attention(query, key, value, modality, keep, scale=scale)
    from lightprune.width.kernels.path_attention_triton import triton_path_attention

    return triton_path_attention(query, key, value, modality, keep, scale=scale)
