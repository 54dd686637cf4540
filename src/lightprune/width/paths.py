"""MWOP's vocabulary (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), section 3):
token modality codes, attention paths, FFN modalities.

A leaf: every width module and the kernels use these codes and the path rule, and it imports nothing
from lightprune. Path b = (query modality -> key modality); the (query, key) pairs of each path are
`path_masks`, and a head's keep flags become a pair mask with `path_keep`.
"""

from __future__ import annotations

import torch

__all__ = ["SYSTEM", "VISION", "TEXT", "PAD", "MODALITY_NAMES", "PATHS", "MODALITIES", "path_masks", "path_keep"]

#: token modality codes (int8), see :func:`lightprune.width.modality.token_modality`
SYSTEM, VISION, TEXT, PAD = 0, 1, 2, 3
MODALITY_NAMES = {SYSTEM: "system", VISION: "vision", TEXT: "text", PAD: "pad"}
#: attention paths (query modality -> key modality), the column order of ``WidthPlan.attn_keep``
PATHS: tuple[str, ...] = ("v2v", "t2v", "t2t")
#: FFN execution modalities, the keys of ``WidthPlan.ffn_keep[layer]``
MODALITIES: tuple[str, ...] = ("vision", "text")


def path_masks(query_mod: torch.Tensor, key_mod: torch.Tensor) -> torch.Tensor:
    """bool [3, B, Q, K]: the (query, key) pairs of each path in ``PATHS`` order (V2V, T2V, T2T)."""
    qv, qt = (query_mod == VISION)[:, :, None], (query_mod == TEXT)[:, :, None]
    kv, kt = (key_mod == VISION)[:, None, :], (key_mod == TEXT)[:, None, :]
    return torch.stack([qv & kv, qt & kv, qt & kt])


def path_keep(paths: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """bool [B, H, Q, K]: False where the pair's path is pruned for the head (``keep`` bool [H, 3])."""
    pruned = torch.zeros((paths.shape[1], keep.shape[0], *paths.shape[2:]), dtype=torch.bool, device=paths.device)
    for p in range(paths.shape[0]):
        dropped = ~keep[:, p].to(paths.device)
        if dropped.any():
            pruned |= paths[p][:, None] & dropped[None, :, None, None]
    return ~pruned
