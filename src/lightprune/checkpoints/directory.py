"""A checkpoint directory: config.json, its safetensors weight files (through the shard index when there is one),
checked before anything loads: :func:`check_checkpoint`.

Refused, with the path in the message: no directory, no (or unreadable) config.json, no ``.safetensors`` weights
(pickle ``.bin`` / ``.pt`` files are never loaded), a shard index naming a missing shard, or a safetensors file
whose header is corrupt or whose size disagrees with its header (truncated). Only headers are read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lightprune.checkpoints.header import check_safetensors, read_header

__all__ = ["SAFE_INDEX", "SAFE_WEIGHTS", "weight_files", "check_checkpoint", "disk_entries"]

SAFE_INDEX = "model.safetensors.index.json"
SAFE_WEIGHTS = "model.safetensors"


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



def disk_entries(path: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """``{name: (file, header entry)}`` of the safetensors files transformers loads from ``path``."""
    files = weight_files(path) if (path / SAFE_INDEX).is_file() else [path / SAFE_WEIGHTS]
    return {name: (file, info) for file in files if file.is_file()
            for name, info in read_header(file).items() if name != "__metadata__"}
