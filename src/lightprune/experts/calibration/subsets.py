"""Token subsets of a batch: all, text, vision, and the low / high text-to-vision attention ones.

A token belongs to ``all`` when its attention mask is 1 (padding never counts), to ``vision``
when its id is one of the model's image/video placeholder ids, to ``text`` otherwise. The
attention subsets are chosen per layer from that layer's own text-to-vision attention (MAEP ("Modality-Aware
Expert Pruning for MoE-Based Multimodal Large Language Models", arXiv 2611.05927), sections 4.2 and 5.2): the
bottom / top q fraction of each sample's vision tokens.
"""

from __future__ import annotations

from typing import Mapping

import torch

from lightprune.core.choices import ATTENTION_SUBSETS, SUBSETS, VISION_SUBSETS

__all__ = ["SUBSETS", "ATTENTION_SUBSETS", "VISION_SUBSETS", "base_masks", "check_subsets"]



def check_subsets(subsets, vision_token_ids: tuple[int, ...]) -> tuple[str, ...]:
    """Validate the requested subsets against the model; returns them as a tuple without duplicates."""
    subsets = tuple(dict.fromkeys(subsets))
    if not subsets:
        raise ValueError(f"no token subsets requested; choose from {SUBSETS}")
    unknown = [s for s in subsets if s not in SUBSETS]
    if unknown:
        raise ValueError(f"unknown token subsets {unknown}; choose from {SUBSETS}")
    vision = [s for s in subsets if s in VISION_SUBSETS]
    if vision and not vision_token_ids:
        raise ValueError(f"subsets {vision} need vision tokens, but this model has no image/video token ids "
                         "(a text-only model): use 'all' or 'text'")
    return subsets


def base_masks(batch: Mapping[str, torch.Tensor], vision_token_ids: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """``{"all", "text", "vision"}`` -> bool [B, S] for one batch."""
    input_ids = batch.get("input_ids")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("calibration batches need 2D input_ids [batch, sequence]")
    attention = batch.get("attention_mask")
    valid = torch.ones_like(input_ids, dtype=torch.bool) if attention is None else attention.bool()
    if vision_token_ids:
        ids = torch.tensor(vision_token_ids, device=input_ids.device)
        vision = torch.isin(input_ids, ids) & valid
    else:
        vision = torch.zeros_like(valid)
    return {"all": valid, "text": valid & ~vision, "vision": vision}
