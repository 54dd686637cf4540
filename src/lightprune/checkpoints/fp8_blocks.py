"""FP8 block-scaled checkpoints (``quant_method: "fp8"``, transformers' ``FineGrainedFP8Config``: DeepSeek-V3 / R1,
Kimi K2, Qwen3-FP8, GLM-4.5-FP8, MiniMax-M2), read through [`Checkpoint`][..reader.Checkpoint]:
`Fp8Blocks`, `quantize_fp8_blocks`, `dequantize_fp8_blocks`.

A quantized linear's ``weight`` is stored in float8_e4m3fn with its ``weight_scale_inv`` (float32 or bfloat16; uint8
powers of two with ``scale_fmt: "ue8m0"``): one scale per ``weight_block_size`` block of the last two dimensions (the
grid ceil-divided: DeepSeek-V3's ``kv_a_proj_with_mqa`` has 576 rows in 128-row blocks, its last block half full).
Dequantized as transformers' ``Fp8Dequantize`` does it (``transformers/integrations/finegrained_fp8.py``):
``float32(q) * float32(scale of its block)``, cast to the model's dtype. On a grid that divides the weight the two
are the same arithmetic; transformers 5.25 refuses to dequantize a partial block ("not divisible by scale grid"),
which lightprune reads as DeepSeek's own ``weight_dequant`` does (each block's scale over the rows and columns it
covers).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from lightprune.checkpoints.quantized_tensor import QuantizedTensor, check_found, check_ignored
from lightprune.core.jsonio import show

__all__ = ["FP8_MAX", "Fp8Blocks", "block_size", "dequantize_fp8_blocks", "quantize_fp8_blocks", "scale_factors"]

#: the largest finite float8_e4m3fn value: a block's scale is its largest magnitude over it
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)
_FP8 = "fp8"
_SCALE = "_scale_inv"
_SCALE_DTYPES = ("F32", "BF16")


def block_size(value: Any, said: str) -> tuple[int, int]:
    """``value`` (a list or tuple) as the (rows, columns) of a scale's block: two positive integers, else
    ``ValueError`` starting with ``said``."""
    if not isinstance(value, (list, tuple)) or len(value) != 2 or \
            not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        shown = show(list(value)) if isinstance(value, tuple) else show(value)
        raise ValueError(f"{said}: {shown}; write two positive integers, the rows and columns of a scale's block (the "
                         "releases: [128, 128])")
    return int(value[0]), int(value[1])


def _blocks(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """The scale grid of a weight of ``shape``: its leading dimensions, then its last two ceil-divided by ``block``."""
    return (*shape[:-2], math.ceil(shape[-2] / block[0]), math.ceil(shape[-1] / block[1]))


def quantize_fp8_blocks(weight: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn values, float32 ``weight_scale_inv``) of ``weight`` ([..., R, C]) in ``block``-sized blocks of
    its last two dimensions: per block ``scale = amax / 448`` (1 for a block of zeros) and ``q = round(w / scale)``
    to the nearest float8_e4m3fn (DeepSeek-V3's block quantization, "DeepSeek-V3 Technical Report", arXiv
    2412.19437, section 3.3.2); `dequantize_fp8_blocks` returns ``w`` within float8_e4m3fn's rounding (a
    relative 2^-4, or 2^-10 of the block's scale below its normal range)."""
    if weight.dim() < 2:
        raise ValueError(f"quantize_fp8_blocks: a weight of at least 2 dimensions, got {list(weight.shape)}")
    rows, cols = weight.shape[-2:]
    grid = _blocks(tuple(weight.shape), block)
    padded = weight.new_zeros((*weight.shape[:-2], grid[-2] * block[0], grid[-1] * block[1]), dtype=torch.float32)
    padded[..., :rows, :cols] = weight.float()
    tiles = padded.reshape(*grid[:-2], grid[-2], block[0], grid[-1], block[1])
    amax = tiles.abs().amax(dim=(-3, -1))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    values = (tiles / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    values = values.reshape(padded.shape)[..., :rows, :cols].contiguous()
    return values, scale.contiguous()


def scale_factors(scale: torch.Tensor) -> torch.Tensor:
    """The scales as float32 (uint8 ``ue8m0`` bytes are powers of two: ``2 ** (byte - 127)``, as transformers reads
    them)."""
    return (scale.float() - 127.0).exp2() if scale.dtype == torch.uint8 else scale.float()


def dequantize_fp8_blocks(values: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                          dtype: torch.dtype) -> torch.Tensor:
    """``values`` ([..., R, C], float8) times the scale of each one's ``block`` (``scale`` [..., ceil(R/b0),
    ceil(C/b1)]), in float32, cast to ``dtype`` (see the module docstring)."""
    rows, cols = values.shape[-2:]
    grid = scale.shape[-2:]
    factors = scale_factors(scale)
    if rows == grid[0] * block[0] and cols == grid[1] * block[1]:  # transformers' reshape, the same products
        product = values.float()
        product.view(*values.shape[:-2], grid[0], block[0], grid[1], block[1]).mul_(factors[..., :, None, :, None])
        return product.to(dtype)
    spread = factors.repeat_interleave(block[0], dim=-2)[..., :rows, :].repeat_interleave(block[1], dim=-1)
    return (values.float() * spread[..., :cols]).to(dtype)


class Fp8Blocks:
    """An FP8 block-scaled checkpoint (``quant_method: "fp8"``, see the module docstring), checked against its
    headers when built: ``tensors`` {logical key: `QuantizedTensor`}, ``block`` the ``weight_block_size``,
    ``dtype`` the model's (what the weights dequantize to)."""

    method = _FP8

    def __init__(self, path: Path, quantization: dict[str, Any], entries: dict[str, tuple[Path, dict[str, Any]]],
                 dtype: torch.dtype):
        where = f"checkpoint {str(path)!r}: config.json's quantization_config"
        self.config = quantization
        self.block = block_size(quantization.get("weight_block_size", [128, 128]), f"{where} has \"weight_block_size\"")
        fmt = quantization.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ValueError(f"{where} has \"fmt\": {show(fmt)}; lightprune reads FP8 in e4m3 (float8_e4m3fn), "
                             "the format of the fp8 releases")
        scale_fmt = quantization.get("scale_fmt")
        if scale_fmt not in (None, "ue8m0"):
            raise ValueError(f"{where} has \"scale_fmt\": {show(scale_fmt)}; lightprune reads float scales or "
                             "\"ue8m0\" (uint8 powers of two)")
        self.dtype = dtype
        scale_dtypes = (*_SCALE_DTYPES, "U8") if scale_fmt == "ue8m0" else _SCALE_DTYPES
        self.tensors: dict[str, QuantizedTensor] = {}
        problems: dict[str, list[str]] = {}
        for key, (_, info) in entries.items():
            if key.endswith(_SCALE):
                weight = key.removesuffix(_SCALE)
                if weight not in entries:
                    problems.setdefault("scales without their weight", []).append(key)
                continue
            if not info["dtype"].startswith("F8_"):
                continue
            scale = key + _SCALE
            shape = tuple(info["shape"])
            if info["dtype"] != "F8_E4M3":
                problems.setdefault("float8 weights not in e4m3", []).append(f"{key} ({info['dtype']})")
            elif scale not in entries:
                problems.setdefault("float8 weights without their weight_scale_inv (the scales missing)",
                                    []).append(key)
            elif len(shape) < 2:
                problems.setdefault("float8 tensors of fewer than 2 dimensions", []).append(f"{key} {list(shape)}")
            elif tuple(entries[scale][1]["shape"]) != _blocks(shape, self.block):
                problems.setdefault(f"scales whose shape is not the {self.block[0]}x{self.block[1]} block grid of "
                                    "their weight", []).append(
                    f"{scale} {list(entries[scale][1]['shape'])} for {list(shape)} (wants "
                    f"{list(_blocks(shape, self.block))})")
            elif entries[scale][1]["dtype"] not in scale_dtypes:
                problems.setdefault(f"scales not in {'/'.join(scale_dtypes)}", []).append(
                    f"{scale} ({entries[scale][1]['dtype']})")
            else:
                self.tensors[key] = QuantizedTensor((key, scale), shape, dtype)
        check_found(path, _FP8, f"quant_method \"fp8\", {self.block[0]}x{self.block[1]} blocks", self.tensors,
                    problems, "no tensor is stored in float8")
        check_ignored(path, "FP8", quantization, entries, self.tensors)

    def dequantize(self, parts: dict[str, torch.Tensor], key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The logical tensor ``key`` from its read ``parts`` ({stored key: tensor}), in ``dtype`` (the model's)."""
        values, scale = (parts[name] for name in self.tensors[key].parts)
        return dequantize_fp8_blocks(values, scale, self.block, dtype or self.dtype)

    def record(self) -> dict[str, Any]:
        """What a manifest says of the format."""
        return {"quant_method": self.method, "weight_block_size": list(self.block),
                "quantized_tensors": len(self.tensors)}

    def loading_config(self) -> Any:
        """transformers' quantization config that loads the checkpoint dequantized, as lightprune reads it (on a GPU
        transformers would otherwise keep FP8 modules), its ``modules_to_not_convert`` kept."""
        from transformers import FineGrainedFP8Config

        return FineGrainedFP8Config(dequantize=True, weight_block_size=self.block,
                                    modules_to_not_convert=self.config.get("modules_to_not_convert"))
