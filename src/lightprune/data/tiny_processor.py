"""A local Qwen3-VL processor for the tiny ``qwen3_vl_moe`` model (nothing downloaded).

:func:`tiny_qwen3_vl_processor` builds, from the tiny model's config:

- a byte-level BPE tokenizer of the config's vocabulary size (128) whose vision tokens have
  the config's ids (``<|image_pad|>`` = ``image_token_id`` = 120, ``<|video_pad|>`` = 121,
  ``<|vision_start|>`` = 122, ``<|vision_end|>`` = 123), trained on a small built-in corpus
  that covers printable ASCII, with a ChatML template that renders image parts as
  ``<|vision_start|><|image_pad|><|vision_end|>``;
- a Qwen2-VL image processor (the class Qwen3-VL uses) with the config's ``patch_size`` (4),
  ``merge_size`` (``spatial_merge_size``, 2) and ``temporal_patch_size`` (2), and small
  ``min_pixels`` / ``max_pixels``.

An image of H x W pixels is resized to (h, w), multiples of ``patch_size * merge_size`` with
``min_pixels <= h * w <= max_pixels`` (Qwen's ``smart_resize``); ``image_grid_thw`` is
(1, h / patch, w / patch) and the processor expands ``<|image_pad|>`` to
``h * w / (patch * merge)**2`` tokens.

:class:`TinyQwen3VLProcessor` is transformers' ``Qwen3VLProcessor`` without a video processor:
transformers' video processors need torchvision, which lightprune does not depend on. It is
registered with ``AutoProcessor`` when this module is imported (``lightprune.data`` imports it
before loading a processor), so a saved one loads with ``AutoProcessor.from_pretrained(dir)``.
Videos are not supported by it.
"""

from __future__ import annotations

import string

from transformers import AutoProcessor, Qwen3VLProcessor

from .tokenizer import CHAT_TOKENS, IMAGE_TOKENS, train_bpe_tokenizer

__all__ = ["TINY_CORPUS", "TinyQwen3VLProcessor", "tiny_qwen3_vl_processor", "tiny_qwen3_vl_tokenizer"]

TINY_CORPUS: tuple[str, ...] = (
    string.printable,
    "What is in the image? A red square on a blue background.",
    "Describe the picture. There is a green circle and a small yellow triangle.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "user assistant system: Question? Answer. Hello, world!",
)


class TinyQwen3VLProcessor(Qwen3VLProcessor):
    """``Qwen3VLProcessor`` with an image processor and a tokenizer only (no video processor)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                         chat_template=chat_template, **kwargs)


# a string key (not a config class): the class is found by name when a saved processor loads,
# and no transformers model's mapping changes
AutoProcessor.register("lightprune_tiny_qwen3_vl", TinyQwen3VLProcessor, exist_ok=True)


def _vision_ids(config) -> dict[str, int]:
    return {"<|image_pad|>": config.image_token_id, "<|video_pad|>": config.video_token_id,
            "<|vision_start|>": config.vision_start_token_id, "<|vision_end|>": config.vision_end_token_id}


def tiny_qwen3_vl_tokenizer(config=None, texts=TINY_CORPUS):
    """A tokenizer for the tiny Qwen3-VL config: its vocabulary size, its vision token ids."""
    if config is None:
        from ..models.tiny import tiny_config

        config = tiny_config("qwen3_vl_moe")
    return train_bpe_tokenizer(texts, config.text_config.vocab_size, CHAT_TOKENS, image_tokens=IMAGE_TOKENS,
                               token_ids=_vision_ids(config), model_max_length=config.text_config.max_position_embeddings)


def tiny_qwen3_vl_processor(tokenizer=None, *, config=None, min_pixels: int = 8 * 8,
                            max_pixels: int = 32 * 32) -> TinyQwen3VLProcessor:
    """A Qwen3-VL processor for ``tiny_model("qwen3_vl_moe")`` (or ``config``).

    Args:
        tokenizer: a tokenizer whose vision tokens have the config's ids (default:
            :func:`tiny_qwen3_vl_tokenizer`); checked.
        config: a ``Qwen3VLMoeConfig`` (default: ``tiny_config("qwen3_vl_moe")``).
        min_pixels, max_pixels: the resized image's area bounds (defaults: 64 and 1024 pixels,
            i.e. 1 to 16 image tokens at patch 4, merge 2).
    """
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    if config is None:
        from ..models.tiny import tiny_config

        config = tiny_config("qwen3_vl_moe")
    if tokenizer is None:
        tokenizer = tiny_qwen3_vl_tokenizer(config)
    wanted = _vision_ids(config)
    got = {t: tokenizer.convert_tokens_to_ids(t) for t in wanted}
    if got != wanted:
        raise ValueError(f"the tokenizer's vision token ids {got} differ from the config's {wanted}")
    if len(tokenizer) > config.text_config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} ids, more than the model's vocab_size "
                         f"{config.text_config.vocab_size}")
    vision = config.vision_config
    factor = vision.patch_size * vision.spatial_merge_size
    if not factor * factor <= min_pixels <= max_pixels:
        raise ValueError(f"need {factor * factor} <= min_pixels <= max_pixels (one merged patch is "
                         f"{factor}x{factor} pixels), got min_pixels={min_pixels}, max_pixels={max_pixels}")
    image_processor = Qwen2VLImageProcessorPil(patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
                                               temporal_patch_size=vision.temporal_patch_size,
                                               min_pixels=min_pixels, max_pixels=max_pixels)
    return TinyQwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                chat_template=tokenizer.chat_template)
