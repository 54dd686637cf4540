"""MXFP4 checkpoints (``quant_method: "mxfp4"``: gpt-oss), read through
[`Checkpoint`][..reader.Checkpoint]: `Mxfp4Experts`, `quantize_mxfp4`,
`dequantize_mxfp4`.

gpt-oss stores each MoE layer's fused expert weights as ``experts.gate_up_proj_blocks`` / ``experts.down_proj_blocks``
(uint8 [E, rows, groups, 16]: 32 FP4 E2M1 values per group, two per byte, the low nibble first) and
``..._scales`` (uint8 [E, rows, groups]: a power of two per group, ``2 ** (byte - 127)``), the OCP microscaling
format ("OCP Microscaling Formats (MX) v1.0", section 5.3); biases, routers, attention and embeddings stay in bf16
(the config's ``modules_to_not_convert``). The logical tensor is the model's parameter ``experts.gate_up_proj``
[E, columns, rows] (gpt-oss multiplies ``x @ W``: the stored rows are its output features). Dequantized as
transformers' ``Mxfp4Dequantize`` does it (``transformers/integrations/mxfp4.py``, ``_convert_moe_packed_tensors``):
each nibble through the E2M1 table in the model's dtype, ``ldexp`` by its group's exponent, the rows and columns
swapped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lightprune.checkpoints.quantized_tensor import QuantizedTensor, check_found, check_ignored

__all__ = ["FP4_VALUES", "Mxfp4Experts", "dequantize_mxfp4", "quantize_mxfp4"]

#: the 16 FP4 E2M1 values by their 4-bit code (the sign is the high bit)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_BLOCKS, _SCALES = "_blocks", "_scales"
_GROUP = 32


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The [E, groups * 32, rows] tensor of ``blocks`` [E, rows, groups, 16] and ``scales`` [E, rows, groups] (see
    the module docstring), in ``dtype``."""
    table = torch.tensor(FP4_VALUES, dtype=dtype)
    *lead, groups, width = blocks.shape
    flat = blocks.reshape(-1, width)
    out = torch.empty(flat.shape[0], width * 2, dtype=dtype)
    out[:, 0::2] = table[(flat & 0x0F).to(torch.int)]
    out[:, 1::2] = table[(flat >> 4).to(torch.int)]
    torch.ldexp(out, scales.to(torch.int32).reshape(-1, 1) - 127, out=out)
    return out.reshape(*lead, groups * width * 2).transpose(1, 2).contiguous()


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks, scales) of ``weight`` [E, columns, rows] (columns a multiple of 32) in MXFP4: per group of 32 along
    the columns the exponent ``ceil(log2(amax / 6))`` (6: E2M1's largest value; -127 for a group of zeros) and each
    value rounded to the nearest E2M1 value of ``w / 2 ** exponent``; `dequantize_mxfp4` inverts it within
    E2M1's rounding (half the gap between neighbouring values of the group's scale)."""
    rows_first = weight.float().transpose(1, 2)  # [E, rows, columns]
    lead, columns = rows_first.shape[:-1], rows_first.shape[-1]
    if columns % _GROUP:
        raise ValueError(f"quantize_mxfp4: {columns} columns, not a multiple of {_GROUP}")
    groups = rows_first.reshape(*lead, columns // _GROUP, _GROUP)
    amax = groups.abs().amax(dim=-1)
    exponent = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6.0)), torch.full_like(amax, -127.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)[..., None]
    magnitudes = torch.tensor(FP4_VALUES[:8])
    codes = (scaled.abs()[..., None] - magnitudes).abs().argmin(dim=-1) + 8 * (scaled < 0)
    codes = codes.to(torch.uint8).reshape(*lead, columns // _GROUP, _GROUP // 2, 2)
    blocks = (codes[..., 0] | (codes[..., 1] << 4)).contiguous()
    return blocks, (exponent + 127).to(torch.uint8).contiguous()


class Mxfp4Experts:
    """An MXFP4 checkpoint (``quant_method: "mxfp4"``, see the module docstring), checked against its headers when
    built: ``tensors`` {logical key: `QuantizedTensor`}, ``dtype`` the model's."""

    method = "mxfp4"

    def __init__(self, path: Path, quantization: dict[str, Any], entries: dict[str, tuple[Path, dict[str, Any]]],
                 dtype: torch.dtype):
        self.config, self.dtype = quantization, dtype
        self.tensors: dict[str, QuantizedTensor] = {}
        problems: dict[str, list[str]] = {}
        for key, (_, info) in entries.items():
            if key.endswith(_SCALES) and key.removesuffix(_SCALES) + _BLOCKS not in entries:
                problems.setdefault("scales without their blocks", []).append(key)
            if not key.endswith(_BLOCKS):
                continue
            logical = key.removesuffix(_BLOCKS)
            scales, shape = logical + _SCALES, tuple(info["shape"])
            if scales not in entries:
                problems.setdefault("blocks without their scales (the scales missing)", []).append(key)
            elif info["dtype"] != "U8" or entries[scales][1]["dtype"] != "U8":
                problems.setdefault("blocks or scales not in uint8", []).append(
                    f"{key} ({info['dtype']}), {scales} ({entries[scales][1]['dtype']})")
            elif len(shape) != 4 or shape[-1] != _GROUP // 2:
                problems.setdefault(f"blocks not [experts, rows, groups, {_GROUP // 2}]", []).append(
                    f"{key} {list(shape)}")
            elif tuple(entries[scales][1]["shape"]) != shape[:-1]:
                problems.setdefault("scales whose shape is not their blocks' groups", []).append(
                    f"{scales} {list(entries[scales][1]['shape'])} for {list(shape)} (wants {list(shape[:-1])})")
            elif logical in entries:
                problems.setdefault("blocks beside an unquantized tensor of the same name", []).append(logical)
            else:
                self.tensors[logical] = QuantizedTensor((key, scales), (shape[0], shape[2] * _GROUP, shape[1]), dtype)
        check_found(path, self.method, "quant_method \"mxfp4\"", self.tensors, problems, "holds no *_blocks tensors")
        check_ignored(path, "MXFP4", quantization, entries, self.tensors)

    def dequantize(self, parts: dict[str, torch.Tensor], key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The logical tensor ``key`` from its read ``parts`` ({stored key: tensor}), in ``dtype`` (the model's)."""
        blocks, scales = (parts[name] for name in self.tensors[key].parts)
        return dequantize_mxfp4(blocks, scales, dtype or self.dtype)

    def record(self) -> dict[str, Any]:
        """What a manifest says of the format."""
        return {"quant_method": self.method, "group_size": _GROUP, "quantized_tensors": len(self.tensors)}

    def loading_config(self) -> Any:
        """transformers' quantization config that loads the checkpoint dequantized (what lightprune reads; without
        it transformers loads MXFP4 kernels from the Hub where triton and ``kernels`` are installed)."""
        from transformers import Mxfp4Config

        return Mxfp4Config(dequantize=True)
