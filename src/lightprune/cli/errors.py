"""One line for every argument error of the ``lightprune`` command (no usage dump, no Union listing).

jsonargparse reports a bad value deep in a config (``--trainer.callbacks.init_args.ratio abc``) as a nested
"Does not validate against any of the Union subtypes" listing of every candidate type and class.
:func:`condense` finds the innermost option that was given a bad value, with the class it belongs to and
the types it accepts: ``ExpertPruning: ratio='abc' is not a float or null``. Messages it cannot read are
kept as their first line.
"""

from __future__ import annotations

import re

from lightprune.callbacks.options import OPTIONS

__all__ = ["condense"]

_CLASS = re.compile(r"Problem with given class_path '([^']+)':")
_KEY = re.compile(r'Parser key "([^"]+)":')
_EXPECTED = re.compile(r"Expected a <class '([^']+)'>")
_GIVEN = re.compile(r"Given value: (.*)$")
_REQUIRED = re.compile(r"the following arguments are required: (.+)$")
_NAMES = {"NoneType": "null", "str": "a string", "int": "an integer", "float": "a float", "bool": "true/false"}


def _type_name(name: str) -> str:
    short = name.rsplit(".", 1)[-1]
    return _NAMES.get(short, short)


def condense(message: str) -> str:
    """The error's innermost failing option as one line; ``message``'s first line when it has no such part."""
    lines = message.splitlines()
    required = _required(lines)
    if required:
        return required
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


def _required(lines: list[str]) -> str | None:
    """A class given without one of its required arguments (jsonargparse lists it under the option's Union as
    "the following arguments are required"): the options to set, in the command line's spelling (the keys that
    lead to it, joined by ``init_args``)."""
    ancestors: list[tuple[int, str, str]] = []  # (indent, "key" or "class", name)
    for line in lines:
        depth = len(line) - len(line.lstrip())
        ancestors = [a for a in ancestors if a[0] < depth]
        found = _KEY.search(line)
        if found:
            ancestors.append((depth, "key", found.group(1)))
            continue
        found = _CLASS.search(line)
        if found:
            ancestors.append((depth, "class", found.group(1)))
            continue
        missing = _REQUIRED.search(line.strip())
        classes = [name for _, kind, name in ancestors if kind == "class"]
        keys = [name for _, kind, name in ancestors if kind == "key"]
        if missing and classes and keys:
            names = [n.strip() for n in missing.group(1).split(",") if n.strip()]
            path = ".init_args.".join(keys)
            owner = classes[0].rsplit(".", 1)[-1]
            if keys[0] == "trainer.callbacks" and owner in OPTIONS and len(keys) > 1:  # lightprune's address
                path = ".init_args.".join([f"{OPTIONS[owner].address}.{keys[1]}", *keys[2:]])
            options = ", ".join(f"--{path}.init_args.{n}" for n in names)
            return f"{classes[-1].rsplit('.', 1)[-1]} needs {', '.join(names)}: set {options}"
    return None
