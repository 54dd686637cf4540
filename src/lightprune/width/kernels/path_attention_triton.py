"""Triton path-sparse attention: one online softmax over the retained key intervals (MWOP ("MWOP: Modality-aware
Width-wise Operation Pruning for Efficient MLLMs"), appendix D.5).

MWOP appendix D.5: for the retained causal key set ``A_(l,h)(i)`` of query i (SYSTEM keys
included),

    o_i = sum_{j in A(i)} exp(s_ij) v_j / sum_{j in A(i)} exp(s_ij),   s_ij = q_i . k_j * scale,

"the Triton kernel traverses only the retained key intervals and maintains a single online softmax
state across them ... without materializing the attention matrix. Causal and interval-end masks handle
boundary tiles." One program per (query block, batch * head): it loads its ``BLOCK_M`` queries once,
then for every run ``[start, end)`` of `lightprune.width.kernels.intervals.key_intervals` walks
``BLOCK_N``-key tiles from ``start``, masks each element exactly (interval end, causality, PAD keys and
the path rule: the per-head table ``allowed[h, query code, key code]`` of
`class_table`, packed as 16 bits per head) and updates the running
max m, sum l and fp32 accumulator (exp2 with log2(e) folded into the scale). Pruned keys never enter a QK or PV product
unless they share a boundary tile with a retained one. A query with no retained key outputs zeros
(l = 0). GQA: head h reads kv head ``h // (H // H_kv)``.

bf16 / fp16 inputs feed ``tl.dot`` directly on the GPU (fp32 accumulation; P is cast to V's dtype as
in FlashAttention); fp32 inputs use IEEE fp32 dots (no TF32); under ``TRITON_INTERPRET=1`` (CPU) the
tiles are upcast to fp32 before ``tl.dot`` (the interpreter's numpy dot has no bf16). This module
imports triton: import it lazily.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lightprune.width.kernels.intervals import NUM_CODES, class_bits, key_intervals

__all__ = ["triton_path_attention", "interpreting", "interpreter_usable", "default_blocks"]

_LOG2E = 1.4426950408889634
#: triton chooses the interpreter or the compiler when a function is decorated (and triton.language's own
#: helpers when triton is imported): the setting of TRITON_INTERPRET at import is the one that holds
_INTERPRET = bool(triton.knobs.runtime.interpret)


@triton.jit
def _path_attention_fwd(Q, K, V, Mod, Bits, Iv, Out,
                        s_qb, s_qh, s_qm, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                        s_ob, s_oh, s_om, s_od, s_mb, s_mk, s_ib, s_ih, s_in, s_it,
                        n_heads, groups, q_len, k_len, n_int, qk_scale,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_D: tl.constexpr, NUM_CODES: tl.constexpr, UPCAST: tl.constexpr,
                        PRECISION: tl.constexpr):
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    h = bh % n_heads
    hk = h // groups
    offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)  # query index
    offs_d = tl.arange(0, BLOCK_D)
    m_ok = offs_m < q_len
    d_ok = offs_d < HEAD_DIM
    q_pos = offs_m + (k_len - q_len)  # key position of each query
    q = tl.load(Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qm + offs_d[None, :] * s_qd,
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    q_code = tl.load(Mod + b * s_mb + q_pos * s_mk, mask=m_ok, other=NUM_CODES - 1).to(tl.int32)
    bits = tl.load(Bits + h)  # allowed[h, qc, kc] is bit qc * NUM_CODES + kc
    q_shift = q_code * NUM_CODES
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    iv = Iv + b * s_ib + h * s_ih + qb * s_in
    k_base = K + b * s_kb + hk * s_kh
    v_base = V + b * s_vb + hk * s_vh
    for t in range(0, n_int):
        start = tl.load(iv + t * s_it)
        end = tl.load(iv + t * s_it + 1)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_ok = offs_n < end
            k = tl.load(k_base + offs_n[None, :] * s_kn + offs_d[:, None] * s_kd,
                        mask=n_ok[None, :] & d_ok[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
            k_code = tl.load(Mod + b * s_mb + offs_n * s_mk, mask=n_ok, other=NUM_CODES - 1).to(tl.int32)
            allowed = ((bits >> (q_shift[:, None] + k_code[None, :])) & 1) != 0
            keep = allowed & n_ok[None, :] & m_ok[:, None] & (offs_n[None, :] <= q_pos[:, None])
            if UPCAST:
                k = k.to(tl.float32)
            s = tl.dot(q, k, input_precision=PRECISION) * qk_scale
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: p = alpha = 0
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_base + offs_n[:, None] * s_vn + offs_d[None, :] * s_vd,
                        mask=n_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
            if UPCAST:
                acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision=PRECISION)
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # a query without retained keys: zeros
    tl.store(Out + b * s_ob + h * s_oh + offs_m[:, None] * s_om + offs_d[None, :] * s_od,
             out.to(Out.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def interpreting() -> bool:
    """True when this module's kernel runs in triton's CPU interpreter (``TRITON_INTERPRET=1`` at import)."""
    return _INTERPRET


def interpreter_usable() -> bool:
    """False when ``TRITON_INTERPRET=1`` came after triton was imported: triton.language's own jitted helpers
    (``tl.max``, ``tl.sum``) were then built for the compiler and fail under the interpreter."""
    return type(tl.standard.sum).__name__ == "InterpretedFunction"


def default_blocks(device: torch.device, head_dim: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): 16 x 16 under the interpreter, 64 x 64 on a GPU (64 x 32 for head_dim > 128)."""
    if interpreting() or device.type != "cuda":
        return 16, 16
    return (64, 32) if head_dim > 128 else (64, 64)


def triton_path_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, modality: torch.Tensor,
                          keep: torch.Tensor, *, scale: float | None = None, block_m: int | None = None,
                          block_n: int | None = None, intervals: torch.Tensor | None = None,
                          bits: torch.Tensor | None = None, num_warps: int = 4, num_stages: int = 2) -> torch.Tensor:
    """[B, H, Q, D] path-sparse attention (module docstring); inputs as in
    [`lightprune.width.kernels.path_sparse_attention`][...path_sparse_attention] (already checked there).

    ``intervals``: a precomputed `key_intervals` table for the same modality, keep, Q and ``block_m``;
    ``bits``: a precomputed `class_bits` of ``keep``. Building either synchronises with the host and
    launches a few small kernels: precompute them once per plan and input (e.g. outside a CUDA graph) and
    the call is a single kernel launch.
    """
    batch, heads, q_len, dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    default_m, default_n = default_blocks(query.device, dim)
    block_m, block_n = block_m or default_m, block_n or default_n
    for name, blk in (("block_m", block_m), ("block_n", block_n)):
        if blk < 16 or blk & (blk - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {blk}")
    n_blocks = triton.cdiv(q_len, block_m)
    if intervals is None:
        intervals = key_intervals(modality, keep, q_len, block_m)
    expected = (batch, heads, n_blocks)
    if intervals.dim() != 5 or tuple(intervals.shape[:3]) != expected or intervals.shape[4] != 2:
        raise ValueError(f"intervals must be [B, H, n_qblocks, max_intervals, 2] with (B, H, n_qblocks) = "
                         f"{expected} for block_m {block_m}, got {tuple(intervals.shape)}")
    intervals = intervals.to(device=query.device, dtype=torch.int32).contiguous()
    bits = class_bits(keep) if bits is None else bits
    if tuple(bits.shape) != (heads,):
        raise ValueError(f"bits must be class_bits(keep), int32 [H={heads}], got {tuple(bits.shape)}")
    bits = bits.to(device=query.device, dtype=torch.int32).contiguous()
    modality = modality.to(torch.int8).contiguous()
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    scale = dim ** -0.5 if scale is None else float(scale)
    # fp32 dots in full precision (no TF32), as torch's SDPA does by default; tf32 is the default only
    # named for bf16 / fp16 tiles, where it has no effect
    fp32 = _INTERPRET or query.dtype == torch.float32
    grid = (n_blocks, batch * heads)
    _path_attention_fwd[grid](
        query, key, value, modality, bits, intervals, out,
        *query.stride(), *key.stride(), *value.stride(), *out.stride(), *modality.stride(),
        *intervals.stride()[:4],
        heads, heads // kv_heads, q_len, k_len, intervals.shape[3], scale * _LOG2E,
        HEAD_DIM=dim, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(dim)),
        NUM_CODES=NUM_CODES, UPCAST=_INTERPRET, PRECISION="ieee" if fp32 else "tf32",
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
