"""The modality of every token of an MLLM batch (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for
Efficient MLLMs"), section 3 and appendix D.5).

[`token_modality`][] labels each token (section 3 and appendix D.5):

- ``PAD`` where ``attention_mask`` is 0;
- ``VISION`` at an image / video placeholder id (the positions the vision features replace);
- ``SYSTEM`` every other token before the sample's first vision token: "system tokens are never
  pruned", and interactions with the text preceding the visual span stay unpruned;
- ``TEXT`` every other token. A sample without vision tokens is all TEXT.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from lightprune.width.layers import vision_token_ids
from lightprune.width.paths import PAD, SYSTEM, TEXT, VISION

__all__ = ["token_modality", "token_profile"]


def token_modality(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   vision_ids) -> torch.Tensor:
    """int8 [B, T]: `SYSTEM`, `VISION`, `TEXT` or `PAD` per token (module docstring)."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        got = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be a [B, T] tensor, got {got}")
    if attention_mask is None:
        valid = torch.ones_like(input_ids, dtype=torch.bool)
    else:
        if tuple(attention_mask.shape) != tuple(input_ids.shape):
            raise ValueError(f"attention_mask {tuple(attention_mask.shape)} must match input_ids "
                             f"{tuple(input_ids.shape)}")
        valid = attention_mask.bool()
    ids = torch.as_tensor(sorted(int(i) for i in vision_ids), dtype=input_ids.dtype, device=input_ids.device)
    vision = torch.isin(input_ids, ids) & valid
    before_first = vision.int().cumsum(dim=1) == 0
    system = valid & ~vision & before_first & vision.any(dim=1, keepdim=True)
    out = torch.full(input_ids.shape, PAD, dtype=torch.int8, device=input_ids.device)
    out[valid] = TEXT
    out[system] = SYSTEM
    out[vision] = VISION
    return out


def token_profile(model: torch.nn.Module, batches: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean vision and text tokens per sample of ``batches`` (system tokens and padding excluded)."""
    ids = vision_token_ids(model)
    vision = text = samples = 0
    for batch in batches:
        modality = token_modality(batch["input_ids"], batch.get("attention_mask"), ids)
        vision += int((modality == VISION).sum())
        text += int((modality == TEXT).sum())
        samples += modality.shape[0]
    if samples == 0:
        raise ValueError("no samples in the batches: no token profile for the FLOPs count")
    return {"vision_tokens": round(vision / samples), "text_tokens": round(text / samples),
            "mean_vision_tokens": vision / samples, "mean_text_tokens": text / samples, "samples": samples}
