"""A checkpoint directory: config.json, its safetensors weight files and shard index, checked before anything
loads: :func:`check_checkpoint`.

Which files are the model's weights is one rule, the one transformers' loader follows, for every path that reads
a checkpoint: the files the shard index (``model.safetensors.index.json``) names when there is one, else
``model.safetensors``. Any other file (an adapter's ``adapter_model.safetensors``, an optimizer state, a
stray copy) is not part of the checkpoint and is never read.

Refused, with the path in the message: no directory, no (or unreadable) config.json or one that names a key
twice, no weights (pickle ``.bin`` / ``.pt`` files are never loaded; shards named ``model-00001-of-00003``
without their index), a shard index that is not ``{"weight_map": {tensor: file}}``, names a missing file, or
disagrees with the shards' headers (a tensor it lists that its shard lacks, or a tensor of a shard it does not
list), and a safetensors file whose header disagrees with its bytes (:func:`.header.read_header`). config.json,
the index and the headers nested deeper than :data:`~lightprune.core.jsonio.MAX_DEPTH` are refused before they are
parsed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from lightprune.checkpoints.header import read_header
from lightprune.core.jsonio import DuplicateKeyError, parse_json

__all__ = ["SAFE_INDEX", "SAFE_WEIGHTS", "weight_files", "read_index", "read_config", "check_checkpoint",
           "checkpoint_directory", "disk_entries"]

SAFE_INDEX = "model.safetensors.index.json"
SAFE_WEIGHTS = "model.safetensors"
_SHARD_NAME = re.compile(r".*-\d+-of-\d+\.safetensors$")
_SHOWN = 8


def _listed(names: list[str]) -> str:
    return ", ".join(names[:_SHOWN]) + (f", and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _read_json_file(file: Path, what: str) -> Any:
    try:
        return parse_json(file.read_text(encoding="utf-8"), f"{what} {str(file)!r}")
    except DuplicateKeyError as err:
        raise ValueError(str(err)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{what} {str(file)!r} is not valid JSON: {err}") from None


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """config.json of a checkpoint directory as a dict (``ValueError`` naming it when it is not a JSON object,
    or names a key twice)."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"checkpoint directory {str(Path(path))!r} has no config.json")
    config = _read_json_file(file, "config.json")
    if not isinstance(config, dict):
        raise ValueError(f"config.json {str(file)!r} is not a JSON object")
    return config


def read_index(path: str | os.PathLike) -> dict[str, str] | None:
    """The shard index's ``weight_map`` ({tensor: file name}) of a checkpoint directory, None without an index;
    ``ValueError`` naming the index when it is malformed, FileNotFoundError when it names a missing file."""
    path = Path(path)
    index = path / SAFE_INDEX
    if not index.is_file():
        return None
    data = _read_json_file(index, "shard index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or \
            not all(isinstance(v, str) and v for v in weight_map.values()):
        raise ValueError(f"shard index {str(index)!r} is not valid: it needs a non-empty \"weight_map\" object "
                         "{tensor name: shard file name}")
    names = set(weight_map.values())  # a few shards named by thousands of tensors: each checked once
    outside = sorted(v for v in names if Path(v).name != v or not v.endswith(".safetensors"))
    if outside:
        raise ValueError(f"shard index {str(index)!r} names {outside}: shards are .safetensors files in the "
                         "checkpoint directory")
    missing = sorted(v for v in names if not (path / v).is_file())
    if missing:
        raise FileNotFoundError(f"checkpoint {str(path)!r}: shard index names missing files {missing}")
    return weight_map


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The model's ``.safetensors`` files of a checkpoint directory (see the module docstring); FileNotFoundError
    naming what the directory holds when it has none."""
    path = Path(path)
    weight_map = read_index(path)
    if weight_map is not None:
        return sorted(path / name for name in set(weight_map.values()))
    if (path / SAFE_WEIGHTS).is_file():
        return [path / SAFE_WEIGHTS]
    others = sorted(p.name for p in path.glob("*.safetensors"))
    shards = [name for name in others if _SHARD_NAME.match(name)]
    if shards:
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} holds shards ({_listed(shards)}) but no "
                                f"{SAFE_INDEX}: without its index nothing says which tensors it holds; restore the "
                                "index (or re-save the checkpoint)")
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
    found = [f"found {others}, not a model's weights file" if others else "",
             f"found {pickles}; lightprune loads safetensors only" if pickles else ""]
    hint = "; ".join(part for part in found if part)
    raise FileNotFoundError(f"checkpoint directory {str(path)!r} has no .safetensors weights (no {SAFE_WEIGHTS}, "
                            f"no {SAFE_INDEX})" + (f" ({hint})" if hint else ""))


def disk_entries(path: str | os.PathLike, metadata: dict[str, dict[str, str]] | None = None,
                 ) -> dict[str, tuple[Path, dict[str, Any]]]:
    """``{name: (file, header entry)}`` of the checkpoint's weight files, headers checked against their bytes and
    against the shard index; ``ValueError`` for a tensor stored twice. ``metadata``: filled with each file's
    ``__metadata__`` ({file name: {key: value}}) when given."""
    path = Path(path)
    weight_map = read_index(path)
    entries: dict[str, tuple[Path, dict[str, Any]]] = {}
    for file in weight_files(path):
        header = read_header(file)
        if metadata is not None:
            metadata[file.name] = dict(header.get("__metadata__") or {})
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if name in entries:
                raise ValueError(f"checkpoint {str(path)!r}: tensor {name!r} is stored twice "
                                 f"({entries[name][0].name} and {file.name})")
            entries[name] = (file, info)
    if weight_map is not None:
        unlisted = sorted(f"{name} in {file.name}" for name, (file, _) in entries.items() if name not in weight_map)
        elsewhere = sorted(f"{name} in {file.name}, listed in {weight_map[name]}" for name, (file, _) in entries.items()
                           if name in weight_map and weight_map[name] != file.name)
        absent = sorted(f"{name} in {file}" for name, file in weight_map.items() if name not in entries)
        parts = ([f"lists {len(absent)} tensor(s) no shard holds ({_listed(absent)})"] if absent else []) + \
            ([f"lists {len(elsewhere)} tensor(s) under another shard ({_listed(elsewhere)})"] if elsewhere else []) + \
            ([f"does not list {len(unlisted)} tensor(s) the shards hold ({_listed(unlisted)})"] if unlisted else [])
        if parts:
            raise ValueError(f"shard index {str(path / SAFE_INDEX)!r} {' and '.join(parts)}: the index and the "
                             "shards disagree; restore the files (or re-save the checkpoint)")
    return entries


def checkpoint_directory(path: str | os.PathLike) -> Path:
    """``path`` as a ``Path``, once it is an existing directory (FileNotFoundError / NotADirectoryError naming it)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} does not exist")
    if not path.is_dir():
        raise NotADirectoryError(f"checkpoint path {str(path)!r} is not a directory")
    return path


def check_checkpoint(path: str | os.PathLike) -> Path:
    """Validate a checkpoint directory's files before loading (see the module docstring); returns it as a
    ``Path``."""
    path = checkpoint_directory(path)
    read_config(path)
    disk_entries(path)
    return path
