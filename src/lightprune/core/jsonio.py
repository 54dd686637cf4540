"""JSON files written atomically and read with errors that name the file: plans, scores, reports; and the
strict value checks the plan schemas share.

A writer that dies half-way must never leave a truncated file where a later run reads it: the data goes to
``<name>.tmp`` first and is renamed into place. A file is read as UTF-8 (what :func:`write_json` writes);
one that is not, is not JSON, or has an object naming one key twice (:func:`parse_json`), is an error naming the file.
YAML is read the same way (:func:`parse_yaml`, :func:`read_yaml`): a mapping naming one key twice is refused with
the key, the file and both lines; :func:`check_yaml_keys` runs only that check (and the limits below).

Both are bounded (:class:`ParseLimitError`, naming the file and the limit): JSON arrays and objects or YAML
collections nested deeper than :data:`MAX_DEPTH` (Python's ``json`` and PyYAML's composer recurse once per level),
and YAML whose aliases, counted each time they are used, expand to more than :data:`MAX_YAML_VALUES` values (a
"billion laughs" text); both are refused before any Python value is built (:func:`check_json_depth`,
:func:`check_yaml_limits`). So is an integer longer than Python converts from text
(``sys.get_int_max_str_digits()``, 4300 digits), naming the key that holds it.

YAML is read as jsonargparse's loader reads it, so the command's first pass and its parser agree on every value:
YAML 1.2 floats (``5e-1``, ``1E5``; YAML 1.1 wants a dot and a signed exponent) and dates kept as text; a command-line
value as jsonargparse reads one, and the literals YAML 1.1 reads otherwise than YAML 1.2 or JSON:
:mod:`lightprune.core.yaml_literals`.

The checks take JSON as it is, never coerced: :func:`strict_int` refuses booleans, floats (even ``2.0``)
and strings; :func:`int_key` reads a JSON object's layer key (a plain decimal string such as ``"3"``, or
an int when the data was built in Python) and :func:`layer_items` a whole {layer: ...} object;
:func:`show` writes a bad value into a message as JSON.
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
from itertools import accumulate
from pathlib import Path
from typing import Any

from lightprune.core.paths import check_write_target, file_problem, folder_problem

__all__ = ["MAX_DEPTH", "MAX_YAML_VALUES", "DuplicateKeyError", "ParseLimitError", "check_finite", "check_json_depth",
           "check_yaml_keys", "check_yaml_limits", "clip", "clip_values", "int_key", "json_text", "layer_items",
           "non_finite", "parse_json", "parse_yaml", "read_json", "read_parsed", "read_yaml", "show",
           "strict_int", "write_json", "compose_yaml"]

_DECIMAL = re.compile(r"-?[0-9]+")

#: the deepest nesting read (JSON arrays / objects, YAML sequences / mappings, aliases followed): Python's json and
#: PyYAML's composer recurse once per level, so a text nested 100,000 deep raises RecursionError (or crashes under a
#: deep stack). The configs in configs/ nest at most 7 deep, plans, reports, tokenizer files and safetensors headers
#: about as much; 100 is far above any of them and far below the interpreter's recursion limit.
MAX_DEPTH = 100
#: the most values a YAML text may stand for, each alias counted every time it is used: a "billion laughs" text of a
#: few hundred bytes stands for 10**9 values, and whatever walks them (jsonargparse, a check) hangs. The largest
#: config in configs/ stands for about 110 values; a million is far above any real config.
MAX_YAML_VALUES = 1_000_000
_CHECK_FILE = "no file lightprune reads comes near that: check that it is the file meant"


def _int_digits_limit() -> int:
    """The most digits Python converts from text to an int (0: no limit)."""
    import sys

    return getattr(sys, "get_int_max_str_digits", lambda: 0)()


def _too_many_digits(where: str, key: str, digits: int, line: int | None = None) -> ParseLimitError:
    at = f" at line {line}" if line else ""
    limit = _int_digits_limit()
    return ParseLimitError(f"{where}: {key} is an integer of {digits} digits{at} (limit {limit} digits); no number "
                           "lightprune reads comes near that: check that it is the value meant")


class DuplicateKeyError(ValueError):
    """A JSON object or YAML mapping that names one key twice (``json.loads`` and ``yaml.safe_load`` would keep
    the last value silently)."""


class ParseLimitError(ValueError):
    """A JSON or YAML text (or a safetensors header) past one of the readers' bounds: nested deeper than
    :data:`MAX_DEPTH`, YAML aliases expanding to more than :data:`MAX_YAML_VALUES` values, a header over its size
    cap. The message names the file, the limit and what was found."""


_JSON_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_BRACKETS_OR_QUOTES = bytes(b for b in range(256) if b not in b'[]{}"')
_STEP = tuple(1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256))


def _bracket_depth(raw: bytes) -> int:
    """How deep the arrays and objects of UTF-8 JSON ``raw`` nest, from its brackets outside strings: a few linear
    passes in C and one over the brackets, no recursion."""
    # escapes go first (``\\`` pairs, then ``\"``, left to right as JSON reads them), then everything but brackets and
    # quotes, then ``""`` (an empty string, or two strings side by side: no bracket between either); what is left
    # of the strings are those holding a bracket, few
    raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_BRACKETS_OR_QUOTES).replace(b'""', b"")
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def check_json_depth(text: str | bytes, where: str) -> None:
    """Refuse JSON whose arrays and objects nest deeper than :data:`MAX_DEPTH` (:class:`ParseLimitError` naming
    ``where``, the limit and the depth found) before ``json.loads`` recurses into it; text that is not JSON is left
    to the parser."""
    opens = text.count("[") + text.count("{") if isinstance(text, str) else text.count(b"[") + text.count(b"{")
    if opens <= MAX_DEPTH:  # cannot nest deeper (most files stop here)
        return
    if isinstance(text, str):
        raw = text.encode("utf-8", "surrogatepass")
    else:
        raw = bytes(text)
        encoding = json.detect_encoding(raw)
        if encoding not in ("utf-8", "utf-8-sig"):
            try:
                raw = raw.decode(encoding).encode("utf-8", "surrogatepass")
            except UnicodeError:  # not text: json.loads says so
                return
    depth = _bracket_depth(raw)
    if depth > MAX_DEPTH:
        raise ParseLimitError(f"{where}: JSON nested {depth} levels deep (limit {MAX_DEPTH}); {_CHECK_FILE}")


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
    """``json.loads(text)``, refusing an object that names a key twice (:class:`DuplicateKeyError` naming
    ``where``, the key and both values), nesting deeper than :data:`MAX_DEPTH` and an integer longer than Python
    converts (:class:`ParseLimitError`, the latter naming its key); other errors are ``json.JSONDecodeError`` as
    from ``json.loads``."""
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
    """The :class:`ParseLimitError` for the first integer of ``text`` over Python's digit limit, naming its key."""
    limit = _int_digits_limit()
    data = json.loads(text, parse_int=lambda digits: _LongInt(digits) if limit and len(digits.lstrip("-")) > limit
                      else int(digits))
    todo: list[tuple[Any, str]] = [(data, "")]
    while todo:
        node, path = todo.pop(0)
        if isinstance(node, _LongInt):
            return _too_many_digits(where, path or "the value", len(node.lstrip("-")))
        if isinstance(node, dict):
            todo += [(value, f"{path}[{key!r}]" if path else key) for key, value in node.items()]
        elif isinstance(node, list):
            todo += [(value, f"{path}[{i}]") for i, value in enumerate(node)]
    return ParseLimitError(f"{where}: an integer of more than {limit} digits (limit {limit} digits); no number "
                           "lightprune reads comes near that: check that it is the value meant")


_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
#: the floats jsonargparse's YAML loader reads (YAML 1.2's: ``5e-1`` and ``1E5`` too), and no implicit timestamps
_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)
_yaml_loader: Any = None


def _key_of(loader: Any, node: Any) -> Any:
    """A YAML key node as the key a dict would hold (``1`` and ``true`` are one key); None for a key that is not
    a scalar."""
    import yaml

    if not isinstance(node, yaml.ScalarNode):
        return None
    try:
        key = loader.construct_object(node)
        hash(key)
    except (ValueError, TypeError, OverflowError, yaml.YAMLError):  # a key YAML cannot build (an impossible date)
        return node.tag, node.value
    return key


def _check_mapping(loader: Any, node: Any, where: str) -> None:
    """Refuse a YAML mapping node that names a key twice (merge keys ``<<`` are YAML's own overrides)."""
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        if key_node.tag == _MERGE_TAG:
            continue
        key = _key_of(loader, key_node)
        if key is None:
            continue
        first = seen.setdefault(key, key_node)
        if first is not key_node:
            named = (f"key {key_node.value!r} appears" if first.value == key_node.value else
                     f"keys {first.value!r} and {key_node.value!r} (one key) appear")
            raise DuplicateKeyError(f"{where}: {named} twice in one mapping (lines {first.start_mark.line + 1} "
                                    f"and {key_node.start_mark.line + 1}); remove one")


def _loader() -> Any:
    """``yaml.SafeLoader`` refusing a mapping that names a key twice and collections nested deeper than
    :data:`MAX_DEPTH`, resolving plain scalars as jsonargparse's loader does (:data:`_FLOAT`; dates stay text); built
    on first use: yaml loads lazily."""
    global _yaml_loader
    if _yaml_loader is None:
        import yaml

        class UniqueKeyLoader(yaml.SafeLoader):
            where = "YAML"
            depth = 0

            def construct_mapping(self, node: Any, deep: bool = False) -> Any:
                if isinstance(node, yaml.MappingNode):
                    _check_mapping(self, node, self.where)
                return super().construct_mapping(node, deep=deep)

            def compose_sequence_node(self, anchor: Any) -> Any:
                return self._nested(super().compose_sequence_node, anchor)

            def compose_mapping_node(self, anchor: Any) -> Any:
                return self._nested(super().compose_mapping_node, anchor)

            def _nested(self, compose: Any, anchor: Any) -> Any:
                """One collection deeper (the composer recurses once per level: refused past the limit)."""
                self.depth += 1
                try:
                    if self.depth > MAX_DEPTH:
                        line = self.peek_event().start_mark.line + 1
                        raise ParseLimitError(f"{self.where}: YAML nested more than {MAX_DEPTH} levels deep at line "
                                              f"{line} (limit {MAX_DEPTH}); {_CHECK_FILE}")
                    return compose(anchor)
                finally:
                    self.depth -= 1

        UniqueKeyLoader.yaml_implicit_resolvers = {
            first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_FLOAT_TAG, _TIMESTAMP_TAG)]
            for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
        UniqueKeyLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))
        _yaml_loader = UniqueKeyLoader
    return _yaml_loader


def _children(node: Any) -> list[Any]:
    """The nodes a YAML node holds (a mapping's keys and values)."""
    if node.id == "mapping":
        return [part for pair in node.value for part in pair]
    return node.value if node.id == "sequence" else []


def _check_int_digits(root: Any, where: str) -> None:
    """Refuse a YAML integer longer than Python converts from text (:class:`ParseLimitError` naming its key and
    line); each node is visited once."""
    limit = _int_digits_limit()
    todo, seen = [(root, "")], set()
    while todo and limit:
        node, path = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.id == "scalar":
            digits = sum(c.isdigit() for c in node.value) if node.tag == _INT_TAG else 0
            if digits > limit:
                raise _too_many_digits(where, path or "the value", digits, node.start_mark.line + 1)
        elif node.id == "mapping":
            for key, value in node.value:
                name = key.value if key.id == "scalar" else "a key"
                todo += [(key, f"{path}.{name}" if path else name), (value, f"{path}.{name}" if path else name)]
        else:
            todo += [(value, f"{path}[{i}]") for i, value in enumerate(node.value)]


def _check_expansion(root: Any, where: str) -> None:
    """Refuse a composed YAML node graph that, its aliases counted each time they are used, stands for more than
    :data:`MAX_YAML_VALUES` values, nests deeper than :data:`MAX_DEPTH` or holds itself (:class:`ParseLimitError`
    naming ``where`` and the line). Each node is visited once: sizes and depths are kept per node, so a
    billion-laughs text costs what its few nodes do."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    todo: list[tuple[Any, bool]] = [(root, False)]
    while todo:
        node, finished = todo.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            children = _children(node)
            size[key] = 1 + sum(size[id(child)] for child in children)
            depth[key] = 0 if node.id == "scalar" else 1 + max((depth[id(child)] for child in children), default=0)
            line = node.start_mark.line + 1
            if size[key] > MAX_YAML_VALUES:
                raise ParseLimitError(f"{where}: YAML aliases expand the value at line {line} to more than "
                                      f"{MAX_YAML_VALUES} values (limit {MAX_YAML_VALUES}); {_CHECK_FILE}")
            if depth[key] > MAX_DEPTH:
                raise ParseLimitError(f"{where}: YAML nested more than {MAX_DEPTH} levels deep through its aliases "
                                      f"at line {line} (limit {MAX_DEPTH}); {_CHECK_FILE}")
            continue
        if key in size:
            continue
        if key in open_nodes:  # reached again below itself: an alias inside the value it names
            raise ParseLimitError(f"{where}: the YAML value anchored at line {node.start_mark.line + 1} holds an "
                                  f"alias to itself, which expands without end (limit {MAX_YAML_VALUES} values); "
                                  "remove the alias")
        open_nodes.add(key)
        todo.append((node, True))
        todo += [(child, False) for child in _children(node)]


def compose_yaml(text: str | bytes, where: str) -> tuple[Any, Any]:
    """(loader, the root node or None) of ``text``, within the limits (:class:`ParseLimitError`); the caller disposes
    the loader."""
    loader = _loader()(text)
    loader.where = where
    try:
        root = loader.get_single_node()
        if root is not None:
            _check_expansion(root, where)
            _check_int_digits(root, where)
    except BaseException:
        loader.dispose()
        raise
    return loader, root


def parse_yaml(text: str | bytes, where: str) -> Any:
    """``yaml.safe_load(text)``, refusing a mapping that names a key twice (:class:`DuplicateKeyError` naming
    ``where``, the key and the lines of both) and text past the limits (:class:`ParseLimitError`, before any value
    is built); other errors are ``yaml.YAMLError`` as from ``yaml.safe_load``."""
    loader, root = compose_yaml(text, where)
    try:
        return None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()


def check_yaml_limits(text: str | bytes, where: str) -> None:
    """Only the limits of :func:`parse_yaml` (:class:`ParseLimitError`): no value is built; ``yaml.YAMLError`` for
    text that is not YAML."""
    compose_yaml(text, where)[0].dispose()


def check_yaml_keys(text: str | bytes, where: str) -> None:
    """Only the key check (and the limits) of :func:`parse_yaml`: no value is built (a value YAML cannot build is
    left to the reader that does); ``yaml.YAMLError`` for text that is not YAML."""
    import yaml

    loader, root = compose_yaml(text, where)
    try:
        todo, done = [root] if root is not None else [], set()
        while todo:
            node = todo.pop()
            if id(node) in done:
                continue
            done.add(id(node))
            if isinstance(node, yaml.MappingNode):
                _check_mapping(loader, node, where)
                todo += [part for pair in node.value for part in pair]
            elif isinstance(node, yaml.SequenceNode):
                todo += node.value
    finally:
        loader.dispose()


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
    """The YAML at ``path`` (:func:`parse_yaml`); a missing file is FileNotFoundError, a file that is not UTF-8
    text, not valid YAML, names a key twice or is past the limits ``error``, each naming ``what`` and the file."""
    import yaml

    path = Path(path)
    text = _read_text(path, what, error)
    try:
        return parse_yaml(text, f"{what} file {str(path)!r}")
    except (DuplicateKeyError, ParseLimitError) as err:
        if isinstance(err, error):  # ValueError: kept as it is
            raise
        raise error(str(err)) from err
    except yaml.YAMLError as err:
        raise error(f"{what} file {str(path)!r} is not valid YAML: {err}") from err


def write_json(data: Any, path: str | os.PathLike, indent: int | None = None) -> Path:
    """Write ``data`` to ``path`` (parents created) through a temporary file ``<name>.tmp`` renamed into place, as
    standard JSON (:func:`json_text`: a NaN or infinite float is written as ``null``). A ``path`` (or temporary
    name) there that is not a regular file or a symlink to one (a directory, a device such as ``/dev/full``, a FIFO)
    is refused first, nothing written (:func:`~lightprune.core.paths.check_write_target`). On failure the temporary
    file is removed (never a folder of that name) and the OSError raised again in one line naming ``path`` and the
    cause (:func:`_write_error`)."""
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
    """``err`` of :func:`write_json` as one line naming ``path`` and the cause, and what is there when the name
    that failed is not simply ``path``: ``tmp`` or ``path`` a folder (or no regular file), a file where ``path``'s
    folder is or would be created (:func:`~lightprune.core.paths.folder_problem`), else the name that failed."""
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
    names a key twice or nests too deep (:func:`parse_json`) ``error``, each naming ``what`` and the file."""
    path = Path(path)
    text = _read_text(path, what, error)
    try:
        return parse_json(text, f"{what} file {str(path)!r}")
    except (DuplicateKeyError, ParseLimitError) as err:
        if isinstance(err, error):  # ValueError: kept as it is
            raise
        raise error(str(err)) from err
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
        too_long = 0 < _int_digits_limit() < len(key.lstrip("-"))  # int() refuses it: no layer has such an index
        return int(key) if _DECIMAL.fullmatch(key) and not too_long and str(int(key)) == key else None
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
            if isinstance(key, str) and 0 < _int_digits_limit() < len(key.strip()) and key.strip().isdigit():
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
    a quoted string) cut by :func:`clip` (the punctuation closing it kept), then the line cut to ``limit``
    characters."""
    return clip(_LONG_WORD.sub(lambda found: clip(found.group(1)) + found.group(2), line), limit)
