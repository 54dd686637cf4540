"""config.json of an export, once its weights are written: `finish_config` (the pruned model's class, the
weights' dtype, the experts implementation transformers can run them with, the remote-code entry of a non-uniform
export and nothing else's, multi-token-prediction layers only where the weights hold them)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from lightprune.checkpoints.classes import base_class
from lightprune.checkpoints.directory import weight_files
from lightprune.checkpoints.header import read_header
from lightprune.checkpoints.mtp import undeclared_mtp
from lightprune.core.jsonio import parse_json
from lightprune.export.remote_code import MODELING_FILE, auto_map_entry, modeling_source
from lightprune.models import find_moe_layers
from lightprune.models.experts_kernel import grouped_mm_runs

__all__ = ["finish_config", "weights_dtype"]


def weights_dtype(model: nn.Module) -> torch.dtype:
    """The floating dtype of most of ``model``'s parameter bytes (float32 without any): what the checkpoint reader
    takes for its dtype. Not ``model.dtype``, its first parameter's: a bfloat16 model that keeps its embeddings in
    float32 (Ergo) is a bfloat16 model."""
    counts: dict[torch.dtype, int] = {}
    for param in model.parameters():
        if param.is_floating_point():
            size = (getattr(param, "ds_numel", None) or param.numel()) * param.element_size()  # a ZeRO-3 partition
            counts[param.dtype] = counts.get(param.dtype, 0) + size
    return max(counts, key=counts.get) if counts else torch.float32


def finish_config(tmp: Path, model: nn.Module, uniform: bool) -> bool:
    """config.json of the export staged in ``tmp`` as ``model`` (pruned) and its weights make it; True when the
    config declared multi-token-prediction layers the weights do not hold, now 0 (`undeclared_mtp`)."""
    path = tmp / "config.json"
    data = parse_json(path.read_text(), f"config file {str(path)!r}")
    data["architectures"] = [base_class(model).__name__]
    if "dtype" in data:  # transformers writes its first parameter's dtype: the one of most of the weights instead
        data["dtype"] = str(weights_dtype(model)).removeprefix("torch.")
    # the only remote code an export carries is its own modeling file: any other auto_map entry (the
    # source's remote code, or an older lightprune entry) would point at code that is not there
    data.pop("auto_map", None)
    if not all(grouped_mm_runs(layer.experts) for layer in find_moe_layers(model)):
        # float64 experts (or rows off 16 bytes): transformers' default grouped_mm kernel cannot run them; its eager
        # one, named here, is what a plain from_pretrained then picks (the same outputs)
        data["experts_implementation"] = "eager"
    if uniform:
        (tmp / MODELING_FILE).unlink(missing_ok=True)
    else:
        (tmp / MODELING_FILE).write_text(modeling_source(model))
        data["auto_map"] = auto_map_entry(model)
    dropped = undeclared_mtp(data, [key for file in weight_files(tmp) for key in read_header(file)
                                    if key != "__metadata__"])
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return dropped
