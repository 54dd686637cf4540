"""JSON files written atomically and read with errors that name the file: plans, scores, reports; and the
strict value checks the plan schemas share.

A writer that dies half-way must never leave a truncated file where a later run reads it: the data goes to
``<name>.tmp`` first and is renamed into place. A file is read as UTF-8 (what :func:`write_json` writes);
one that is not, or is not JSON, is an error naming the file.

The checks take JSON as it is, never coerced: :func:`strict_int` refuses booleans, floats (even ``2.0``)
and strings; :func:`int_key` reads a JSON object's layer key (a plain decimal string such as ``"3"``, or
an int when the data was built in Python) and :func:`layer_items` a whole {layer: ...} object;
:func:`show` writes a bad value into a message as JSON.
"""

from __future__ import annotations

import json
import operator
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["int_key", "layer_items", "read_json", "read_parsed", "show", "strict_int", "write_json"]

_DECIMAL = re.compile(r"-?[0-9]+")


def write_json(data: Any, path: str | os.PathLike, indent: int | None = None) -> Path:
    """Write ``data`` to ``path`` (parents created) through a temporary file renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read_json(path: str | os.PathLike, what: str, error: type[Exception] = ValueError) -> Any:
    """The JSON at ``path``; a missing file is FileNotFoundError, a file that is not UTF-8 text or not
    valid JSON ``error``, each naming ``what`` and the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{what} file {str(path)!r} is not UTF-8 text: {err}") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise error(f"{what} file {str(path)!r} is not valid JSON: {err}") from err


def read_parsed(path: str | os.PathLike, what: str, error: type[Exception], parse: Any) -> Any:
    """``parse(read_json(path))``; an ``error`` that ``parse`` raises is re-raised naming ``what`` and the file."""
    data = read_json(path, what, error)
    try:
        return parse(data)
    except error as err:
        raise error(f"{what} file {str(Path(path))!r}: {err}") from err


def strict_int(value: Any) -> int | None:
    """``value`` as an int when it is an integer (Python, NumPy, or a one-element integer tensor), else
    None: booleans, floats (even ``2.0``), strings and None are not integers here."""
    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def int_key(key: Any) -> int | None:
    """A layer key as an int: a plain decimal string (``"3"``; not ``"03"``, ``"+3"``, ``" 3"`` or
    ``"1.5"``) or an integer (:func:`strict_int`); None for anything else."""
    if isinstance(key, str):
        return int(key) if _DECIMAL.fullmatch(key) and str(int(key)) == key else None
    return strict_int(key)


def layer_items(value: Any, name: str, expect: str, error: type[Exception] = ValueError) -> list[tuple[Any, int, Any]]:
    """The {layer: item} object ``value`` (called ``name``, described as ``expect`` in errors) as
    (key as given, layer index, item) sorted by layer; ``error`` when it is not an object, a key is not
    an integer (:func:`int_key`) or two keys name one layer (``1`` and ``"1"``)."""
    if not isinstance(value, Mapping):
        raise error(f"{name} must be an object {expect}, got {show(value)}")
    seen: dict[int, Any] = {}
    items = []
    for key, item in value.items():
        layer = int_key(key)
        if layer is None:
            hint = ""
            if isinstance(key, str):
                try:
                    hint = f" (write it as {str(int(key))!r})"  # '03', '+3', ' 3'
                except ValueError:
                    pass
            raise error(f"layer key {repr(key) if isinstance(key, str) else show(key)} in {name} "
                        f"is not an integer{hint}")
        if layer in seen:
            raise error(f"{name} names layer {layer} twice (keys {seen[layer]!r} and {key!r})")
        seen[layer] = key
        items.append((key, layer, item))
    return sorted(items, key=lambda t: t[1])


def show(value: Any, limit: int = 80) -> str:
    """``value`` for an error message: as JSON (``null``, ``true``, ``"0123"``, ``1.7``) where it is JSON,
    its ``repr`` otherwise, cut to about ``limit`` characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
