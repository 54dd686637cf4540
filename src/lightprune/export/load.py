"""Load a pruned checkpoint: :func:`load_pruned`, with clear errors for a broken directory.

Before transformers sees the directory, :func:`check_checkpoint` names what is wrong with it:
no directory, no (or unreadable) config.json, no ``.safetensors`` weights (pickle ``.bin`` /
``.pt`` files are never loaded), a shard index naming a missing shard, or a safetensors file whose
header is corrupt or whose size disagrees with its header (truncated). Only headers are read.

A uniform checkpoint loads with the stock transformers class. A non-uniform one
(``config.lightprune_experts_per_layer``) loads with :func:`.classes.resizing_class`: the stock
class plus lightprune's resize in ``__init__``, so transformers' own weight conversions (the
per-expert keys on disk fused back into ``gate_up_proj`` / ``down_proj``) still apply. The
checkpoint's ``modeling_lightprune.py`` is executed only with ``trust_remote_code=True``.

Inside Lightning's DeepSpeed ZeRO-3 ``zero.Init`` (a LightningModule's ``configure_model``) the
model is built and loaded with full parameters (:func:`lightprune.distributed.outside_zero_init`):
transformers' loader does not know that context and would compare the checkpoint's shapes with
empty partitions. DeepSpeed partitions the loaded model when its engine starts; until then each
rank holds the full weights on the CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightprune.distributed import outside_zero_init
from lightprune.export.classes import auto_class, base_class_for_config, resizing_class
from lightprune.export.remote_resize import experts_per_layer
from lightprune.export.width_format import WIDTH_PLAN_FILE, attach_width_kernels, read_width_manifest
from lightprune.width.plan import WidthPlan

__all__ = ["load_pruned", "check_checkpoint", "check_safetensors", "weight_files"]

_HEADER_LIMIT = 100 * 1024 * 1024
SAFE_INDEX = "model.safetensors.index.json"


def check_safetensors(file: str | os.PathLike) -> None:
    """Raise ``ValueError`` naming ``file`` when its header is unreadable or its size disagrees with it."""
    file = Path(file)
    size = file.stat().st_size
    try:
        with open(file, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise ValueError(f"{size} bytes, shorter than a safetensors header")
            length = int.from_bytes(head, "little")
            if length > min(size - 8, _HEADER_LIMIT):
                raise ValueError(f"header length {length} does not fit in the file of {size} bytes")
            header = json.loads(handle.read(length))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        end = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, stop = info["data_offsets"]
            if not 0 <= begin <= stop:
                raise ValueError(f"tensor {name!r} has bad data offsets {info['data_offsets']}")
            end = max(end, int(stop))
    except ValueError as err:
        raise ValueError(f"safetensors file {str(file)!r} is corrupt or truncated: {err}") from None
    except (KeyError, TypeError, UnicodeDecodeError) as err:
        raise ValueError(f"safetensors file {str(file)!r} has a corrupt header: {err!r}") from None
    if 8 + length + end != size:
        raise ValueError(f"safetensors file {str(file)!r} is corrupt or truncated: its header describes "
                         f"{8 + length + end} bytes, the file has {size}")


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The ``.safetensors`` files of a checkpoint directory (through its shard index when there is one)."""
    path = Path(path)
    index = path / SAFE_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"shard index {str(index)!r} is not valid: {err!r}") from None
        files = sorted({path / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"checkpoint {str(path)!r}: shard index names missing files {missing}")
        return files
    return sorted(path.glob("*.safetensors"))


def check_checkpoint(path: str | os.PathLike) -> Path:
    """Validate a checkpoint directory before loading; returns it as a ``Path``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} does not exist")
    if not path.is_dir():
        raise NotADirectoryError(f"checkpoint path {str(path)!r} is not a directory")
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} has no config.json")
    try:
        json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"config.json in {str(path)!r} is not valid JSON: {err}") from None
    files = weight_files(path)
    if not files:
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        hint = f" (found {pickles}; lightprune loads safetensors only)" if pickles else ""
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} has no .safetensors weights{hint}")
    for file in files:
        check_safetensors(file)
    return path


def load_pruned(path: str | os.PathLike, *, dtype: torch.dtype | str | None = None, trust_remote_code: bool = False,
                attention_backend: str = "sdpa", **from_pretrained_kwargs: Any) -> nn.Module:
    """Load a checkpoint written by :func:`save_pruned` (or any uniform one), in eval mode.

    Args:
        path: the checkpoint directory.
        dtype: weights dtype; default: the one recorded in the config.
        trust_remote_code: build the model with the checkpoint's own ``modeling_lightprune.py``
            (transformers' auto class) instead of lightprune's in-process resize.
        attention_backend: for an MWOP width checkpoint (``width_plan.json``): the path-sparse attention
            backend, ``sdpa``, ``flex`` or ``triton`` (:mod:`lightprune.export.width`).
        **from_pretrained_kwargs: passed on (``device_map``, ``attn_implementation``, ...).
    """
    path = check_checkpoint(path)
    from transformers import AutoConfig


    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    kwargs = {"dtype": dtype if dtype is not None else "auto", "use_safetensors": True, **from_pretrained_kwargs}
    with outside_zero_init():
        if trust_remote_code:
            model = auto_class(config).from_pretrained(path, config=config, trust_remote_code=True, **kwargs)
        else:
            cls = base_class_for_config(config)
            if experts_per_layer(config):
                cls = resizing_class(cls)
            model = cls.from_pretrained(path, config=config, **kwargs)
    model.eval()
    if (path / WIDTH_PLAN_FILE).is_file():
        plan = WidthPlan.load(path / WIDTH_PLAN_FILE)
        attach_width_kernels(model, plan, align=int(read_width_manifest(path)["align"]),
                             attention_backend=attention_backend)
    return model
