"""The images part of `tiny_multimodal_batch`'s batches, per family: the placeholder counts, pixel inputs and
extra inputs a processor would hand the model, without a processor:

- Qwen3-VL-MoE: ``text, <vision_start>, <image> x (t*h*w / merge^2), <vision_end>, text``;
  ``pixel_values`` are the flattened patches ``[sum(t*h*w), C * temporal_patch * patch^2]`` with
  ``image_grid_thw [num_images, 3]``; ``mm_token_type_ids`` (text 0, image 1, video 2) is required by
  transformers 5.24 whenever ``image_grid_thw`` is given (it drives the 3D M-RoPE positions).
- Qwen3.5-MoE, Qwen3-Omni's thinker, Qwen4-exp: Qwen3-VL's layout and inputs; GLM-4.5V and GLM-5 the same between
  their ``image_start`` / ``image_end`` markers.
- Qwen2.5-VL: the same layout and inputs as Qwen3-VL (its vision tower adds windowed attention, which
  only changes the patch order inside the tower, not the count).
- InternVL: ``text, <image> x ((H/p) * (W/p) * downsample_ratio^2), text`` per image, one tile per
  image; ``pixel_values [num_images, C, H, W]`` at the vision config's ``image_size``. The count comes
  from the vision geometry, which is what the model produces (``config.image_seq_length`` is only read
  by the processor).
- Gemma 4: ``text, <boi>, <image> x (valid patches / pooling^2), <eoi>, text``; ``pixel_values [num_images, P,
  3 * patch^2]`` patches padded to one length P, ``image_position_ids [num_images, P, 2]`` their (x, y) grid
  positions, (-1, -1) for padding; ``mm_token_type_ids`` marks the placeholders (image 1).
- Hy4-VL, dots3-note, MiniMax-M3 VL: Qwen3-VL's grids as flat patches with ``image_grid_thw`` (one frame per patch
  but in MiniMax-M3 VL); Hy4-VL adds a newline placeholder after every merged row and needs ``mm_token_type_ids``
  (M-RoPE), the other two take neither markers nor token types.
- DeepSeek-OCR 2, Unlimited-OCR: one global view per image, ``pixel_values [num_images, C, S, S]`` at the SAM
  config's ``image_size``; ``text, <image> x n, text`` with n the learned queries + 1 view separator (DeepSeek-OCR 2)
  or the g x g feature grid with a newline per row + 1 view separator (Unlimited-OCR).
- Aria: ``text, <image> x queries, text`` (``projector_patch_to_query_dict`` of the tower's patch count);
  ``pixel_values [num_images, C, S, S]`` and ``pixel_mask [num_images, S, S]`` (all valid).
- Mistral Large 4 (Pixtral): ``text, <image> x (h / (p m)) * (w / (p m)), text`` (patch p, merge m);
  ``pixel_values [num_images, C, S, S]`` padded to the tower's ``image_size`` S, ``image_sizes [num_images, 2]`` each
  image's (h, w), multiples of p m that differ by image and sample.
- Llama 4: ``text, <image> x ((S/p)^2 * pixel_shuffle_ratio^2), text`` per image; ``pixel_values [num_images, C, S,
  S]`` at the vision config's ``image_size``.
- Step 3.7: ``text, <image> x (S / p / 4)^2, text``, ``pixel_values [num_images, C, S, S]`` (two stride-2
  downsamplers after the tower).
- Inkling 2 and Inkling 2 Loop: ``text, <image> x (h * w), text``, ``pixel_values [placeholders, p m, p m, C]``
  (one merged block of pixels per placeholder, in [-1, 1]) and ``image_grid_thw [num_images, 3]`` counted in
  placeholders.
- Nemotron-H Omni (RADIO): ``text, <image> x (h w / 4), text``, ``pixel_values [patches, C p^2]`` flattened and
  ``image_grid_hw [num_images, 2]`` in patches (features downsampled 2 x 2).
- Muse Spark: Qwen3-VL's flat patches and ``image_grid_thw`` (``patch_temporal`` frames per patch, ``merge_size``
  merging), ``text, <image> x (t h w / merge^2), text`` without markers or token types.
- LLaVA-OneVision: ``text, <image> x n, text`` with ``n`` from `llava_onevision_image_tokens`: an
  image alone in its sample is tiled "anyres" (a base tile plus the best-fitting pinpoint grid, the grid's
  features unpadded back to the image's aspect ratio, one ``image_newline`` per feature row); an image
  in a multi-image sample is its base tile plus one newline. ``pixel_values [num_images, max_tiles, C, S,
  S]`` (tiles padded, as the processor pads them), ``image_sizes [num_images, 2]`` (original H, W) and
  ``batch_num_images [B]``.

Samples differ in their number of vision tokens (a Qwen3-VL image is (2 + j % 2) x (2 + b % 2) merged blocks, image
j of sample b; a LLaVA-OneVision image of sample b has original size ``_LLAVA_SIZES[b % 3]``, so its unpadded grid
differs).
"""

from __future__ import annotations

import math

import torch

__all__ = ["GRIDDED", "IMAGE_FAMILIES", "QWEN_STYLE", "TYPED", "images_of", "llava_onevision_image_tokens"]


def _qwen_images(config, count: int, first: int, gen: torch.Generator):
    """(per-image placeholder counts, pixel_values, image_grid_thw) of ``count`` Qwen3-VL images."""
    vc = config.vision_config
    m = int(vc.spatial_merge_size)
    grids = [(1, (2 + j % 2) * m, (2 + first % 2) * m) for j in range(count)]
    patch_dim = int(vc.in_channels) * int(vc.temporal_patch_size) * int(vc.patch_size) ** 2
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), patch_dim, generator=gen)
    return [t * h * w // (m * m) for t, h, w in grids], pixels, torch.tensor(grids, dtype=torch.long)


def _hy_v4_vl_images(config, count: int, first: int, gen: torch.Generator):
    """(per-image placeholder counts, pixel_values, image_grid_thw) of ``count`` Hy4-VL images: those of
    `_flat_patch_images` with a newline placeholder after every merged row."""
    m = int(config.vision_config.spatial_merge_size)
    _, pixels, grids = _flat_patch_images(config, count, first, gen)
    return [t * (h // m) * (w // m + 1) for t, h, w in grids.tolist()], pixels, grids


def _flat_patch_images(config, count: int, first: int, gen: torch.Generator):
    """(per-image placeholder counts, pixel_values, image_grid_thw) of ``count`` images of a tower that takes flat
    patches of ``C * temporal_patch * patch^2`` pixels (one frame where the config has no ``temporal_patch_size``:
    dots3-note, Hy4-VL; MiniMax-M3 VL's frame pairs): Qwen3-VL's grids, ``t * h * w / merge^2`` placeholders."""
    vc = config.vision_config
    m = int(vc.spatial_merge_size)
    grids = [(1, (2 + j % 2) * m, (2 + first % 2) * m) for j in range(count)]
    frames = int(getattr(vc, "temporal_patch_size", 1) or 1)
    patch_dim = int(vc.num_channels) * frames * int(vc.patch_size) ** 2
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), patch_dim, generator=gen)
    return [t * h * w // (m * m) for t, h, w in grids], pixels, torch.tensor(grids, dtype=torch.long)


def _deepseek_ocr2_images(config, count: int, gen: torch.Generator):
    """(per-image placeholder counts, pixel_values [count, C, S, S]) of ``count`` DeepSeek-OCR 2 global views (no local
    tiles): each is the vision encoder's learned queries (144 when the SAM features are at most 12 x 12, else 256)
    and the view separator."""
    sam = config.vision_config.sam_config
    size = int(sam.image_size)
    side = size // int(sam.patch_size) // 4  # the SAM neck downsamples its patch grid 4 x 4
    tokens = (144 if side * side <= 144 else 256) + 1
    pixels = torch.randn(count, int(sam.num_channels), size, size, generator=gen)
    return [tokens] * count, pixels


def _unlimited_ocr_images(config, count: int, gen: torch.Generator):
    """(per-image placeholder counts, pixel_values [count, C, S, S]) of ``count`` Unlimited-OCR global views (no local
    tiles): each is the g x g grid of SAM features (the patch grid downsampled 4 x 4), a newline after every row, and
    the view separator."""
    sam = config.vision_config.sam_config
    size = int(sam.image_size)
    side = size // int(sam.patch_size) // 4
    pixels = torch.randn(count, int(sam.num_channels), size, size, generator=gen)
    return [side * (side + 1) + 1] * count, pixels


def _aria_images(config, count: int, gen: torch.Generator):
    """(per-image placeholder counts, pixel_values [count, C, S, S], pixel_mask [count, S, S]) of ``count`` Aria
    images: each is the projector's queries for the vision tower's patch count (``projector_patch_to_query_dict``)."""
    vc = config.vision_config
    size = int(vc.image_size)
    tokens = int(config.projector_patch_to_query_dict[(size // int(vc.patch_size)) ** 2])
    pixels = torch.randn(count, int(vc.num_channels), size, size, generator=gen)
    return [tokens] * count, pixels, torch.ones(count, size, size, dtype=torch.long)


def _pixtral_images(config, count: int, first: int, gen: torch.Generator):
    """(per-image placeholder counts, pixel_values [count, C, S, S], image_sizes [count, 2]) of ``count`` images of a
    Pixtral tower: image j of sample b is (2 + j % 2) x (2 + b % 2) merged blocks of ``patch * merge`` pixels, padded
    to the tower's ``image_size``; one placeholder per merged block."""
    vc = config.vision_config
    block = int(vc.patch_size) * int(config.spatial_merge_size)
    size = int(vc.image_size)
    sizes = [((2 + j % 2) * block, (2 + first % 2) * block) for j in range(count)]
    pixels = torch.zeros(count, int(vc.num_channels), size, size)
    for j, (h, w) in enumerate(sizes):
        pixels[j, :, :h, :w] = torch.randn(int(vc.num_channels), h, w, generator=gen)
    return [(h // block) * (w // block) for h, w in sizes], pixels, torch.tensor(sizes, dtype=torch.long)


def _llama4_images(config, count: int, gen: torch.Generator):
    """(per-image placeholder counts, pixel_values [count, C, S, S]) of ``count`` Llama 4 images: the tower's patches,
    pixel-shuffled by ``pixel_shuffle_ratio`` in each direction."""
    vc = config.vision_config
    size = int(vc.image_size)
    tokens = int((size // int(vc.patch_size)) ** 2 * float(vc.pixel_shuffle_ratio) ** 2)
    return [tokens] * count, torch.randn(count, int(vc.num_channels), size, size, generator=gen)


def _step3p7_images(config, count: int, gen: torch.Generator):
    """(per-image placeholder counts, pixel_values [count, C, S, S]) of ``count`` Step 3.7 images: the tower's patch
    grid downsampled 4 x 4 (two stride-2 convolutions)."""
    vc = config.vision_config
    size = int(vc.image_size)
    side = size // int(vc.patch_size) // 4
    return [side * side] * count, torch.randn(count, int(vc.num_channels), size, size, generator=gen)


def _inkling2_images(config, count: int, first: int, gen: torch.Generator):
    """(per-image placeholder counts, pixel_values [placeholders, p m, p m, C] in [-1, 1], image_grid_thw [count, 3]
    in placeholders) of ``count`` Inkling 2 images: image j of sample b is 1 x (2 + j % 2) x (2 + b % 2) merged
    blocks of ``patch * merge`` pixels, one pixel block per placeholder, in raster order."""
    vc = config.vision_config
    block = int(vc.patch_size) * int(vc.spatial_merge_size)
    grids = [(1, 2 + j % 2, 2 + first % 2) for j in range(count)]
    counts = [t * h * w for t, h, w in grids]
    pixels = torch.rand(sum(counts), block, block, int(vc.num_channels), generator=gen) * 2 - 1
    return counts, pixels, torch.tensor(grids, dtype=torch.long).reshape(-1, 3)


def _radio_images(config, count: int, first: int, gen: torch.Generator):
    """(per-image placeholder counts, pixel_values [patches, C p^2], image_grid_hw [count, 2] in patches) of ``count``
    Nemotron-H Omni images: image j of sample b is 4 x 4 patches, or 4 x 6 when j + b is odd, flattened; one
    placeholder per 2 x 2 patches (``downsample_ratio`` 1/2)."""
    vc = config.vision_config
    step = round(1 / float(config.downsample_ratio))
    grids = [(2 * step, 2 * step + step * ((j + first) % 2)) for j in range(count)]
    counts = [(h // step) * (w // step) for h, w in grids]
    pixels = torch.randn(sum(h * w for h, w in grids), int(vc.num_channels) * int(vc.patch_size) ** 2, generator=gen)
    return counts, pixels, torch.tensor(grids, dtype=torch.long).reshape(-1, 2)


def _muse_spark_images(config, count: int, first: int, gen: torch.Generator):
    """(per-image placeholder counts, pixel_values [patches, frames C p^2], image_grid_thw [count, 3] in patches) of
    ``count`` Muse Spark images: image j of sample b is 1 x 4 x 4 patches, or 1 x 4 x 6 when j + b is odd, each patch
    ``patch_temporal`` frames; one placeholder per ``merge_size`` x ``merge_size`` patches."""
    vc = config.vision_config
    merge = int(vc.merge_size)
    grids = [(1, 2 * merge, 2 * merge + merge * ((j + first) % 2)) for j in range(count)]
    counts = [t * h * w // merge ** 2 for t, h, w in grids]
    width = int(vc.patch_temporal) * 3 * int(vc.patch_size) ** 2
    pixels = torch.randn(sum(t * h * w for t, h, w in grids), width, generator=gen)
    return counts, pixels, torch.tensor(grids, dtype=torch.long).reshape(-1, 3)


def _internvl_images(config, count: int, gen: torch.Generator):
    vc = config.vision_config
    (height, width), (ph, pw) = vc.image_size, vc.patch_size
    tokens = int(round((height // ph) * (width // pw) * float(config.downsample_ratio) ** 2))
    pixels = torch.randn(count, int(vc.num_channels), height, width, generator=gen)
    return [tokens] * count, pixels


def _best_resolution(size: tuple[int, int], pinpoints) -> tuple[int, int]:
    """The pinpoint (H, W) that keeps most of an (H, W) image's pixels when fitted inside, least wasted area next."""
    height, width = size
    best, best_key = None, None
    for ph, pw in pinpoints:
        scale = min(pw / width, ph / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        key = (kept, -(ph * pw - kept))
        if best_key is None or key > best_key:
            best, best_key = (int(ph), int(pw)), key
    return best


def llava_onevision_image_tokens(config, height: int, width: int, alone: bool = True) -> int:
    """Placeholder count of one LLaVA-OneVision image of original size ``height`` x ``width``.

    ``alone``: the image is its sample's only image (anyres tiling); otherwise only the base tile is
    used. Count = base tile features + (anyres) the grid's features after unpadding to the image's
    aspect ratio (and down-scaling past ``anyres_max_N``) + one newline per remaining feature row; a
    multi-image image gets base tile features + 1 newline. Only ``vision_feature_select_strategy="full"``
    (every patch feature kept, SigLIP's case) is supported.
    """
    vc = config.vision_config
    side = int(vc.image_size) // int(vc.patch_size)
    per_tile = side * side
    if config.vision_feature_select_strategy != "full":
        raise ValueError("llava_onevision_image_tokens supports vision_feature_select_strategy='full' only, "
                         f"got {config.vision_feature_select_strategy!r}")
    if not alone:
        return per_tile + 1
    best_h, best_w = _best_resolution((height, width), config.image_grid_pinpoints)
    cur_h, cur_w = side * (best_h // int(vc.image_size)), side * (best_w // int(vc.image_size))
    if width / height > cur_w / cur_h:
        cur_h -= 2 * ((cur_h - int(round(height * (cur_w / width), 7))) // 2)
    else:
        cur_w -= 2 * ((cur_w - int(round(width * (cur_h / height), 7))) // 2)
    max_tiles = int(config.vision_aspect_ratio.removeprefix("anyres_max_"))
    ratio = math.sqrt(cur_h * cur_w / (max_tiles * side * side))
    if ratio > 1.1:
        cur_h, cur_w = int(cur_h // ratio), int(cur_w // ratio)
    return per_tile + cur_h * cur_w + cur_h


# original (H, W) of a LLaVA-OneVision image of sample b: square, wide (unpads rows) and tall (unpads columns)
_LLAVA_SIZES = ((16, 16), (12, 30), (28, 12))


def _llava_images(config, count: int, first: int, gen: torch.Generator):
    """(per-image counts, pixel tiles [count, tiles, C, S, S], image_sizes [count, 2]) of one sample."""
    vc = config.vision_config
    size = int(vc.image_size)
    alone = count == 1
    sizes = [_LLAVA_SIZES[first % len(_LLAVA_SIZES)]] * count
    grids = [_best_resolution(hw, config.image_grid_pinpoints) for hw in sizes]
    tiles = [1 + (h // size) * (w // size) for h, w in grids]
    pixels = torch.randn(count, max(tiles, default=1), int(vc.num_channels), size, size, generator=gen)
    counts = [llava_onevision_image_tokens(config, h, w, alone) for h, w in sizes]
    return counts, pixels, torch.tensor(sizes, dtype=torch.long).reshape(count, 2)


def _gemma4_images(config, count: int, first: int, gen: torch.Generator):
    """(per-image counts, pixel patches [count, P, C * patch^2], positions [count, P, 2]) of ``count`` Gemma 4
    images: image j of sample b is (2 + j % 2) x (2 + b % 2) pooled cells of k x k patches, padded to the largest
    grid's P = 9 k^2 patches with position (-1, -1), as the processor pads them."""
    vc = config.vision_config
    k = int(vc.pooling_kernel_size)
    most = 9 * k * k
    patch_dim = 3 * int(vc.patch_size) ** 2
    pixels = torch.zeros(count, most, patch_dim)
    positions = torch.full((count, most, 2), -1, dtype=torch.long)
    counts = []
    for j in range(count):
        width, height = (2 + j % 2) * k, (2 + first % 2) * k
        n = width * height
        pixels[j, :n] = torch.rand(n, patch_dim, generator=gen)
        grid = torch.stack(torch.meshgrid(torch.arange(width), torch.arange(height), indexing="xy"), dim=-1)
        positions[j, :n] = grid.reshape(-1, 2)
        counts.append(n // (k * k))
    return counts, pixels, positions


def _without_extra(images):
    """An images builder of (config, count, gen) -> (counts, pixels) as (config, count, sample, gen) -> (counts,
    pixels, None)."""
    return lambda config, count, first, gen: (*images(config, count, gen), None)


def _unsampled(images):
    """An images builder of (config, count, gen) -> (counts, pixels, extra) as (config, count, sample, gen) -> ...."""
    return lambda config, count, first, gen: images(config, count, gen)


#: model type -> its images builder (config, images per sample, sample index, generator) -> (placeholder counts per
#: image, pixel values, the extra input or None); Qwen-VL-style families use _qwen_images, the rest LLaVA's
_IMAGES = {
    "internvl": _without_extra(_internvl_images), "gemma4": _gemma4_images, "hy_v4_vl": _hy_v4_vl_images,
    "dots3_note": _flat_patch_images, "minimax_m3_vl": _flat_patch_images,
    "deepseek_ocr2": _without_extra(_deepseek_ocr2_images), "unlimited_ocr": _without_extra(_unlimited_ocr_images),
    "aria": _unsampled(_aria_images), "mistral_large4": _pixtral_images, "llama4": _without_extra(_llama4_images),
    "nemotron_h_omni": _radio_images, "muse_spark": _muse_spark_images, "inkling2": _inkling2_images,
    "inkling2_loop": _inkling2_images, "step3p7": _without_extra(_step3p7_images),
}

#: the families with Qwen-VL-style images (their markers around the placeholders, flat patches and grids)
QWEN_STYLE = ("qwen3_vl_moe", "qwen3_5_moe", "qwen3_omni_moe_thinker", "qwen4_exp", "qwen2_5_vl", "glm4v_moe",
              "glm5_next")
IMAGE_FAMILIES = (*QWEN_STYLE, *_IMAGES, "llava_onevision")
#: the families whose images come as flat patches with ``image_grid_thw``, and those of them that need
#: ``mm_token_type_ids`` (M-RoPE positions)
GRIDDED = (*QWEN_STYLE, "hy_v4_vl", "dots3_note", "minimax_m3_vl", "inkling2", "inkling2_loop", "muse_spark")
TYPED = (*QWEN_STYLE, "hy_v4_vl")


def images_of(model_type: str):
    """The images builder of ``model_type``: (config, images per sample, sample index, generator) -> (placeholder
    counts per image, pixel values, the extra input or None)."""
    return _qwen_images if model_type in QWEN_STYLE else _IMAGES.get(model_type, _llava_images)
