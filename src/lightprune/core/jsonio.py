"""JSON files written atomically and read with errors that name the file: plans, scores, reports; and the
strict value checks the plan schemas share.

A writer that dies half-way must never leave a truncated file where a later run reads it: the data goes to
``<name>.tmp`` first and is renamed into place. A file is read as UTF-8 (what `write_json` writes);
one that is not, is not JSON, or has an object naming one key twice (`parse_json`), is an error naming the file.
YAML files are read the same way (`read_yaml`, through `lightprune.core.strict_yaml.parse_yaml`).
Both are bounded (`ParseLimitError`, naming the file and the limit): the bounds and
the errors live in `lightprune.core.parse_limits`.

The checks take JSON as it is, never coerced: `strict_int` refuses booleans, floats (even ``2.0``)
and strings; `int_key` reads a JSON object's layer key (a plain decimal string such as ``"3"``, or
an int when the data was built in Python) and `layer_items` a whole {layer: ...} object;
`show` writes a bad value into a message as JSON.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import operator
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightprune.core.parse_limits import (
    DuplicateKeyError,
    ParseLimitError,
    check_json_depth,
    int_digits_limit,
    too_many_digits,
)
from lightprune.core.paths import check_write_target, file_problem, folder_problem
from lightprune.core.strict_yaml import parse_yaml

__all__ = ["check_finite", "clip", "clip_values", "int_key", "json_text", "layer_items", "non_finite", "parse_json",
           "read_json", "read_parsed", "read_yaml", "show", "strict_int", "write_json"]

_DECIMAL = re.compile(r"-?[0-9]+")


def _unique_pairs(where: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise DuplicateKeyError(f"{where}: key {key!r} appears twice in one JSON object "
                                        f"(values {show(out[key], 40)} and {show(value, 40)}); remove one")
            out[key] = value
        return out
    return hook


#: how Python's ValueError for an integer text over its digit limit (``sys.get_int_max_str_digits()``) begins
_INT_DIGITS_ERROR = "Exceeds the limit ("


def parse_json(text: str | bytes, where: str) -> Any:
    """``json.loads(text)``, refusing an object that names a key twice (`DuplicateKeyError`
    naming ``where``, the key and both values), nesting deeper than `MAX_DEPTH` and an integer
    longer than Python converts (`ParseLimitError`, the latter naming its key); other errors
    are ``json.JSONDecodeError`` as from ``json.loads``."""
    check_json_depth(text, where)
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs(where))
    except ValueError as err:
        if isinstance(err, (json.JSONDecodeError, DuplicateKeyError)) or not str(err).startswith(_INT_DIGITS_ERROR):
            raise
        raise _long_json_int(text, where) from None


class _LongInt(str):
    """An integer of the JSON text too long to convert (its digits)."""


def _long_json_int(text: str | bytes, where: str) -> ParseLimitError:
    """The `ParseLimitError` for the first integer of ``text`` over Python's digit limit,
    naming its key."""
    limit = int_digits_limit()
    data = json.loads(text, parse_int=lambda digits: _LongInt(digits) if limit and len(digits.lstrip("-")) > limit
                      else int(digits))
    todo: list[tuple[Any, str]] = [(data, "")]
    while todo:
        node, path = todo.pop(0)
        if isinstance(node, _LongInt):
            return too_many_digits(where, path or "the value", len(node.lstrip("-")))
        if isinstance(node, dict):
            todo += [(value, f"{path}[{key!r}]" if path else key) for key, value in node.items()]
        elif isinstance(node, list):
            todo += [(value, f"{path}[{i}]") for i, value in enumerate(node)]
    return ParseLimitError(f"{where}: an integer of more than {limit} digits (limit {limit} digits); no number "
                           "lightprune reads comes near that: check that it is the value meant")



def _read_text(path: str | os.PathLike, what: str, error: type[Exception]) -> str:
    """The UTF-8 text of ``path`` (``~`` expanded), naming ``what``: FileNotFoundError when missing or a dangling
    symlink, IsADirectoryError when a directory, ``error`` when a symlink loop, a special file (``/dev/null``, a
    FIFO: never read, which could block), empty (or whitespace only) or not UTF-8."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"{what} file {str(path)!r} is a directory, not a file: name the {what} file itself")
    problem = file_problem(path)
    if problem is not None:
        cls, why = problem
        raise (cls if cls is FileNotFoundError else error)(f"{what} file {str(path)!r} {why}: name the {what} file "
                                                           "itself")
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{what} file {str(path)!r} is not UTF-8 text: {err}") from err
    if not text.strip():
        raise error(f"{what} file {str(path)!r} is empty ({'whitespace only' if text else '0 bytes'}): there is "
                    f"nothing to read; name the {what} file meant, or write it again")
    return text


def read_yaml(path: str | os.PathLike, what: str, error: type[Exception] = ValueError) -> Any:
    """The YAML at ``path`` (`parse_yaml`); a missing file is FileNotFoundError, a
    file that is not UTF-8 text, not valid YAML, names a key twice or is past the limits ``error``, each naming
    ``what`` and the file."""
    import yaml

    return _read_parsed_text(path, what, error, parse_yaml, yaml.YAMLError, "YAML")


def _read_parsed_text(path: str | os.PathLike, what: str, error: type[Exception], parse: Any,
                      syntax_error: type[Exception], language: str) -> Any:
    """``parse(text, where)`` of the text at ``path`` (`_read_text`); a key named twice, a text past the limits
    (``error`` unless it is one already) and a ``syntax_error`` of ``parse`` (not valid ``language``) are ``error``,
    each naming ``what`` and the file."""
    path = Path(path)
    text = _read_text(path, what, error)
    try:
        return parse(text, f"{what} file {str(path)!r}")
    except (DuplicateKeyError, ParseLimitError) as err:
        if isinstance(err, error):  # ValueError: kept as it is
            raise
        raise error(str(err)) from err
    except syntax_error as err:
        raise error(f"{what} file {str(path)!r} is not valid {language}: {err}") from err


def write_json(data: Any, path: str | os.PathLike, indent: int | None = None) -> Path:
    """Write ``data`` to ``path`` (parents created) through a temporary file ``<name>.tmp`` renamed into place, as
    standard JSON (`json_text`: a NaN or infinite float is written as ``null``). A ``path`` (or temporary
    name) there that is not a regular file or a symlink to one (a directory, a device such as ``/dev/full``, a FIFO)
    is refused first, nothing written (`check_write_target`). On failure the temporary
    file is removed (never a folder of that name) and the OSError raised again in one line naming ``path`` and the
    cause (`_write_error`)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    text = json_text(data, indent=indent) + "\n"
    check_write_target(path, tmp)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as err:  # a full disk, a read-only folder: one line naming the file, the file as it was
        if os.path.isfile(tmp) or os.path.islink(tmp):  # ours; a folder someone left there stays
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise _write_error(err, path, tmp) from err
    return path


def _write_error(err: OSError, path: Path, tmp: Path) -> OSError:
    """``err`` of `write_json` as one line naming ``path`` and the cause, and what is there when the name
    that failed is not simply ``path``: ``tmp`` or ``path`` a folder (or no regular file), a file where ``path``'s
    folder is or would be created (`folder_problem`), else the name that failed."""
    cls, code, why = type(err), err.errno, (err.strerror or str(err)).lower()
    failed = os.fsdecode(err.filename) if err.filename is not None else None
    if failed == str(tmp) and file_problem(tmp) is not None:
        why = f"its temporary file {str(tmp)!r} {file_problem(tmp)[1]}: move it away"
    elif err.filename2 is not None and os.fsdecode(err.filename2) == str(path) and file_problem(path) is not None:
        why = f"it {file_problem(path)[1]}"  # the rename onto it failed: a folder there
    elif failed not in (None, str(path), str(tmp)):  # a folder on the way
        problem = folder_problem(path.parent)
        if problem is None:
            why = f"{failed!r}: {why}"
        else:
            cls, why = problem
            code = {NotADirectoryError: errno.ENOTDIR, PermissionError: errno.EACCES}.get(cls, code)
    return cls(code, f"could not write {str(path)!r}: {why}; it is as it was")


def json_text(data: Any, indent: int | None = None, **options: Any) -> str:
    """``json.dumps(data)`` as standard JSON, which has no NaN or Infinity: such a float (a perplexity that
    overflowed) is written as ``null``; an object JSON cannot hold is written as its ``str``."""
    return json.dumps(_finite(data), indent=indent, default=str, allow_nan=False, **options)


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float (in dicts, lists and tuples) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def non_finite(value: Any, path: str = "") -> tuple[str, float] | None:
    """(key path, value) of the first NaN or infinite float in ``value`` (dicts, lists and tuples; the path as
    ``metadata['alpha'][0]`` with ``path="metadata"``), or None: JSON has no such constant (Python's ``json`` reads
    ``NaN`` and ``Infinity``), so a plan lightprune reads refuses them and a file it writes never holds them."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path or "the value", value)
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, (list, tuple)) \
        else ()
    for key, item in items:
        found = non_finite(item, f"{path}[{key!r}]")
        if found is not None:
            return found
    return None


def check_finite(data: Any, kind: str, error: type[Exception] = ValueError) -> None:
    """Refuse (``error``) a NaN or infinite number anywhere in ``data`` (a plan's fields, or its JSON object), naming
    the key and ``kind`` (what holds it: "plan", "width plan"): JSON has no such constant, and what lightprune
    publishes is standard JSON."""
    for key, value in (data.items() if isinstance(data, Mapping) else ()):
        found = non_finite(value, str(key))
        if found is not None:
            raise error(f"{found[0]} is {show(found[1])}: a {kind} holds finite numbers only (JSON has no NaN or "
                        "Infinity; write null or a number)")


def read_json(path: str | os.PathLike, what: str, error: type[Exception] = ValueError) -> Any:
    """The JSON at ``path``; a missing file is FileNotFoundError, a file that is not UTF-8 text, not valid JSON,
    names a key twice or nests too deep (`parse_json`) ``error``, each naming ``what`` and the file."""
    return _read_parsed_text(path, what, error, parse_json, json.JSONDecodeError, "JSON")


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
    ``"1.5"``) or an integer (`strict_int`); None for anything else."""
    if isinstance(key, str):
        too_long = 0 < int_digits_limit() < len(key.lstrip("-"))  # int() refuses it: no layer has such an index
        return int(key) if _DECIMAL.fullmatch(key) and not too_long and str(int(key)) == key else None
    return strict_int(key)


def layer_items(value: Any, name: str, expect: str, error: type[Exception] = ValueError) -> list[tuple[Any, int, Any]]:
    """The {layer: item} object ``value`` (called ``name``, described as ``expect`` in errors) as
    (key as given, layer index, item) sorted by layer; ``error`` when it is not an object, a key is not
    an integer (`int_key`) or two keys name one layer (``1`` and ``"1"``)."""
    if not isinstance(value, Mapping):
        raise error(f"{name} must be an object {expect}, got {show(value)}")
    seen: dict[int, Any] = {}
    items = []
    for key, item in value.items():
        layer = int_key(key)
        if layer is None:
            if isinstance(key, str) and 0 < int_digits_limit() < len(key.strip()) and key.strip().isdigit():
                raise error(f"layer key {clip(key, 40)!r} in {name} is a number of {len(key.strip())} digits: no "
                            "model has such a layer")
            hint = ""
            if isinstance(key, str):
                try:
                    hint = f" (write it as {str(int(key))!r})"  # '03', '+3', ' 3'
                except ValueError:
                    pass
            raise error(f"layer key {repr(clip(key)) if isinstance(key, str) else show(key)} in {name} "
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


def clip(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters, saying how many more it had (``aaa… (999800 more characters)``)."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


_LONG_WORD = re.compile(r"(\S{201,}?)([\"')\]};:,.]*)(?=\s|$)")


def clip_values(line: str, limit: int = 2000) -> str:
    """A line for the terminal: every run of more than 200 characters without a space (a value: a name, a path,
    a quoted string) cut by `clip` (the punctuation closing it kept), then the line cut to ``limit``
    characters."""
    return clip(_LONG_WORD.sub(lambda found: clip(found.group(1)) + found.group(2), line), limit)
