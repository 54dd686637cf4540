"""YAML literals as jsonargparse reads them, and those it reads otherwise than YAML 1.2 or JSON would.

jsonargparse reads a command-line value with its own first pass (``true``, ``null``, decimal integers: ``020`` is 20,
`parse_value`) and a config's values with PyYAML's YAML 1.1 resolver, where ``020`` is 16, ``08`` and ``0o20``
are text, ``1:30`` is 90 and ``yes`` is true. `yaml_scalars` lists a text's scalars with where they are and
how they were written; `yaml_1_1_reading` says both readings of one that YAML 1.1 reads otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lightprune.core.strict_yaml import compose_yaml, parse_yaml

__all__ = ["YamlScalar", "parse_value", "yaml_1_1_reading", "yaml_scalars"]


def parse_value(text: str, where: str) -> Any:
    """A command-line value as jsonargparse reads one: ``true``, ``false``, ``null``, decimal integers (``020`` is 20)
    and plain decimal floats first, then YAML (`parse_yaml`); empty text is kept as it is."""
    if text.strip() == "-":  # jsonargparse's stdin marker
        return text
    basic = _basic_value(text)
    if basic is not _NOT_BASIC:
        return basic
    return parse_yaml(text, where) if text.strip() else text


_NOT_BASIC = object()


def _basic_value(text: str) -> Any:
    """jsonargparse's reading of a command-line value before YAML (``load_basic``), or `_NOT_BASIC`."""
    value = text.strip()
    if value in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[value]
    try:
        if value.isdigit() or (value.startswith("-") and value[1:].isdigit()):
            return int(value)
        if value.replace(".", "", 1).replace("e", "", 1).replace("-", "", 2).isdigit() and ("e" in value or
                                                                                           "." in value):
            return float(value)
    except ValueError:
        pass
    return _NOT_BASIC


@dataclass(frozen=True)
class YamlScalar:
    """A scalar of a YAML text: ``path`` (the keys and list indices that lead to it; a key's own path is its
    mapping's), whether it is a mapping's ``key``, its ``line``, its ``text`` as written, whether it is ``plain``
    (not quoted, no explicit tag) and its ``value`` as read."""

    path: tuple[Any, ...]
    key: bool
    line: int
    text: str
    plain: bool
    value: Any


def yaml_scalars(text: str | bytes, where: str) -> list[YamlScalar]:
    """Every scalar of a YAML text, in document order, each node once (an alias is not followed again); within the
    limits of `parse_yaml`. A scalar YAML cannot build has its text as its value."""
    import yaml

    loader, root = compose_yaml(text, where)
    found: list[YamlScalar] = []
    try:
        todo, seen = ([((), root, False)] if root is not None else []), set()
        while todo:
            path, node, is_key = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.ScalarNode):
                try:
                    value = loader.construct_object(node)
                except (ValueError, TypeError, OverflowError, yaml.YAMLError):
                    value = node.value
                plain = node.style is None and node.tag == loader.resolve(yaml.ScalarNode, node.value, (True, False))
                found.append(YamlScalar(path, is_key, node.start_mark.line + 1, node.value, plain, value))
            elif isinstance(node, yaml.MappingNode):
                for key, value in reversed(node.value):
                    name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                    todo += [((*path, name), value, False), (path, key, True)]
            else:
                todo += [((*path, i), value, False) for i, value in reversed(list(enumerate(node.value)))]
    finally:
        loader.dispose()
    return found


_LEADING_ZERO = re.compile(r"[-+]?0[0-9_]*[1-9][0-9_]*")
_PREFIXED_OCTAL = re.compile(r"([-+]?)0o([0-7]+)")
_BASE_60 = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_BOOL_WORDS = ("yes", "no", "on", "off")


def yaml_1_1_reading(text: str, value: Any) -> tuple[str, str] | None:
    """(kind, what to say) where YAML 1.1, as jsonargparse's loader reads it, reads the plain scalar ``text`` (read as
    ``value``) otherwise than YAML 1.2 or JSON would: ``"octal"`` (``020`` is 16, ``08`` is text), ``"0o"``
    (``0o20`` is text), ``"base 60"`` (``1:30`` is 90), ``"bool"`` (``yes`` is true); None where both agree."""
    if isinstance(value, bool):
        word = "true" if value else "false"
        if text.lower() in _BOOL_WORDS:
            return "bool", (f"{text} is read as {word} (YAML 1.1 boolean), not the text {text!r}: write {word} for "
                            f"the boolean, or quote it ({text!r}) for text")
        return None
    if _LEADING_ZERO.fullmatch(text):
        decimal = int(text.replace("_", ""), 10)
        if isinstance(value, int) and value != decimal:
            return "octal", (f"{text} is read as {value} (YAML 1.1 octal), not {decimal}: write {decimal} (or "
                             f"{value}, if octal {text} was meant)")
        if isinstance(value, str):
            return "octal", (f"{text} is read as the text {text!r} (YAML 1.1 reads a leading 0 as octal, and 8 and 9 "
                             f"are no octal digits), not {decimal}: write {decimal}, or quote it ({text!r}) for text")
        return None
    found = _PREFIXED_OCTAL.fullmatch(text)
    if found and isinstance(value, str):
        number = int(found.group(2), 8) * (-1 if found.group(1) == "-" else 1)
        return "0o", (f"{text} is read as the text {text!r} (YAML 1.1 has no 0o prefix), not {number} (YAML 1.2 "
                      f"octal): write {number}, or quote it ({text!r}) for text")
    if _BASE_60.fullmatch(text) and isinstance(value, (int, float)):
        return "base 60", (f"{text} is read as {value} (YAML 1.1 base 60), not the text {text!r}: write {value}, or "
                           f"quote it ({text!r}) for text")
    return None
