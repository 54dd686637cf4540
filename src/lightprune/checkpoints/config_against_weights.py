"""config.json checked against the weights it describes, before any model is built ([`Checkpoint`][..reader.Checkpoint]
runs these as it opens):

- the config's layer counts against the weights: no ``num_hidden_layers`` (or a vision tower's ``depth``, ...: of
  the config or a sub-config) above the number of tensors on disk, nor a decoder's above the layers the tensor
  names number (a config claiming more layers than the weights hold, which would also build an unbounded model);
- the config's ``dtype`` against the dtype the weights are stored in (the in-memory path computes in the
  config's, the streamed one in the stored one: they must be the same); without one in the config, what
  transformers loads the model in then: the shard index's ``"metadata"`` ``dtype``, else the dtype of the first
  floating tensor (by name) of the first weights file.

`model_dtype` is what a quantized checkpoint's weights dequantize to; `majority_dtype` the floating dtype
of most of a checkpoint's tensor bytes.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from lightprune.checkpoints.directory import index_metadata
from lightprune.checkpoints.header import SAFETENSORS_DTYPES
from lightprune.core.jsonio import show

__all__ = ["check_config_dtype", "check_layer_counts", "majority_dtype", "model_dtype"]

#: config keys that count layers (decoder, vision tower, encoder): each layer holds at least one tensor
_LAYER_COUNTS = frozenset({"num_hidden_layers", "depth", "num_layers", "n_layer", "n_layers", "encoder_layers",
                           "decoder_layers", "vision_layers"})
_LAYER_NUMBER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def majority_dtype(checkpoint: Any) -> tuple[torch.dtype | None, float]:
    """The floating dtype of most of the checkpoint's logical tensor bytes (a quantized tensor counted in the dtype it
    dequantizes to) and its share of the floating bytes ((None, 0.0) without floating tensors). ``checkpoint``: a
    [`Checkpoint`][...reader.Checkpoint], here and below (not imported: it runs these as it opens)."""
    counts: dict[torch.dtype, int] = defaultdict(int)
    for key in checkpoint.keys():
        dtype = checkpoint.dtype(key)
        if dtype.is_floating_point:
            counts[dtype] += checkpoint.nbytes(key)
    if not counts:
        return None, 0.0
    best = max(counts, key=counts.get)
    return best, counts[best] / max(1, sum(counts.values()))


def model_dtype(raw_config: dict[str, Any], entries: dict[str, tuple[Path, dict[str, Any]]]) -> torch.dtype:
    """What a quantized checkpoint's weights dequantize to: config.json's ``dtype`` (or ``torch_dtype``), else
    the floating dtype of most of the unquantized tensors' bytes (``entries``: the headers' entries), else
    bfloat16."""
    for name in ("dtype", "torch_dtype"):
        found = getattr(torch, str(raw_config.get(name)), None)
        if isinstance(found, torch.dtype) and found.is_floating_point and found.itemsize > 1:
            return found
    counts: dict[torch.dtype, int] = defaultdict(int)
    for _, info in entries.values():
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is not None and dtype.is_floating_point and dtype.itemsize > 1:
            counts[dtype] += int(info["data_offsets"][1]) - int(info["data_offsets"][0])
    return max(counts, key=counts.get) if counts else torch.bfloat16

def check_layer_counts(path: Path, raw_config: dict[str, Any], entries: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    """config.json's layer counts (anywhere in it) against the weights (``entries``: the headers' entries of the
    checkpoint at ``path``; see the module docstring)."""
    numbered = {int(m.group(1)) for key in entries for m in [_LAYER_NUMBER.search(key)] if m}
    stored = 1 + max(numbered) if numbered else 0
    todo, claims = [("", raw_config)], []
    while todo:
        where, node = todo.pop()
        for key, value in node.items():
            if isinstance(value, dict):
                todo.append((f"{where}{key}.", value))
            elif key in _LAYER_COUNTS:
                claims.append((f"{where}{key}", key, value))
    for name, key, value in sorted(claims):
        if isinstance(value, bool) or not isinstance(value, int):
            if key != "num_hidden_layers":
                continue  # another meaning of the name (a list of stage depths)
            raise ValueError(f"checkpoint {str(path)!r}: config.json's {name} is {value!r}, not a "
                             "non-negative integer")
        if value < 0:
            raise ValueError(f"checkpoint {str(path)!r}: config.json's {name} is {value}, not a "
                             "non-negative integer")
        decoder = name in ("num_hidden_layers", "text_config.num_hidden_layers")
        if decoder and numbered and value > stored:
            held = f"the weights hold {stored} numbered layers"
        elif value > len(entries):
            held = f"the weights hold {len(entries)} tensors (a layer holds at least one)"
        else:
            continue
        raise ValueError(f"checkpoint {str(path)!r}: config.json's {name} is {value}, {held}: a config for "
                         "another checkpoint, or weights missing; restore the files")

def check_config_dtype(checkpoint: Any) -> None:
    """config.json's ``dtype`` (without one, the shard index's, which transformers reads then) against the stored
    one of an opened ``checkpoint`` (see the module docstring)."""
    claimed = getattr(checkpoint.config, "dtype", None)
    stored, share = majority_dtype(checkpoint)
    held = str(stored or torch.float32).removeprefix("torch.")
    where = ("config.json says dtype ", "")  # what is said around the dtype
    if claimed is None:
        claimed = (index_metadata(checkpoint.path) or {}).get("dtype")
        where = ("its shard index's \"metadata\" says dtype ", " (config.json names none)")
        if claimed is not None and not isinstance(getattr(torch, claimed, None) if isinstance(claimed, str)
                                                  else None, torch.dtype):
            raise ValueError(f"checkpoint {str(checkpoint.path)!r}: its shard index's \"metadata\" has \"dtype\": "
                             f"{show(claimed)}, not a torch dtype name, which transformers loads the model "
                             f"in when config.json names none; set \"dtype\": \"{held}\" in config.json "
                             "(transformers reads it first)")
    if claimed is None:  # transformers' choice then: the first floating tensor of the first file, by name
        first = _first_floating(checkpoint)
        if first is not None:
            claimed = checkpoint.dtype(first)
            where = ("config.json names no dtype, so transformers loads the model in ",
                     f", the dtype of the first floating tensor of {checkpoint.files[0].name} ({first})")
    if isinstance(claimed, str):
        claimed = getattr(torch, claimed, None)
    if not isinstance(claimed, torch.dtype) or stored is None or not stored.is_floating_point or \
            stored.itemsize == 1 or claimed == stored:
        return
    said = str(claimed).removeprefix("torch.")
    raise ValueError(f"checkpoint {str(checkpoint.path)!r}: {where[0]}{said}{where[1]}, its weights are stored in "
                     f"{held} ({share:.0%} of the tensor bytes): loaded whole it would compute in {said}, "
                     f"streamed in {held}; set \"dtype\": \"{held}\" in config.json (or re-save the checkpoint "
                     "in the dtype it names)")

def _first_floating(checkpoint: Any) -> str | None:
    """The tensor whose dtype transformers loads the model in when nothing names one (its
    ``get_state_dict_dtype`` over the first weights file's tensors, by name): the first floating one that is not
    float8 or float4; None without one."""
    for key in sorted(checkpoint.keys_in(checkpoint.files[0])):
        dtype = checkpoint.dtype(key)
        if dtype.is_floating_point and "float8_" not in str(dtype) and "float4_" not in str(dtype):
            return key
    return None
