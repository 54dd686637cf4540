"""YAML read strictly and within bounds: a mapping naming one key twice is refused with the key, the file and both
lines (`DuplicateKeyError`), and a text past the bounds of
`lightprune.core.parse_limits` (nesting, aliases expanded, long integers) before any value is built
(`compose_yaml`). `parse_yaml` builds the value; `check_yaml_keys` and `check_yaml_limits`
run only the checks.

YAML is read as jsonargparse's loader reads it, so the command's first pass and its parser agree on every value:
YAML 1.2 floats (``5e-1``, ``1E5``; YAML 1.1 wants a dot and a signed exponent) and dates kept as text; a command-line
value as jsonargparse reads one, and the literals YAML 1.1 reads otherwise than YAML 1.2 or JSON:
`lightprune.core.yaml_literals`. PyYAML is imported on first use.
"""

from __future__ import annotations

import re
from typing import Any

from lightprune.core.parse_limits import (
    CHECK_FILE,
    MAX_DEPTH,
    MAX_YAML_VALUES,
    DuplicateKeyError,
    ParseLimitError,
    int_digits_limit,
    too_many_digits,
)

__all__ = ["check_yaml_keys", "check_yaml_limits", "compose_yaml", "parse_yaml"]

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
    `MAX_DEPTH`, resolving plain scalars as jsonargparse's loader does (`_FLOAT`; dates stay text); built
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
                                              f"{line} (limit {MAX_DEPTH}); {CHECK_FILE}")
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
    """Refuse a YAML integer longer than Python converts from text (`ParseLimitError` naming its key and
    line); each node is visited once."""
    limit = int_digits_limit()
    todo, seen = [(root, "")], set()
    while todo and limit:
        node, path = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.id == "scalar":
            digits = sum(c.isdigit() for c in node.value) if node.tag == _INT_TAG else 0
            if digits > limit:
                raise too_many_digits(where, path or "the value", digits, node.start_mark.line + 1)
        elif node.id == "mapping":
            for key, value in node.value:
                name = key.value if key.id == "scalar" else "a key"
                todo += [(key, f"{path}.{name}" if path else name), (value, f"{path}.{name}" if path else name)]
        else:
            todo += [(value, f"{path}[{i}]") for i, value in enumerate(node.value)]


def _check_expansion(root: Any, where: str) -> None:
    """Refuse a composed YAML node graph that, its aliases counted each time they are used, stands for more than
    `MAX_YAML_VALUES` values, nests deeper than `MAX_DEPTH` or holds itself (`ParseLimitError`
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
                                      f"{MAX_YAML_VALUES} values (limit {MAX_YAML_VALUES}); {CHECK_FILE}")
            if depth[key] > MAX_DEPTH:
                raise ParseLimitError(f"{where}: YAML nested more than {MAX_DEPTH} levels deep through its aliases "
                                      f"at line {line} (limit {MAX_DEPTH}); {CHECK_FILE}")
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
    """(loader, the root node or None) of ``text``, within the limits (`ParseLimitError`); the caller disposes
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
    """``yaml.safe_load(text)``, refusing a mapping that names a key twice (`DuplicateKeyError` naming
    ``where``, the key and the lines of both) and text past the limits (`ParseLimitError`, before any value
    is built); other errors are ``yaml.YAMLError`` as from ``yaml.safe_load``."""
    loader, root = compose_yaml(text, where)
    try:
        return None if root is None else loader.construct_document(root)
    finally:
        loader.dispose()


def check_yaml_limits(text: str | bytes, where: str) -> None:
    """Only the limits of `parse_yaml` (`ParseLimitError`): no value is built; ``yaml.YAMLError`` for
    text that is not YAML."""
    compose_yaml(text, where)[0].dispose()


def check_yaml_keys(text: str | bytes, where: str) -> None:
    """Only the key check (and the limits) of `parse_yaml`: no value is built (a value YAML cannot build is
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
