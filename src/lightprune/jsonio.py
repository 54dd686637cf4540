"""JSON files written atomically and read with errors that name the file: plans, scores, reports.

A writer that dies half-way must never leave a truncated file where a later run reads it: the data goes to
``<name>.tmp`` first and is renamed into place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_json", "read_json"]


def write_json(data: Any, path: str | os.PathLike, indent: int | None = None) -> Path:
    """Write ``data`` to ``path`` (parents created) through a temporary file renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_json(path: str | os.PathLike, what: str, error: type[Exception] = ValueError) -> Any:
    """The JSON at ``path``; a missing file is FileNotFoundError, invalid JSON ``error``, both naming ``what``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {str(path)!r} does not exist")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise error(f"{what} file {str(path)!r} is not valid JSON: {err}") from err
