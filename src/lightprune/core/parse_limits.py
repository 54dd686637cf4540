"""The bounds every reader of JSON and YAML text keeps, and the two errors the readers raise.

A text nested deeper than `MAX_DEPTH` (Python's ``json`` and PyYAML's composer recurse once per level), YAML
whose aliases, counted each time they are used, expand to more than `MAX_YAML_VALUES` values (a "billion
laughs" text), or an integer longer than Python converts from text (``sys.get_int_max_str_digits()``, 4300 digits)
is a `ParseLimitError` naming the file and the limit, raised before any Python value is built; an object or
mapping that names one key twice is a `DuplicateKeyError`. `check_json_depth` measures JSON's nesting
from its brackets alone; the YAML bounds are kept by `lightprune.core.strict_yaml`.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate

__all__ = ["CHECK_FILE", "MAX_DEPTH", "MAX_YAML_VALUES", "DuplicateKeyError", "ParseLimitError", "check_json_depth",
           "int_digits_limit", "too_many_digits"]

#: the deepest nesting read (JSON arrays / objects, YAML sequences / mappings, aliases followed): Python's json and
#: PyYAML's composer recurse once per level, so a text nested 100,000 deep raises RecursionError (or crashes under a
#: deep stack). The configs in configs/ nest at most 7 deep, plans, reports, tokenizer files and safetensors headers
#: about as much; 100 is far above any of them and far below the interpreter's recursion limit.
MAX_DEPTH = 100
#: the most values a YAML text may stand for, each alias counted every time it is used: a "billion laughs" text of a
#: few hundred bytes stands for 10**9 values, and whatever walks them (jsonargparse, a check) hangs. The largest
#: config in configs/ stands for about 110 values; a million is far above any real config.
MAX_YAML_VALUES = 1_000_000
#: the advice closing every limit's message
CHECK_FILE = "no file lightprune reads comes near that: check that it is the file meant"


def int_digits_limit() -> int:
    """The most digits Python converts from text to an int (0: no limit)."""
    import sys

    return getattr(sys, "get_int_max_str_digits", lambda: 0)()


def too_many_digits(where: str, key: str, digits: int, line: int | None = None) -> ParseLimitError:
    """The `ParseLimitError` for the integer ``key`` of ``where`` (at ``line``), ``digits`` long."""
    at = f" at line {line}" if line else ""
    limit = int_digits_limit()
    return ParseLimitError(f"{where}: {key} is an integer of {digits} digits{at} (limit {limit} digits); no number "
                           "lightprune reads comes near that: check that it is the value meant")


class DuplicateKeyError(ValueError):
    """A JSON object or YAML mapping that names one key twice (``json.loads`` and ``yaml.safe_load`` would keep
    the last value silently)."""


class ParseLimitError(ValueError):
    """A JSON or YAML text (or a safetensors header) past one of the readers' bounds: nested deeper than
    `MAX_DEPTH`, YAML aliases expanding to more than `MAX_YAML_VALUES` values, a header over its size
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
    """Refuse JSON whose arrays and objects nest deeper than `MAX_DEPTH` (`ParseLimitError` naming
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
        raise ParseLimitError(f"{where}: JSON nested {depth} levels deep (limit {MAX_DEPTH}); {CHECK_FILE}")
