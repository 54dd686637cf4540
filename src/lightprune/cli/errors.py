"""One line for every argument error of the ``lightprune`` command (no usage dump, no Union listing).

jsonargparse reports a bad value deep in a config (``--trainer.callbacks.init_args.ratio abc``) as a nested
"Does not validate against any of the Union subtypes" listing of every candidate type and class.
`condense` finds the innermost option that was given a bad value, with the class it belongs to and
the types it accepts: ``ExpertPruning: ratio='abc' is not a float or null``. A class path outside what its option
accepts, an option a class does not take and an unknown option are said with what is accepted (and the closest
name). Messages it cannot read are kept as their first line, never an empty reason (`first_line`).
`lightning_problem` does the same for a configuration error Lightning raises once the job runs (a ``fit``
without training data).
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Iterable

from lightprune.callbacks.options import OPTIONS
from lightprune.cli.names import did_you_mean
from lightprune.cli.slots import ACCEPTS

__all__ = ["condense", "first_line", "lightning_problem"]

_CLASS = re.compile(r"Problem with given class_path '([^']+)':")
_KEY = re.compile(r'Parser key "([^"]+)":')
_EXPECTED = re.compile(r"Expected a <class '([^']+)'>")
_GIVEN = re.compile(r"(?:Given value|\. Got value): (.*)$")
_REQUIRED = re.compile(r"the following arguments are required: (.+)$")
_NAMES = {"NoneType": "null", "str": "a string", "int": "an integer", "float": "a float", "bool": "true/false"}
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.+)$")
_NOT_ACCEPTED = re.compile(r"Option '([^']+)' is not accepted")
_NOT_SUBCLASS = re.compile(r"Import path (\S+ )?does not correspond to a subclass of (\w+)")
_DENIED = re.compile(r"Importing '([^']+)' is not allowed, denied by the '([^']+)' entry")
_NOT_IMPORTED = re.compile(r"^(No module named '[^']+'|module '[^']+' has no attribute '[^']+')$")
_SUBTYPES = re.compile(r"[A-Za-z_][\w.]*\.([A-Za-z_]\w*)")
_NO_DOT = re.compile(r"Expected a dot import path string: ([A-Za-z_]\w*)$")
#: a base class in jsonargparse's words -> the slot (:data:`lightprune.cli.slots.ACCEPTS`) it is the base of
_SLOTS = {"Callback": "callback", "LightningDataModule": "data", "LightningModule": "model", "MoECausalLM": "model"}


_DATALOADER = re.compile(r"`(train|val|test|predict)_dataloader` must be implemented")
#: a loop's split -> the data it reads
_SPLITS = {"train": "training", "val": "validation", "test": "test", "predict": "prediction"}


def lightning_problem(message: str, command: str | None) -> str:
    """One line for a configuration error (MisconfigurationException) Lightning raises while ``command`` runs: a loop
    without data names the data it needs and the subcommand that needs none; others keep their first line."""
    found = _DATALOADER.search(message)
    if found:
        split = found.group(1)
        run = f"`lightprune {command}`" if command else "this subcommand"
        return (f"{run} needs {_SPLITS[split]} data: a data module with a {split} split (--data CLASS, or data: in "
                f"the config), and the job has none; a job without data runs as `lightprune export` (weight criteria "
                "such as aimer)")
    return first_line(message.splitlines(), message)


def first_line(lines: list[str], message: str) -> str:
    """A message's first non-empty line; one that only names where (``Parser key "model":``, the reason on the lines
    below it) is joined to the next non-empty line, so the reason is never empty."""
    texts = [line.strip() for line in lines if line.strip()]
    if not texts:
        return message.strip()
    return f"{texts[0]} {texts[1]}" if texts[0].endswith(":") and len(texts) > 1 else texts[0]


def _type_name(name: str) -> str:
    short = name.rsplit(".", 1)[-1]
    return _NAMES.get(short, short)


def condense(message: str, options: Iterable[str] = ()) -> str:
    """The error's innermost failing option as one line; ``message``'s first line when it has no such part.
    ``options``: the parser's option names (an unknown one is said with the closest)."""
    lines = message.splitlines()
    said = _required(lines) or _unrecognized(lines, options) or _unknown_name(lines)
    if said:
        return said
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
    if best is None or best[0] == 0:  # no inner option failed: the class itself, or an option it does not take
        said = _class_path(lines) or _not_accepted(lines)
        if said:
            return said
    if best is None:
        return first_line(lines, message)
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


def _unknown_name(lines: list[str]) -> str | None:
    """A class given by a name that is no class the option knows (``--trainer.callbacks+=ReportPag``): the closest
    of lightprune's callbacks, and how to name one."""
    found = next((m for m in (_NO_DOT.search(line.strip()) for line in lines) if m), None)
    key = next((k.group(1) for k in map(_KEY.search, lines) if k), None)
    if not found or not key:
        return None
    name = found.group(1)
    if key.endswith("callbacks"):
        return (f"{key}: {name!r} is no callback's class name{did_you_mean(name, OPTIONS)}; lightprune's: "
                f"{', '.join(OPTIONS)}; Lightning's by name too (EarlyStopping), others by class path "
                "(package.module.Class)")
    return f"{key}: {name!r} is no class name it knows; give a class path (package.module.Class)"


def _unrecognized(lines: list[str], options: Iterable[str]) -> str | None:
    """An option no parser has: jsonargparse's line, with the closest option."""
    found = _UNRECOGNIZED.search(lines[0]) if lines else None
    if not found:
        return None
    head = next((arg.split("=", 1)[0] for arg in found.group(1).split() if arg.startswith("--")), None)
    hint = did_you_mean(head, [o for o in options if o.startswith("--")]) if head else ""
    return f"{lines[0].strip()}{hint}"


def _accepts(lines: list[str], base: str | None) -> str:
    """What the option accepts: ``base`` (the class jsonargparse checked against) or its listed subtypes."""
    if base is None:
        subtypes = next((line for line in lines if line.strip().startswith("Subtypes:")), "")
        base = next((n for n in _SUBTYPES.findall(subtypes) if n != "NoneType"), None)
    return ACCEPTS[_SLOTS[base]] if base in _SLOTS else f"a {base} subclass" if base else "a class it accepts"


def _class_path(lines: list[str]) -> str | None:
    """A class path that is not what its option accepts (not a subclass, denied, not importable): the option, the
    path, what it accepts, and that nothing was built."""
    key = next((found.group(1) for found in map(_KEY.search, lines) if found), None)
    for i, line in enumerate(lines):
        text = line.strip()
        found = _DENIED.search(text)
        if found:
            return (f"{key}: {found.group(1)!r} is not {_accepts(lines, None)}: importing it is denied (the "
                    f"{found.group(2)!r} entry of jsonargparse's import denylist); it was not loaded")
        found = _NOT_SUBCLASS.search(text)
        given = (found.group(1) or _given(lines)) if found else None
        if given:
            return f"{key}: {given.strip()!r} is not {_accepts(lines, found.group(2))}; it was not built"
        found = _CLASS.search(text)
        reason = _NOT_IMPORTED.match(lines[i + 1].strip()) if found and i + 1 < len(lines) else None
        if reason:
            return f"{key}: cannot import {found.group(1)!r} ({reason.group(1)}); nothing was built"
    return None


def _given(lines: list[str]) -> str | None:
    """The outermost ``Given value:`` of a message (the value of its first key)."""
    return next((found.group(1) for found in (_GIVEN.search(line.strip()) for line in lines) if found), None)


def _parameters(class_path: str) -> list[str]:
    """The constructor's parameters of a class the parser has imported already (none is imported here)."""
    module, _, name = class_path.rpartition(".")
    cls = getattr(sys.modules.get(module), name, None)
    try:
        parameters = inspect.signature(cls).parameters if isinstance(cls, type) else {}
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _not_accepted(lines: list[str]) -> str | None:
    """An option a class does not take: the option as the command line spells it, the class, the closest option."""
    ancestors: list[tuple[int, str, str]] = []  # (indent, "key" or "class", name)
    for line in lines:
        depth = len(line) - len(line.lstrip())
        ancestors = [a for a in ancestors if a[0] < depth]
        for kind, pattern in (("key", _KEY), ("class", _CLASS)):
            found = pattern.search(line)
            if found:
                ancestors.append((depth, kind, found.group(1)))
        option = _NOT_ACCEPTED.search(line.strip())
        classes = [name for _, kind, name in ancestors if kind == "class"]
        keys = [name for _, kind, name in ancestors if kind == "key"]
        if option and classes and keys:
            name = option.group(1).split(".", 1)[0]  # a nested key: its first part is the option
            path = ".init_args.".join(keys)
            known = [*_parameters(classes[-1]), "init_args", "class_path"]
            return (f"--{path}.init_args.{name}: {classes[-1].rsplit('.', 1)[-1]} has no option {name!r}"
                    f"{did_you_mean(name, known)}")
    return None
