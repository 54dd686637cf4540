"""Valid forward batches for the tiny models of `lightprune.testing.tiny` (and any model of a family):
`tiny_text_batch` (text ids that avoid every special id the config names, the last sample shorter and padded) and
`tiny_multimodal_batch` (text around each family's image placeholders; the images part per family in
`lightprune.testing.images`, which says what each family's placeholders and pixel inputs are).

Samples differ in length (the last one is ``pad_last`` tokens shorter) and in their number of vision tokens, so
padding and per-sample counts are exercised.
"""

from __future__ import annotations

import torch
from torch import nn

from lightprune.testing.images import GRIDDED, IMAGE_FAMILIES, QWEN_STYLE, TYPED, images_of

__all__ = ["special_token_ids", "tiny_multimodal_batch", "tiny_text_batch"]

_SPECIAL_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
                 "image_start_token_id", "image_end_token_id", "video_start_token_id", "video_end_token_id",
                 "audio_token_id", "audio_start_token_id", "boi_token_id", "eoi_token_id", "boa_token_id",
                 "eoa_token_index", "boi_token_index", "eoi_token_index", "pad_token_id", "bos_token_id",
                 "eos_token_id")


def special_token_ids(config) -> set[int]:
    """Every token id the config (and its text config) names: vision placeholders, markers, pad/bos/eos."""
    found: set[int] = set()
    for cfg in (config, getattr(config, "text_config", None)):
        if cfg is None:
            continue
        for key in _SPECIAL_KEYS:
            value = getattr(cfg, key, None)
            for v in (value if isinstance(value, (list, tuple)) else [value]):
                if v is not None:
                    found.add(int(v))
    return found


def _vocab_size(config) -> int:
    text = getattr(config, "text_config", None) or config
    return int(text.vocab_size)


def _text_ids(config, n: int, gen: torch.Generator) -> torch.Tensor:
    special = special_token_ids(config) | {_pad_id(config)}
    allowed = torch.tensor([i for i in range(_vocab_size(config)) if i not in special])
    return allowed[torch.randint(len(allowed), (n,), generator=gen)]


def _pad_id(config) -> int:
    text = getattr(config, "text_config", None) or config
    pad = getattr(text, "pad_token_id", None)
    if pad is None:
        pad = getattr(config, "pad_token_id", None)
    vision = {getattr(config, k, None) for k in ("image_token_id", "video_token_id")}
    if pad is None or pad in vision:
        special = special_token_ids(config)
        pad = next(i for i in range(_vocab_size(config)) if i not in special)
    return int(pad)


def _collate(seqs: list[torch.Tensor], types: list[torch.Tensor], pad_id: int, padding_side: str):
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    length = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.long)
    mm = torch.zeros((len(seqs), length), dtype=torch.long)
    for b, (seq, typ) in enumerate(zip(seqs, types)):
        sl = slice(length - len(seq), length) if padding_side == "left" else slice(0, len(seq))
        ids[b, sl], mask[b, sl], mm[b, sl] = seq, 1, typ
    return ids, mask, mm


def tiny_text_batch(model: nn.Module, batch_size: int = 2, seq_len: int = 12, seed: int = 0, pad: bool = True,
                    padding_side: str = "right") -> dict[str, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` [batch_size, seq_len] of random non-special ids.

    With ``pad`` the last sample is ``seq_len // 3`` tokens shorter, padded on ``padding_side``.
    """
    gen = torch.Generator().manual_seed(seed)
    config = model.config
    lengths = [seq_len] * batch_size
    if pad and batch_size > 1:
        lengths[-1] = seq_len - max(1, seq_len // 3)
    seqs = [_text_ids(config, n, gen) for n in lengths]
    ids, mask, _ = _collate(seqs, [torch.zeros(n, dtype=torch.long) for n in lengths], _pad_id(config), padding_side)
    return {"input_ids": ids, "attention_mask": mask}

def tiny_multimodal_batch(model: nn.Module, batch_size: int = 2, text_tokens: tuple[int, int] = (4, 6),
                          images_per_sample: int = 1, seed: int = 0, pad_last: int = 2,
                          padding_side: str = "left") -> dict[str, torch.Tensor]:
    """A valid ``model(**batch)`` input for a model of the tiny MLLM families (Qwen-VL-style patches: Qwen3-VL-MoE,
    Qwen3.5-MoE, Qwen3-Omni's thinker, Qwen4-exp, Qwen2.5-VL, GLM-4.5V; InternVL; LLaVA-OneVision; Gemma 4; Hy4-VL,
    dots3-note, DeepSeek-OCR 2, Unlimited-OCR, Aria, MiniMax-M3 VL, GLM-5, Mistral Large 4, Llama 4,
    Step 3.7, Inkling 2 (and Loop), Nemotron-H Omni, Muse Spark).

    Each sample is ``text_tokens[0]`` text ids, then ``images_per_sample`` images (one text id between
    two images), then ``text_tokens[1]`` text ids, so the closing text attends to every image. The last
    sample's closing text is ``pad_last`` ids shorter and padded on ``padding_side``.
    ``images_per_sample=0`` gives a text-only batch (no pixel inputs).
    """
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in IMAGE_FAMILIES:
        raise ValueError(f"tiny_multimodal_batch supports {list(IMAGE_FAMILIES)}, got {model_type!r}")
    before, after = text_tokens
    if images_per_sample < 0 or before < 0 or after < 1:
        raise ValueError(f"need images_per_sample >= 0, text_tokens[0] >= 0 and text_tokens[1] >= 1, "
                         f"got {images_per_sample}, {text_tokens}")
    if batch_size > 1 and not 0 <= pad_last < after:
        raise ValueError(f"pad_last must be in [0, text_tokens[1]) = [0, {after}), got {pad_last}")
    gen = torch.Generator().manual_seed(seed)
    qwen = model_type in QWEN_STYLE
    seqs, types, pixels, extras = [], [], [], []
    for b in range(batch_size):
        counts, pix, extra = images_of(model_type)(config, images_per_sample, b, gen)
        pixels.append(pix)
        extras.append(extra)
        n_after = after - (pad_last if b == batch_size - 1 and batch_size > 1 else 0)
        parts = [_text_ids(config, before, gen)]
        for j, count in enumerate(counts):
            if j:
                parts.append(_text_ids(config, 1, gen))
            image = torch.full((count,), config.image_token_id, dtype=torch.long)
            if model_type in ("glm4v_moe", "glm5_next"):
                image = torch.cat([torch.tensor([config.image_start_token_id]), image,
                                   torch.tensor([config.image_end_token_id])])
            elif qwen:
                image = torch.cat([torch.tensor([config.vision_start_token_id]), image,
                                   torch.tensor([config.vision_end_token_id])])
            elif model_type == "gemma4":
                image = torch.cat([torch.tensor([config.boi_token_id]), image, torch.tensor([config.eoi_token_id])])
            parts.append(image)
        parts.append(_text_ids(config, n_after, gen))
        seq = torch.cat(parts)
        seqs.append(seq)
        types.append((seq == config.image_token_id).long())
    ids, mask, mm = _collate(seqs, types, _pad_id(config), padding_side)
    batch = {"input_ids": ids, "attention_mask": mask}
    if images_per_sample and model_type == "llava_onevision":
        tiles = max(p.shape[1] for p in pixels)
        batch["pixel_values"] = torch.cat([nn.functional.pad(p, (0, 0, 0, 0, 0, 0, 0, tiles - p.shape[1]))
                                           for p in pixels])
        batch["image_sizes"] = torch.cat(extras)
        batch["batch_num_images"] = torch.full((batch_size,), images_per_sample, dtype=torch.long)
    elif images_per_sample:
        batch["pixel_values"] = torch.cat(pixels)
        if model_type in GRIDDED:
            batch["image_grid_thw"] = torch.cat(extras)
        elif model_type == "gemma4":
            batch["image_position_ids"] = torch.cat(extras)
        elif model_type == "aria":
            batch["pixel_mask"] = torch.cat(extras)
        elif model_type == "mistral_large4":
            batch["image_sizes"] = torch.cat(extras)
        elif model_type == "nemotron_h_omni":
            batch["image_grid_hw"] = torch.cat(extras)
    if model_type in TYPED or model_type == "gemma4":
        batch["mm_token_type_ids"] = mm
    return batch
