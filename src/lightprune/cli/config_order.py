"""Options and configs are applied in order: an option given before a ``--config`` that sets the same key would be
replaced by the config's value without a word (`config_order_problem`, part of the command line's first pass,
`lightprune.cli.command_line_checks.check_command_line`).
"""

from __future__ import annotations

from typing import Any

from lightprune.cli.inputs import load_config
from lightprune.core.parse_limits import DuplicateKeyError, ParseLimitError

__all__ = ["config_order_problem"]


def _key_path(option: str) -> tuple[str, ...]:
    """An option's key in a config, without ``init_args`` (a config may write a class's options either way) and
    without a trailing ``class_path`` or ``+`` (``--model.class_path X``, ``--trainer.callbacks+=X``: the entry)."""
    parts = [part for part in option.removeprefix("--").removesuffix("+").split(".") if part != "init_args"]
    if parts and parts[-1] == "class_path":
        parts.pop()
    return tuple(parts)


def _sets(config: Any, key: tuple[str, ...]) -> bool:
    """Whether a config's mapping sets ``key`` (or a key above it, or the class at it), so that reading the config
    after the option replaces what the option gave."""
    node = config
    for part in key:
        if not isinstance(node, dict):
            return True  # a value above the key: the config replaces the whole
        if "init_args" in node and part not in node and isinstance(node["init_args"], dict):
            node = node["init_args"]
        if part not in node:
            return False
        node = node[part]
    return not (isinstance(node, dict) and "class_path" not in node)  # options added to the class given: kept


def config_order_problem(argv: list[str]) -> str | None:
    """What is wrong with an option given before a ``--config`` that sets the same key (jsonargparse applies them in
    order, so the config's value would replace the option's without a word), or None. An option the config does not
    set is fine; a config that cannot be read is left to where the configs are read."""
    given: list[tuple[str, tuple[str, ...]]] = []
    i = 0
    while i < len(argv):
        head, eq, text = argv[i].partition("=")
        if head in ("--config", "-c"):
            if not eq:
                if i + 1 >= len(argv):
                    return None
                i += 1
                text = argv[i]
            try:
                where, content = load_config(text, head)
            except (ValueError, DuplicateKeyError, ParseLimitError):  # refused where the configs are read
                return None
            for option, key in given:
                if key and isinstance(content, dict) and _sets(content, key):
                    label = f"--config {text}" if where not in ("--config", "-c") else f"the {head} given inline"
                    return (f"{option} is given before {label}, which sets {option[2:].removesuffix('+')} too and "
                            "would replace it (options and configs are applied in order); give "
                            f"{head} first, then {option}")
        elif head.startswith("--") and head != "--print_config":
            given.append((head, _key_path(head)))
        i += 1
    return None
