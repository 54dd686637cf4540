"""Quantized checkpoints as they ship, read as the float tensors transformers dequantizes them to:
`stored_quantization` (which format, checked against the headers).

A quantized checkpoint stores some tensors as *parts*: the quantized values and their scales. lightprune reads it
through a *logical* view ([`Checkpoint`][..reader.Checkpoint]): one float tensor per quantized
weight, under the model's name for it, in the model's dtype, dequantized when it is read, one tensor at a time (never
the whole model). Every part's name is the logical name followed by a suffix (``X.weight`` and
``X.weight_scale_inv``; ``X.gate_up_proj_blocks`` and ``X.gate_up_proj_scales``), so a pruned checkpoint renames or
slices the parts of a kept expert as it does its logical tensor, copying the stored bytes unchanged.

Formats read, each checked as strictly as a float checkpoint (every quantized tensor with its scales, in the shapes
and dtypes of the format, the config's keys, its ``modules_to_not_convert`` naming modules the checkpoint holds and
does not store quantized):

- ``quant_method: "fp8"``: FP8 with block scales (DeepSeek-V3 / R1, Kimi K2, Qwen3-FP8, GLM-4.5-FP8, MiniMax-M2):
  `lightprune.checkpoints.fp8_blocks`;
- ``quant_method: "mxfp4"``: MXFP4 experts (gpt-oss): `lightprune.checkpoints.mxfp4`;
- ``quant_method: "compressed-tensors"``: int4 W4A16 and FP8 per channel (llm-compressor's releases, Kimi K2
  Thinking): `lightprune.checkpoints.compressed_tensors`.

Every other ``quant_method`` is refused when the checkpoint opens, in one line naming it and what to do
(`REFUSED`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lightprune.checkpoints.compressed_tensors import CompressedTensors
from lightprune.checkpoints.fp8_blocks import Fp8Blocks
from lightprune.checkpoints.mxfp4 import Mxfp4Experts
from lightprune.checkpoints.quantized_tensor import StoredFormat
from lightprune.core.errors import listed_text
from lightprune.core.jsonio import show

__all__ = ["REFUSED", "stored_quantization"]

#: quant_method -> what to do instead (the formats lightprune does not read yet)
REFUSED = {
    "gptq": "GPTQ int4 is not read: use the float release of the model",
    "awq": "AWQ int4 is not read: use the float release of the model",
    "bitsandbytes": "a bitsandbytes checkpoint is not read: use the float release of the model",
}
_SCALE = "_scale_inv"


def stored_quantization(path: Path, raw_config: dict[str, Any], entries: dict[str, tuple[Path, dict[str, Any]]],
                        dtype: torch.dtype) -> StoredFormat | None:
    """The checkpoint's quantized format (None for a float checkpoint), from config.json's ``quantization_config``
    and checked against the headers ``entries``; ``dtype`` is the model's (what it dequantizes to). A format lightprune
    does not read is refused naming it and what to do, and so are float8 weights with their scales under a config
    that declares no quantization."""
    quantization = raw_config.get("quantization_config")
    if quantization is None:  # float8 tensors without scales are weights cast to float8: read upcast, as transformers
        scaled = sorted(key for key in entries if key.endswith(_SCALE) and key.removesuffix(_SCALE) in entries
                        and entries[key.removesuffix(_SCALE)][1]["dtype"].startswith("F8_"))
        if scaled:
            raise ValueError(f"checkpoint {str(path)!r} holds float8 weights with their block scales "
                             f"({listed_text(scaled)}) but config.json has no quantization_config: they would load "
                             "unscaled; restore its quantization_config (quant_method \"fp8\", weight_block_size)")
        return None
    if not isinstance(quantization, dict):
        raise ValueError(f"checkpoint {str(path)!r}: config.json's quantization_config is {show(quantization)}, "
                         "not an object")
    method = quantization.get("quant_method")
    for fmt in (Fp8Blocks, Mxfp4Experts, CompressedTensors):
        if method == fmt.method:
            return fmt(path, quantization, entries, dtype)
    hint = REFUSED.get(method if isinstance(method, str) else "",
                       "lightprune reads float checkpoints and quantized ones of quant_method \"fp8\", \"mxfp4\" "
                       "and \"compressed-tensors\": use the float release of the model")
    raise ValueError(f"checkpoint {str(path)!r} is quantized with quant_method {show(method)}: {hint}")
