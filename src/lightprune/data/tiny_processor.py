"""Local processors for the tiny multimodal models (nothing downloaded).

One recipe for every tiny MLLM family of `lightprune.testing.tiny`, from the tiny model's config:

- a byte-level BPE tokenizer of the config's vocabulary size (128) whose vision tokens have the
  config's ids, trained on a small built-in corpus that covers printable ASCII (or on ``texts``),
  with a ChatML template that renders an image part as the family's placeholder;
- the family's image processor, with the config's geometry and small pixel bounds.

Families (`TINY_PROCESSOR_FAMILIES`):

- ``qwen3_vl_moe`` and ``qwen2_5_vl``: vision tokens ``<|image_pad|>`` = ``image_token_id`` (120),
  ``<|video_pad|>`` = 121, ``<|vision_start|>`` = 122, ``<|vision_end|>`` = 123; an image part renders as
  ``<|vision_start|><|image_pad|><|vision_end|>``. The Qwen2-VL image processor (which both use) gets the
  vision config's ``patch_size`` (4), ``merge_size`` (``spatial_merge_size``, 2), ``temporal_patch_size``
  (2) and ``min_pixels`` / ``max_pixels``: an H x W image is resized to (h, w), multiples of
  ``patch_size * merge_size`` with ``min_pixels <= h * w <= max_pixels`` (Qwen's ``smart_resize``);
  ``image_grid_thw`` is (1, h / patch, w / patch) and ``<|image_pad|>`` expands to
  ``h * w / (patch * merge)**2`` tokens.
- ``llava_onevision``: ``<image>`` = ``image_token_id`` (120), ``<video>`` = 121; an image part renders as
  ``<image>``. The LLaVA-OneVision image processor gets tiles of the vision tower's ``image_size`` (16) and
  the config's ``image_grid_pinpoints``; the processor expands ``<image>`` to the anyres count
  (`lightprune.testing.images.llava_onevision_image_tokens`: base tile, unpadded grid, one
  newline per row), with ``num_image_tokens`` = features of one tile.

The processor classes are transformers' own without a video processor (transformers' video processors
need torchvision, which lightprune does not depend on; videos are not supported by them). They are
registered with ``AutoProcessor`` when this module is imported (``lightprune.data`` imports it before
loading a processor), so a saved one loads with ``AutoProcessor.from_pretrained(dir)``.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from transformers import AutoProcessor, LlavaOnevisionProcessor, Qwen2_5_VLProcessor, Qwen3VLProcessor

from lightprune.data.tokenizer import CHAT_TOKENS, CHATML_TEMPLATE, IMAGE_TOKENS, train_bpe_tokenizer
from lightprune.testing.tiny import tiny_config

__all__ = ["TINY_CORPUS", "TINY_PROCESSOR_FAMILIES", "TinyLlavaOnevisionProcessor", "TinyQwen2_5VLProcessor",
           "TinyQwen3VLProcessor", "tiny_llava_onevision_processor", "tiny_mllm_processor", "tiny_mllm_tokenizer",
           "tiny_qwen2_5_vl_processor", "tiny_qwen3_vl_processor", "tiny_qwen3_vl_tokenizer"]

TINY_CORPUS: tuple[str, ...] = (
    string.printable,
    "What is in the image? A red square on a blue background.",
    "Describe the picture. There is a green circle and a small yellow triangle.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "user assistant system: Question? Answer. Hello, world!",
)


class _NoVideo:
    """Mixin: a processor built from an image processor and a tokenizer only (its attributes are those two)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                         chat_template=chat_template, **kwargs)


class TinyQwen3VLProcessor(_NoVideo, Qwen3VLProcessor):
    """``Qwen3VLProcessor`` with an image processor and a tokenizer only (no video processor)."""


class TinyQwen2_5VLProcessor(_NoVideo, Qwen2_5_VLProcessor):
    """``Qwen2_5_VLProcessor`` with an image processor and a tokenizer only (no video processor)."""


class TinyLlavaOnevisionProcessor(LlavaOnevisionProcessor):
    """``LlavaOnevisionProcessor`` with an image processor and a tokenizer only (no video processor).

    The arguments are named (not ``**kwargs``) so that ``save_pretrained`` stores them.
    """

    def __init__(self, image_processor=None, tokenizer=None, num_image_tokens=None,
                 vision_feature_select_strategy=None, chat_template=None, image_token="<image>",
                 video_token="<video>", vision_aspect_ratio="anyres_max_9", **kwargs):
        super().__init__(image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                         num_image_tokens=num_image_tokens,
                         vision_feature_select_strategy=vision_feature_select_strategy, chat_template=chat_template,
                         image_token=image_token, video_token=video_token,
                         vision_aspect_ratio=vision_aspect_ratio, **kwargs)


# string keys (not config classes): the class is found by name when a saved processor loads, and no
# transformers model's mapping changes
for _key, _cls in (("lightprune_tiny_qwen3_vl", TinyQwen3VLProcessor),
                   ("lightprune_tiny_qwen2_5_vl", TinyQwen2_5VLProcessor),
                   ("lightprune_tiny_llava_onevision", TinyLlavaOnevisionProcessor)):
    AutoProcessor.register(_key, _cls, exist_ok=True)

_QWEN_IMAGE_PART = "<|vision_start|><|image_pad|><|vision_end|>"
_QWEN_VIDEO_PART = "<|vision_start|><|video_pad|><|vision_end|>"
# token -> config attribute that holds its id, per family
_TOKENS = {
    "qwen3_vl_moe": {"<|image_pad|>": "image_token_id", "<|video_pad|>": "video_token_id",
                     "<|vision_start|>": "vision_start_token_id", "<|vision_end|>": "vision_end_token_id"},
    "llava_onevision": {"<image>": "image_token_id", "<video>": "video_token_id"},
}
_TOKENS["qwen2_5_vl"] = _TOKENS["qwen3_vl_moe"]
TINY_PROCESSOR_FAMILIES: tuple[str, ...] = tuple(_TOKENS)


def _family_config(family: str, config):
    if family not in _TOKENS:
        raise ValueError(f"no tiny processor for family {family!r}; choose one of {list(TINY_PROCESSOR_FAMILIES)}")
    if config is None:
        return tiny_config(family)
    return config


def _vision_ids(family: str, config) -> dict[str, int]:
    return {token: int(getattr(config, attr)) for token, attr in _TOKENS[family].items()}


def _chat_template(family: str) -> str:
    if family != "llava_onevision":
        return CHATML_TEMPLATE
    return CHATML_TEMPLATE.replace(_QWEN_IMAGE_PART, "<image>").replace(_QWEN_VIDEO_PART, "<video>")


def tiny_mllm_tokenizer(family: str, config=None, texts: Sequence[str] = TINY_CORPUS):
    """A tokenizer for a tiny ``family`` config: its vocabulary size, its vision token ids, a ChatML template."""
    config = _family_config(family, config)
    text = config.text_config
    image_tokens = IMAGE_TOKENS if family != "llava_onevision" else ("<image>", "<video>")
    return train_bpe_tokenizer(texts, text.vocab_size, CHAT_TOKENS, image_tokens=image_tokens,
                               token_ids=_vision_ids(family, config), chat_template=_chat_template(family),
                               model_max_length=text.max_position_embeddings)


def tiny_qwen3_vl_tokenizer(config=None, texts: Sequence[str] = TINY_CORPUS):
    """A tokenizer for the tiny Qwen3-VL config: its vocabulary size, its vision token ids."""
    return tiny_mllm_tokenizer("qwen3_vl_moe", config, texts)


def _check_tokenizer(family: str, tokenizer, config) -> None:
    wanted = _vision_ids(family, config)
    got = {t: tokenizer.convert_tokens_to_ids(t) for t in wanted}
    if got != wanted:
        raise ValueError(f"the tokenizer's vision token ids {got} differ from the config's {wanted}")
    if len(tokenizer) > config.text_config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} ids, more than the model's vocab_size "
                         f"{config.text_config.vocab_size}")


def _qwen_image_processor(config, min_pixels: int, max_pixels: int):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    vision = config.vision_config
    factor = vision.patch_size * vision.spatial_merge_size
    if not factor * factor <= min_pixels <= max_pixels:
        raise ValueError(f"need {factor * factor} <= min_pixels <= max_pixels (one merged patch is "
                         f"{factor}x{factor} pixels), got min_pixels={min_pixels}, max_pixels={max_pixels}")
    return Qwen2VLImageProcessorPil(patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
                                    temporal_patch_size=vision.temporal_patch_size, min_pixels=min_pixels,
                                    max_pixels=max_pixels)


def tiny_mllm_processor(family: str, config=None, *, tokenizer=None, texts: Sequence[str] = TINY_CORPUS,
                   min_pixels: int = 8 * 8, max_pixels: int = 32 * 32):
    """A processor for ``tiny_model(family)`` (or a model of ``config``): see the module docstring.

    Args:
        family: one of `TINY_PROCESSOR_FAMILIES`.
        config: the model's config (default: ``tiny_config(family)``).
        tokenizer: a tokenizer whose vision tokens have the config's ids (default: `tiny_mllm_tokenizer`
            trained on ``texts``); checked.
        texts: the tokenizer's training texts when ``tokenizer`` is not given.
        min_pixels, max_pixels: Qwen families only: the resized image's area bounds (defaults: 64 and 1024
            pixels, i.e. 1 to 16 image tokens at patch 4, merge 2).
    """
    config = _family_config(family, config)
    if tokenizer is None:
        tokenizer = tiny_mllm_tokenizer(family, config, texts)
    _check_tokenizer(family, tokenizer, config)
    if family == "qwen3_vl_moe":
        return TinyQwen3VLProcessor(image_processor=_qwen_image_processor(config, min_pixels, max_pixels),
                                    tokenizer=tokenizer, chat_template=tokenizer.chat_template)
    if family == "qwen2_5_vl":
        return TinyQwen2_5VLProcessor(image_processor=_qwen_image_processor(config, min_pixels, max_pixels),
                                      tokenizer=tokenizer, chat_template=tokenizer.chat_template)
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import LlavaOnevisionImageProcessorPil

    vision = config.vision_config
    if config.vision_feature_select_strategy != "full":
        raise ValueError("the tiny LLaVA-OneVision processor needs vision_feature_select_strategy='full' "
                         f"(SigLIP has no CLS token), got {config.vision_feature_select_strategy!r}")
    size = int(vision.image_size)
    pinpoints = [list(p) for p in config.image_grid_pinpoints]
    image_processor = LlavaOnevisionImageProcessorPil(size={"height": size, "width": size},
                                                      image_grid_pinpoints=pinpoints, do_pad=True)
    return TinyLlavaOnevisionProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                       num_image_tokens=(size // int(vision.patch_size)) ** 2,
                                       vision_feature_select_strategy="full", chat_template=tokenizer.chat_template,
                                       vision_aspect_ratio=config.vision_aspect_ratio)


def tiny_qwen3_vl_processor(tokenizer=None, *, config=None, min_pixels: int = 8 * 8,
                            max_pixels: int = 32 * 32) -> TinyQwen3VLProcessor:
    """A Qwen3-VL processor for ``tiny_model("qwen3_vl_moe")`` (or ``config``); see `tiny_mllm_processor`."""
    return tiny_mllm_processor("qwen3_vl_moe", config, tokenizer=tokenizer, min_pixels=min_pixels,
                               max_pixels=max_pixels)


def tiny_qwen2_5_vl_processor(config=None, *, tokenizer=None, texts: Sequence[str] = TINY_CORPUS,
                              min_pixels: int = 8 * 8, max_pixels: int = 32 * 32) -> TinyQwen2_5VLProcessor:
    """A Qwen2.5-VL processor for ``tiny_model("qwen2_5_vl")`` (or ``config``); see `tiny_mllm_processor`."""
    return tiny_mllm_processor("qwen2_5_vl", config, tokenizer=tokenizer, texts=texts, min_pixels=min_pixels,
                               max_pixels=max_pixels)


def tiny_llava_onevision_processor(config=None, *, tokenizer=None,
                                   texts: Sequence[str] = TINY_CORPUS) -> TinyLlavaOnevisionProcessor:
    """A LLaVA-OneVision processor for ``tiny_model("llava_onevision")`` (or ``config``).

    See `tiny_mllm_processor`.
    """
    return tiny_mllm_processor("llava_onevision", config, tokenizer=tokenizer, texts=texts)
