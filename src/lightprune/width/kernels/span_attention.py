"""MWOP path-sparse attention from dense SDPA calls on the kept key spans: :func:`span_path_attention`.

The pruned paths of MWOP ("Modality-Aware Width Optimisation and Pruning", Algorithm 1; appendix D.5's retained key
set) remove whole (query modality, key modality) blocks per head, and the modalities are contiguous runs of the
sequence. So the attention splits into dense pieces: the heads are grouped by their kept-path pattern (at most 8
patterns), each sample's queries into runs of one modality, and for each (pattern, run) the keys that pattern keeps
for that modality up to the run's last position are gathered once and attended with SDPA (GQA heads read their
key/value head; the run's own keys under a causal mask). The pruned keys are never read: a NaN in them cannot reach
the output. The rule is :func:`~lightprune.width.kernels.intervals.class_table`'s (mask mode's); a query with no
retained key outputs zeros, as the other backends.

The runs and patterns are read to the host once per call (they size the pieces). On the CPU half-precision inputs
are computed in fp32, as :func:`~.path_attention.sdpa_path_attention` does.
"""

from __future__ import annotations

import torch

from lightprune.width.kernels.intervals import class_table

__all__ = ["span_path_attention", "modality_runs"]


def modality_runs(codes: list[int]) -> list[tuple[int, int, int]]:
    """``[(start, end, code)]``: the maximal runs of equal codes of ``codes``, in order."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for index in range(1, len(codes) + 1):
        if index == len(codes) or codes[index] != codes[start]:
            runs.append((start, index, codes[start]))
            start = index
    return runs


def span_path_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, modality: torch.Tensor,
                        keep: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
    """[B, H, Q, D] path-sparse attention (the arguments of
    :func:`~lightprune.width.kernels.path_attention.path_sparse_attention`, checked there), one SDPA call per sample,
    kept-path pattern and query run (module docstring)."""
    batch, heads, q_len, dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    groups, offset = heads // kv_heads, k_len - q_len
    upcast = query.device.type == "cpu" and query.dtype in (torch.bfloat16, torch.float16)
    q_all, k_all, v_all = (t.float() for t in (query, key, value)) if upcast else (query, key, value)
    out = torch.zeros(batch, heads, q_len, dim, dtype=q_all.dtype, device=query.device)
    table = class_table(keep).cpu()  # [H, 4 query codes, 4 key codes]; PAD keys never
    patterns: dict[bytes, list[int]] = {}
    for head in range(heads):
        patterns.setdefault(table[head].numpy().tobytes(), []).append(head)
    codes_all = modality.to("cpu", torch.long)
    positions = torch.arange(k_len, device=query.device)
    for b in range(batch):
        codes = codes_all[b]
        runs = modality_runs(codes[offset:].tolist())
        for members in patterns.values():
            allowed = table[members[0]]  # [4, 4]
            heads_index = torch.tensor(members, device=query.device)
            kv_index = heads_index // groups
            # the pattern's heads and the key/value heads they read, gathered once for all the runs
            q_heads, k_heads, v_heads = (q_all[b].index_select(0, heads_index), k_all[b].index_select(0, kv_index),
                                         v_all[b].index_select(0, kv_index))
            for start, end, code in runs:
                last = offset + end  # keys after the run's last query are never read (causal)
                kept = allowed[code][codes[:last]].nonzero().flatten().to(query.device)
                if not kept.numel():
                    continue
                q = q_heads[:, start:end]  # [h, n, D]
                k, v = k_heads.index_select(1, kept), v_heads.index_select(1, kept)  # [h, m, D]
                mask = kept[None, :] <= positions[offset + start:offset + end, None]  # [n, m]: causal
                empty = ~mask.any(dim=-1, keepdim=True)  # a query whose kept keys all come later
                piece = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask | empty,
                                                                         scale=scale)
                out[b, heads_index, start:end] = piece.masked_fill(empty, 0.0)
    return out.to(query.dtype)
