"""Retained key intervals of MWOP path-sparse attention, per (sample, head, query block) (MWOP ("MWOP:
Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), appendix D.5).

MWOP appendix D.5: for query i of layer l and head h the retained causal key set is
``A_(l,h)(i) = {j <= i : key j is not PAD and the path (modality(i) -> modality(j)) is kept for h}``,
and the kernel "traverses only the retained key intervals". A query block ``I`` (``block_q``
consecutive queries) walks the union ``U(I) = union over i in I of A(i)``, written as sorted, disjoint
half-open runs ``[start, end)`` of key positions; inside each tile the kernel masks every element
exactly, so the union only has to contain every retained key, and it contains no others.

The path rule itself is not re-derived here: `class_table` evaluates
`lightprune.width.paths.path_masks` / ``path_keep`` (the mask-mode reference) on the
grid of modality codes, giving ``allowed[h, query code, key code]`` (PAD keys never attended). Then key
j belongs to ``U(I)`` iff ``j <= reach(I, h, modality(j))`` where
``reach(I, h, c) = max {i in I : allowed[h, modality(i), c]}`` (-1 when there is none): the causal
clip of the union, computed in torch without any [Q, K] matrix.
"""

from __future__ import annotations

import torch

from lightprune.width.paths import PAD, path_keep, path_masks

__all__ = ["NUM_CODES", "class_table", "class_bits", "key_intervals"]

#: modality codes SYSTEM, VISION, TEXT, PAD (lightprune.width.layers)
NUM_CODES = 4


def class_table(keep: torch.Tensor) -> torch.Tensor:
    """bool [H, 4, 4]: ``allowed[h, query code, key code]`` from the mask-mode path rule; PAD keys False."""
    codes = torch.arange(NUM_CODES, device=keep.device)
    paths = path_masks(codes[None, :], codes[None, :])  # [3, 1, 4(query), 4(key)]
    allowed = path_keep(paths, keep.bool())[0]  # [H, 4, 4]
    return allowed & (codes != PAD)[None, None, :]


def class_bits(keep: torch.Tensor) -> torch.Tensor:
    """int32 [H]: `class_table` packed per head, bit ``query code * 4 + key code`` (the Triton kernel's
    form; build it once per plan, as building it synchronises with the host)."""
    allowed = class_table(keep).reshape(keep.shape[0], NUM_CODES * NUM_CODES).to(torch.int32)
    shifts = torch.arange(NUM_CODES * NUM_CODES, device=allowed.device, dtype=torch.int32)
    return (allowed << shifts).sum(dim=1, dtype=torch.int32)


def key_intervals(modality: torch.Tensor, keep: torch.Tensor, q_len: int | None = None,
                  block_q: int = 16) -> torch.Tensor:
    """int32 [B, H, n_qblocks, max_intervals, 2]: the runs ``[start, end)`` of ``U(I)`` (module docstring).

    ``modality`` int [B, K]; ``keep`` bool [H, 3]; the queries are the last ``q_len`` (default K) keys;
    query block ``n`` holds queries ``n * block_q ...`` (in query index), i.e. positions ``K - Q + ...``.
    Runs are sorted; a block has ``max_intervals`` slots, the unused ones are ``[0, 0)`` (empty).
    """
    if modality.dim() != 2:
        raise ValueError(f"modality must be [B, K], got {tuple(modality.shape)}")
    batch, k_len = modality.shape
    q_len = k_len if q_len is None else int(q_len)
    if not 0 < q_len <= k_len:
        raise ValueError(f"q_len must be in 1..K={k_len}, got {q_len}")
    if block_q < 1:
        raise ValueError(f"block_q must be a positive int, got {block_q}")
    device = modality.device
    mod = modality.long()
    allowed = class_table(keep.to(device))  # [H, 4, 4]
    n_blocks = -(-q_len // block_q)
    offset = k_len - q_len
    # last[b, n, c]: the largest position of a query of code c in block n (-1 when none)
    q_idx = torch.arange(n_blocks * block_q, device=device)
    pos = q_idx + offset
    valid = q_idx < q_len
    q_mod = mod[:, offset:]
    q_mod = torch.cat([q_mod, q_mod.new_zeros(batch, n_blocks * block_q - q_len)], dim=1)
    codes = torch.arange(NUM_CODES, device=device)
    is_code = (q_mod[:, :, None] == codes) & valid[None, :, None]  # [B, nQ, 4]
    pos_code = torch.where(is_code, pos[None, :, None], -1).view(batch, n_blocks, block_q, NUM_CODES)
    last = pos_code.amax(dim=2)  # [B, n, 4(query code)]
    # reach[b, h, n, key code] = max over allowed query codes of last
    reach = torch.where(allowed[None, :, None], last[:, None, :, :, None], -1).amax(dim=3)  # [B, H, n, 4]
    key_pos = torch.arange(k_len, device=device)
    key_reach = torch.gather(reach, 3, mod[:, None, None, :].expand(batch, reach.shape[1], n_blocks, k_len))
    member = key_pos <= key_reach  # [B, H, n, K]; reach -1 (and PAD: never allowed) excludes
    return _runs(member)


def _runs(member: torch.Tensor) -> torch.Tensor:
    """int32 [..., max_runs, 2]: the maximal runs of True along the last dim, sorted, padded with [0, 0)."""
    lead, k_len = member.shape[:-1], member.shape[-1]
    flat = member.reshape(-1, k_len)
    pad = flat.new_zeros(flat.shape[0], 1)
    before = torch.cat([pad, flat[:, :-1]], dim=1)
    after = torch.cat([flat[:, 1:], pad], dim=1)
    starts = flat & ~before
    ends = flat & ~after  # inclusive end of a run
    count = starts.sum(dim=1)
    max_runs = max(int(count.max()) if count.numel() else 0, 1)
    table = torch.zeros(flat.shape[0], max_runs, 2, dtype=torch.int32, device=member.device)
    rows, cols = starts.nonzero(as_tuple=True)  # row-major: runs in order within each row
    slot = torch.cumsum(starts.int(), dim=1)[rows, cols] - 1
    table[rows, slot, 0] = cols.int()
    e_rows, e_cols = ends.nonzero(as_tuple=True)
    e_slot = torch.cumsum(ends.int(), dim=1)[e_rows, e_cols] - 1
    table[e_rows, e_slot, 1] = e_cols.int() + 1
    return table.view(*lead, max_runs, 2)
