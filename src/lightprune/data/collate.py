"""Batching: pad the per-token tensors of samples to one length, concatenate the per-image ones.

A sample is a dict of tensors. Per-token tensors (``input_ids``, ``labels``,
``attention_mask``, ``token_type_ids``, ``mm_token_type_ids``) are 1-D and are padded to the
longest sample (rounded up to ``pad_to_multiple_of``) on ``padding_side``: ``input_ids`` with the
pad id, ``labels`` with -100, the others with 0. The label of a row's first token is -100 (no
token predicts it; with left padding the last pad would), so the loss is the same with either
padding side. Every other tensor (``pixel_values``,
``image_grid_thw``, ``image_sizes``, ...) indexes images or patches along dim 0 and is
concatenated over the samples that have it; a batch in which no sample has it lacks the key.
``task_ids`` (one id per sample, see `ImageTextJsonlDataModule`) is such a
tensor, so it becomes ``[B]``. Per-image tensors that differ only in dim 1 (LLaVA-OneVision's
``pixel_values [images, tiles, C, H, W]``: an image's tile count depends on its size) are zero-padded
in dim 1 to the largest, as the model's processor pads the images of one call; the model reads only
an image's own tiles. Any other shape mismatch is an error naming the key.
"""

from __future__ import annotations

import torch

__all__ = ["TOKEN_KEYS", "Collator"]

TOKEN_KEYS = ("input_ids", "labels", "attention_mask", "token_type_ids", "mm_token_type_ids")
_PAD = {"labels": -100}
PADDING_SIDES = ("right", "left")


class Collator:
    """``collate(samples) -> batch``; picklable, for DataLoader workers."""

    def __init__(self, pad_id: int, padding_side: str = "right", pad_to_multiple_of: int | None = None):
        if padding_side not in PADDING_SIDES:
            raise ValueError(f"padding_side must be one of {PADDING_SIDES}, got {padding_side!r}")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        self.pad_id = pad_id
        self.padding_side = padding_side
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        lengths = [len(s["input_ids"]) for s in samples]
        width = max(lengths)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        token_keys = [k for k in TOKEN_KEYS if any(k in s for s in samples)]
        if "attention_mask" not in token_keys:
            token_keys.append("attention_mask")
        batch: dict[str, torch.Tensor] = {}
        for key in token_keys:
            fill = self.pad_id if key == "input_ids" else _PAD.get(key, 0)
            out = torch.full((len(samples), width), fill, dtype=torch.long)
            for row, (sample, n) in enumerate(zip(samples, lengths)):
                if key in sample:
                    value = sample[key]
                elif key == "attention_mask":
                    value = torch.ones(n, dtype=torch.long)
                elif key == "labels":
                    value = sample["input_ids"]
                else:
                    value = torch.zeros(n, dtype=torch.long)
                if key == "labels":
                    # nothing predicts a row's first token; with left padding a pad position would
                    value = value.clone()
                    value[:1] = -100
                if self.padding_side == "right":
                    out[row, :n] = value
                else:
                    out[row, width - n:] = value
            batch[key] = out
        others = sorted({k for s in samples for k in s if k not in TOKEN_KEYS})
        for key in others:
            batch[key] = torch.cat(_pad_dim1(key, [s[key] for s in samples if key in s]), dim=0)
        return batch


def _pad_dim1(key: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` zero-padded in dim 1 to the largest; they must agree in every dim but 0 and 1."""
    shapes = {tuple(t.shape[2:]) if t.dim() >= 2 else None for t in tensors}
    if len({t.dim() for t in tensors}) > 1 or len(shapes) > 1:
        raise ValueError(f"cannot batch {key!r}: the samples' shapes {[tuple(t.shape) for t in tensors]} differ "
                         "beyond dims 0 and 1")
    if tensors[0].dim() < 2:
        return tensors
    width = max(t.shape[1] for t in tensors)
    out = []
    for t in tensors:
        if t.shape[1] < width:
            pad = t.new_zeros((t.shape[0], width - t.shape[1], *t.shape[2:]))
            t = torch.cat([t, pad], dim=1)
        out.append(t)
    return out
