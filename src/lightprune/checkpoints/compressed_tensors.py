"""compressed-tensors checkpoints (``quant_method: "compressed-tensors"``, the quantized releases of vLLM's
llm-compressor: Kimi K2 Thinking's int4 experts, the "FP8-dynamic" releases), read through
[`Checkpoint`][..reader.Checkpoint]: `CompressedTensors`, `pack_int4`.

Two schemes are read, as ``quantization_status: "compressed"`` stores them:

- int4 W4A16 (``format: "pack-quantized"``, weights ``type: "int"``, ``num_bits: 4``, symmetric, ``strategy``
  ``"group"`` or ``"channel"``): ``X.weight_packed`` int32 [out, ceil(in / 8)] (eight values a word, the lowest
  nibble first, each stored as value + 8), ``X.weight_scale`` [out, in / group_size] (a channel's: [out, 1]) and
  ``X.weight_shape`` [2] (out, in);
- FP8 per channel (``format: "float-quantized"``, weights ``type: "float"``, ``num_bits: 8``, symmetric,
  ``strategy`` ``"channel"`` or ``"tensor"``): ``X.weight`` float8_e4m3fn [out, in] and ``X.weight_scale`` [out, 1]
  (a tensor's: one value); activations quantized dynamically, if at all (no stored input scales).

Dequantized as compressed-tensors' ``dequantize`` does it (``quantization/lifecycle/forward_helpers.py``, which
transformers' ``CompressedTensorsDequantize`` runs when it loads with ``dequantize=True``): the value in the scale's
dtype times its group's (channel's) scale, rounded to the scale's dtype, then cast to the model's dtype. Every other
scheme (asymmetric zero points, activation-ordered groups, block strategy, static activation scales, 2:4 sparsity,
several groups of one scheme with different parameters) is refused naming it. The config's ``ignore`` entries
(module names, or ``re:`` regular expressions matched from the start of a name) must name modules the checkpoint holds
and that are not stored quantized.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch

from lightprune.checkpoints.quantized_tensor import QuantizedTensor, check_found, check_ignored
from lightprune.core.jsonio import show

__all__ = ["CompressedTensors", "dequantize_int4", "pack_int4", "quantize_int4"]

_PACKED, _SCALE, _SHAPE = "_packed", "_scale", "_shape"
_INT4, _FP8 = "int4", "fp8"
_SCALE_DTYPES = ("F32", "BF16", "F16")


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """int32 [out, ceil(in / 8)] of int4 ``values`` (int8 in [-8, 7], [out, in]), as compressed-tensors packs them:
    value + 8, eight a word, the lowest nibble first (on a little-endian machine: byte j holds values 2j and 2j + 1)."""
    rows, cols = values.shape
    padded = torch.zeros(rows, math.ceil(cols / 8) * 8, dtype=torch.uint8)
    padded[:, :cols] = (values.to(torch.int16) + 8).to(torch.uint8)
    return (padded[:, 0::2] | (padded[:, 1::2] << 4)).contiguous().view(torch.int32)


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values in [-8, 7], scales in the weight's dtype [out, in / group_size]) of ``weight`` [out, in]:
    symmetric per group, ``scale = amax / 7`` (1 for a group of zeros), ``round(w / scale)``."""
    rows, cols = weight.shape
    groups = weight.float().reshape(rows, cols // group_size, group_size)
    amax = groups.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / 7.0, torch.ones_like(amax)).to(weight.dtype)
    values = torch.round(groups / scale.float()[..., None]).clamp(-8, 7).to(torch.int8)
    return values.reshape(rows, cols), scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, shape: tuple[int, int],
                    dtype: torch.dtype) -> torch.Tensor:
    """The [out, in] weight of ``packed`` (`pack_int4`) and its group (or channel) ``scale`` (see the module
    docstring)."""
    rows, cols = shape
    nibbles = packed.contiguous().view(torch.uint8)
    values = torch.stack((nibbles & 0x0F, nibbles >> 4), dim=-1).reshape(rows, -1)[:, :cols].to(torch.int8) - 8
    groups = scale.shape[-1]
    product = values.to(torch.float32).reshape(rows, groups, cols // groups) * scale.to(torch.float32)[..., None]
    return product.reshape(rows, cols).to(scale.dtype).to(dtype)


def _matches(target: str, name: str) -> bool:
    """compressed-tensors' matching of a ``targets`` / ``ignore`` entry: ``re:`` a regular expression matched from
    the start of the name, else the name itself."""
    if target.startswith("re:"):
        try:
            return re.match(target[3:], name) is not None
        except re.error:
            return False
    return name == target


class CompressedTensors:
    """A compressed-tensors checkpoint (see the module docstring), checked against its headers when built:
    ``tensors`` {logical key: `QuantizedTensor`}, ``dtype`` the model's."""

    method = "compressed-tensors"

    def __init__(self, path: Path, quantization: dict[str, Any], entries: dict[str, tuple[Path, dict[str, Any]]],
                 dtype: torch.dtype):
        self.config, self.dtype, self.path = quantization, dtype, path
        where = f"checkpoint {str(path)!r}: config.json's quantization_config (compressed-tensors)"
        status = quantization.get("quantization_status", "compressed")
        if status != "compressed":
            raise ValueError(f"{where} has \"quantization_status\": {show(status)}; lightprune reads compressed "
                             "checkpoints (\"compressed\"), as llm-compressor saves them")
        if quantization.get("sparsity_config"):
            raise ValueError(f"{where} has a sparsity_config (2:4 or bitmask sparse weights), which lightprune does "
                             "not read: use the dense release")
        self.schemes = self._schemes(where, quantization)
        self.tensors: dict[str, QuantizedTensor] = {}
        #: {logical key: "int4" or "fp8"}
        self.scheme_of: dict[str, str] = {}
        problems: dict[str, list[str]] = {}
        for key, (_, info) in entries.items():
            if key.endswith(("input_scale", "weight_zero_point", "weight_g_idx", "weight_global_scale")):
                problems.setdefault("tensors of a scheme lightprune does not read (static activation scales, zero "
                                    "points, activation order, global scales)", []).append(key)
            elif key.endswith(".weight" + _PACKED):
                self._int4(key.removesuffix(_PACKED), entries, problems)
            elif key.endswith(".weight") and info["dtype"].startswith("F8_"):
                self._fp8(key, entries, problems)
            elif key.endswith(".weight" + _SCALE) and key.removesuffix(_SCALE) + _PACKED not in entries and \
                    key.removesuffix(_SCALE) not in entries:
                problems.setdefault("scales without their weight", []).append(key)
        missing = sorted({self.scheme_of[k] for k in self.tensors} - set(self.schemes))
        if missing:
            problems.setdefault("weights of a scheme no config group declares", []).extend(
                f"{k} ({self.scheme_of[k]})" for k in self.tensors if self.scheme_of[k] in missing)
        check_found(path, self.method, "quant_method \"compressed-tensors\"", self.tensors, problems,
                    "holds no quantized weights")
        check_ignored(path, "int4 / FP8", quantization, entries, self.tensors, key="ignore", matches=_matches)

    # ------------------------------------------------------------------ the config
    @staticmethod
    def _schemes(where: str, quantization: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """{"int4" / "fp8": the weights' arguments of the one config group of that scheme}."""
        groups = quantization.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            raise ValueError(f"{where} has \"config_groups\": {show(groups)}; write the config groups of the "
                             "checkpoint's schemes")
        found: dict[str, dict[str, Any]] = {}
        for name, group in groups.items():
            weights = group.get("weights") if isinstance(group, dict) else None
            if not isinstance(weights, dict):
                raise ValueError(f"{where}: config group {name!r} has no \"weights\" object")
            fmt = group.get("format") or quantization.get("format")
            kind, bits = weights.get("type"), weights.get("num_bits")
            strategy, symmetric = weights.get("strategy"), weights.get("symmetric", True)
            inputs = group.get("input_activations")
            if kind == "int" and bits == 4 and fmt == "pack-quantized" and strategy in ("group", "channel"):
                scheme = _INT4
            elif kind == "float" and bits == 8 and fmt in ("float-quantized", "naive-quantized") and \
                    strategy in ("channel", "tensor"):
                scheme = _FP8
            else:
                raise ValueError(f"{where}: config group {name!r} is {kind} {bits}-bit {strategy} in format {fmt!r}, "
                                 "which lightprune does not read (it reads int4 W4A16 pack-quantized by group or "
                                 "channel, and FP8 float-quantized by channel or tensor)")
            if symmetric is not True or weights.get("actorder") not in (None, False) or \
                    weights.get("block_structure") is not None:
                raise ValueError(f"{where}: config group {name!r} is asymmetric, activation-ordered or block-wise "
                                 f"(symmetric {show(symmetric)}, actorder {show(weights.get('actorder'))}), which "
                                 "lightprune does not read")
            if isinstance(inputs, dict) and inputs.get("dynamic") is not True:
                raise ValueError(f"{where}: config group {name!r} quantizes activations statically (stored input "
                                 "scales), which lightprune does not read")
            if scheme == _INT4 and strategy == "group":
                size = weights.get("group_size")
                if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                    raise ValueError(f"{where}: config group {name!r} has \"group_size\": {show(size)}; write a "
                                     "positive integer")
            if scheme in found and found[scheme] != weights:
                raise ValueError(f"{where}: config groups with {scheme} weights of different arguments, which "
                                 "lightprune does not tell apart by their targets yet")
            found[scheme] = weights
        return found

    # ------------------------------------------------------------------ the tensors
    def _int4(self, weight: str, entries: dict[str, Any], problems: dict[str, list[str]]) -> None:
        packed, scale, shape = weight + _PACKED, weight + _SCALE, weight + _SHAPE
        if scale not in entries or shape not in entries:
            problems.setdefault("packed weights without their weight_scale or weight_shape (the scales missing)",
                                []).append(packed)
            return
        (_, p_info), (_, s_info), (_, h_info) = entries[packed], entries[scale], entries[shape]
        p_shape, s_shape = tuple(p_info["shape"]), tuple(s_info["shape"])
        if p_info["dtype"] != "I32" or s_info["dtype"] not in _SCALE_DTYPES or h_info["dtype"] not in ("I32", "I64") \
                or tuple(h_info["shape"]) != (2,):
            problems.setdefault("packed weights, scales or shapes not int32 / float / int [2]", []).append(
                f"{packed} ({p_info['dtype']}), {scale} ({s_info['dtype']}), {shape} ({h_info['dtype']} "
                f"{list(h_info['shape'])})")
            return
        weights = self.schemes.get(_INT4, {})
        size = weights.get("group_size") if weights.get("strategy") == "group" else None
        columns = s_shape[-1] * size if size else p_shape[-1] * 8
        if len(p_shape) != 2 or len(s_shape) != 2 or s_shape[0] != p_shape[0] or \
                p_shape[1] != math.ceil(columns / 8) or (size is None and s_shape[1] != 1):
            problems.setdefault("packed weights whose scales do not fit them (group_size "
                                f"{size if size else 'the channel'})", []).append(
                f"{packed} {list(p_shape)}, {scale} {list(s_shape)}")
            return
        self.tensors[weight] = QuantizedTensor((packed, scale, shape), (p_shape[0], columns), self.dtype)
        self.scheme_of[weight] = _INT4

    def _fp8(self, weight: str, entries: dict[str, Any], problems: dict[str, list[str]]) -> None:
        scale = weight + _SCALE
        _, info = entries[weight]
        if info["dtype"] != "F8_E4M3":
            problems.setdefault("float8 weights not in e4m3", []).append(f"{weight} ({info['dtype']})")
            return
        if scale not in entries:
            problems.setdefault("float8 weights without their weight_scale (the scales missing)", []).append(weight)
            return
        _, s_info = entries[scale]
        shape, s_shape = tuple(info["shape"]), tuple(s_info["shape"])
        if len(shape) != 2 or s_shape not in ((shape[0], 1), (1,), ()) or s_info["dtype"] not in _SCALE_DTYPES:
            problems.setdefault("scales that are not a float per channel ([out, 1]) or per tensor", []).append(
                f"{scale} {s_info['dtype']} {list(s_shape)} for {list(shape)}")
            return
        self.tensors[weight] = QuantizedTensor((weight, scale), shape, self.dtype)
        self.scheme_of[weight] = _FP8

    # ------------------------------------------------------------------ reading
    def dequantize(self, parts: dict[str, torch.Tensor], key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The logical tensor ``key`` from its read ``parts`` ({stored key: tensor}), in ``dtype`` (the model's)."""
        found = self.tensors[key]
        if self.scheme_of[key] == _INT4:
            packed, scale, shape = (parts[name] for name in found.parts)
            if tuple(int(v) for v in shape.tolist()) != found.shape:
                raise ValueError(f"checkpoint {str(self.path)!r}: {found.parts[2]} says {shape.tolist()}, its packed "
                                 f"weight and scales hold {list(found.shape)}; re-export it or restore the files")
            return dequantize_int4(packed, scale, found.shape, dtype or self.dtype)
        values, scale = (parts[name] for name in found.parts)
        product = values.to(torch.float32) * scale.to(torch.float32).reshape(-1, 1)
        return product.to(scale.dtype).to(dtype or self.dtype)

    def record(self) -> dict[str, Any]:
        """What a manifest says of the format."""
        return {"quant_method": self.method, "schemes": sorted(self.schemes),
                "quantized_tensors": len(self.tensors)}

    def loading_config(self) -> Any:
        """transformers' quantization config that loads the checkpoint dequantized, as lightprune reads it."""
        from transformers import CompressedTensorsConfig

        return CompressedTensorsConfig(dequantize=True)
