"""One line for every argument error of the ``lightprune`` command (no usage dump, no Union listing).

jsonargparse reports a bad value deep in a config (``--trainer.callbacks.init_args.ratio abc``) as a nested
"Does not validate against any of the Union subtypes" listing of every candidate type and class.
:func:`condense` finds the innermost option that was given a bad value, with the class it belongs to and
the types it accepts: ``ExpertPruning: ratio='abc' is not a float or null``. Messages it cannot read are
kept as their first line.
"""

from __future__ import annotations

import re

__all__ = ["condense"]

_CLASS = re.compile(r"Problem with given class_path '([^']+)':")
_KEY = re.compile(r'Parser key "([^"]+)":')
_EXPECTED = re.compile(r"Expected a <class '([^']+)'>")
_GIVEN = re.compile(r"Given value: (.*)$")
_NAMES = {"NoneType": "null", "str": "a string", "int": "an integer", "float": "a float", "bool": "true/false"}


def _type_name(name: str) -> str:
    short = name.rsplit(".", 1)[-1]
    return _NAMES.get(short, short)


def condense(message: str) -> str:
    """The error's innermost failing option as one line; ``message``'s first line when it has no such part."""
    lines = message.splitlines()
    best = None  # (depth, owner, key, given, expected)
    owner: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        depth = len(line) - len(line.lstrip())
        owner = [(d, c) for d, c in owner if d < depth]
        found = _CLASS.search(line)
        if found:
            owner.append((depth, found.group(1)))
            continue
        key = _KEY.search(line)
        if not key:
            continue
        expected, given = [], None
        for follow in lines[i + 1:]:
            if len(follow) - len(follow.lstrip()) <= depth and follow.strip():
                break
            expected += _EXPECTED.findall(follow)
            got = _GIVEN.search(follow.strip())
            if got and given is None:
                given = got.group(1)
        if given is not None and "NestedArg" not in given and (best is None or depth > best[0]):
            best = (depth, owner[-1][1] if owner else None, key.group(1), given, expected)
    if best is None:
        return lines[0].strip() if lines else message
    _, cls, key, given, expected = best
    where = f"{cls.rsplit('.', 1)[-1]}: " if cls else ""
    accepts = " or ".join(dict.fromkeys(_type_name(t) for t in expected)) or "a valid value"
    return f"{where}{key}={given!r} is not {accepts}"
