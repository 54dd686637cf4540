"""MWOP's Taylor gates as identities whose backward yields the gate gradient (MWOP ("MWOP: Modality-aware
Width-wise Operation Pruning for Efficient MLLMs"), appendix A.1).

A unit gate g = 1 on a width unit leaves the forward unchanged, so each gate is an autograd function
that returns its input and, in the backward, passes the incoming gradient through unchanged and
computes dL/dg from what the forward already has:

- `path_gate`, attention: with ``O = (A ⊙ C) V`` and ``C[b, h, i, j] = g[b, h, path(i, j)]``,
  ``dL/dg[b, h, p] = sum over pairs (i, j) of path p of A_ij (dL/dO_i . v_j)``. The backward recomputes
  the attention weights A (the masked softmax of the layer, fp32) in query-row chunks over the keys
  a chunk can see, so no [B, heads, Q, K] tensor exists at any time (the dense [B, 1, Q, K] key mask is the
  model's own); ``(A ⊙ dP)`` with ``dP = dL/dO V^T`` is reduced over the keys by key modality and over
  the queries by query modality.
- `channel_gate`, FFN: a gate ``g[b, c, mu]`` multiplies ``h_ic`` (the input of ``down_proj``) for
  the tokens i of modality mu, so ``dL/dg[b, c, mu] = sum_{i in mu} h_ic dL/dh_ic``.

Under gates equal to 1 the derivative w.r.t. every activation is that of the ungated model, which is
what the pass-through gradient gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightprune.width.paths import PATHS, TEXT, VISION

__all__ = ["HeadGroup", "PathGateInputs", "path_gate", "channel_gate"]

#: elements of one fp32 [B, heads, rows, keys] chunk of recomputed attention weights (64 MiB)
CHUNK_ELEMENTS = 1 << 24


@dataclass(eq=False)
class HeadGroup:
    """Heads that share their keep flags: ``heads`` long [n] (query heads), ``kv_heads`` long [n] (the key /
    value head each reads), ``kept`` bool [B, 1 | n, Q, K] (pairs the softmax runs over), ``has_keys``
    bool [B, 1 | n, Q, 1] (the query keeps at least one key)."""

    heads: torch.Tensor
    kv_heads: torch.Tensor
    kept: torch.Tensor
    has_keys: torch.Tensor


@dataclass(eq=False)
class PathGateInputs:
    """What the attention backward needs besides q, k, v: the head groups, the model's additive float mask
    (None: boolean only), the softmax scale and the modality codes of queries [B, Q] and keys [B, K]."""

    groups: list[HeadGroup]
    additive: torch.Tensor | None
    scale: float
    query_mod: torch.Tensor
    key_mod: torch.Tensor


def _rows(tensor: torch.Tensor, index: torch.Tensor, rows: slice, keys: int) -> torch.Tensor:
    """``tensor[:, index, rows, :keys]`` with a broadcast head dimension of 1 left as is."""
    picked = tensor if tensor.shape[1] == 1 else tensor.index_select(1, index)
    return picked[:, :, rows, :keys]


def _path_gate_grad(query, key, value, grad_out, inputs: PathGateInputs) -> torch.Tensor:
    """fp32 [B, H, 3]: dL/dg per (sample, head, path), recomputing A in query-row chunks (module docstring)."""
    batch, heads, q_len, _ = query.shape
    k_len = key.shape[2]
    grad = torch.zeros(batch, heads, len(PATHS), dtype=torch.float32, device=query.device)
    key_onehot = torch.stack([inputs.key_mod == VISION, inputs.key_mod == TEXT], dim=-1).float()  # [B, K, 2]
    q_vision = (inputs.query_mod == VISION).float()
    q_text = (inputs.query_mod == TEXT).float()
    for group in inputs.groups:
        n = group.heads.numel()
        q_all = query.index_select(1, group.heads)
        g_all = grad_out.index_select(1, group.heads)
        k_all = key.index_select(1, group.kv_heads)
        v_all = value.index_select(1, group.kv_heads)
        step = max(1, CHUNK_ELEMENTS // max(1, batch * n * k_len))
        acc = torch.zeros(batch, n, len(PATHS), dtype=torch.float32, device=query.device)
        for start in range(0, q_len, step):
            rows = slice(start, min(q_len, start + step))
            visible = group.kept[:, :, rows].any(dim=(0, 1, 2)).nonzero()
            if visible.numel() == 0:
                continue
            keys = int(visible.max()) + 1  # a causal chunk sees keys up to its last query
            kept = _rows(group.kept, group.heads, rows, keys)
            has_keys = _rows(group.has_keys, group.heads, rows, 1)
            logits = (q_all[:, :, rows].float() @ k_all[:, :, :keys].float().transpose(-1, -2)) * inputs.scale
            if inputs.additive is not None:
                logits = logits + _rows(inputs.additive, group.heads, rows, keys)
            # a query without keys softmaxes over every key (finite) and is multiplied by 0
            probs = torch.softmax(logits.masked_fill(~(kept | ~has_keys), float("-inf")), dim=-1) * has_keys
            probs = probs * (g_all[:, :, rows].float() @ v_all[:, :, :keys].float().transpose(-1, -2))
            by_key = probs @ key_onehot[:, None, :keys]  # [B, n, rows, 2]: summed over vision / text keys
            qv, qt = q_vision[:, None, rows, None], q_text[:, None, rows, None]
            acc[..., 0] += (by_key[..., 0:1] * qv).sum(dim=(2, 3))
            acc[..., 1] += (by_key[..., 0:1] * qt).sum(dim=(2, 3))
            acc[..., 2] += (by_key[..., 1:2] * qt).sum(dim=(2, 3))
        grad[:, group.heads] = acc
    return grad


class _PathGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, gate, query, key, value, inputs):
        ctx.save_for_backward(query, key, value)
        ctx.inputs = inputs
        ctx.gate_dtype = gate.dtype
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value = ctx.saved_tensors
        grad_gate = None
        if ctx.needs_input_grad[1]:
            grad_gate = _path_gate_grad(query, key, value, grad_out, ctx.inputs).to(ctx.gate_dtype)
        return grad_out, grad_gate, None, None, None, None


def path_gate(out: torch.Tensor, gate: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              inputs: PathGateInputs) -> torch.Tensor:
    """``out`` [B, H, Q, Dv] unchanged; its backward gives ``gate`` [B, H, 3] the path gradients.

    ``key`` / ``value`` [B, H_kv, K, D] are the tensors the attention read (not repeated for GQA); the
    head groups' ``kv_heads`` say which kv head each query head reads."""
    return _PathGate.apply(out, gate, query, key, value, inputs)


class _ChannelGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, gate, onehot):
        ctx.save_for_backward(h, onehot)
        ctx.gate_dtype = gate.dtype
        return h.view_as(h)

    @staticmethod
    def backward(ctx, grad_h):
        h, onehot = ctx.saved_tensors
        grad_gate = None
        if ctx.needs_input_grad[1]:
            # [B, m, 2]: sum over the tokens of each modality of h_ic dL/dh_ic
            grad_gate = torch.einsum("btc,btk->bck", (h * grad_h).float(), onehot).to(ctx.gate_dtype)
        return grad_h, grad_gate, None


def channel_gate(h: torch.Tensor, gate: torch.Tensor, modality: torch.Tensor) -> torch.Tensor:
    """``h`` [B, T, m] unchanged; its backward gives ``gate`` [B, m, 2] (vision, text) the channel gradients.
    ``modality`` int [B, T]: the token codes of ``h``'s rows."""
    onehot = torch.stack([modality == VISION, modality == TEXT], dim=-1).float()
    return _ChannelGate.apply(h, gate, onehot)
