"""What the command sets in jsonargparse before it parses: a YAML loader that refuses a key named twice and YAML
past the readers' bounds (`refuse_duplicate_yaml_keys`), and the import denylist enforced
(`refuse_denied_imports`).
"""

from __future__ import annotations

from typing import Any

from lightprune.core.jsonio import show
from lightprune.core.strict_yaml import check_yaml_keys, check_yaml_limits

__all__ = ["refuse_denied_imports", "refuse_duplicate_yaml_keys"]


def _config_name(path: str) -> str | None:
    """The config file jsonargparse is reading, as the command line named it (else ``path``, its base name)."""
    try:
        from jsonargparse._util import config_load_stack  # the files being read, innermost last

        stack = config_load_stack.get()
    except (ImportError, AttributeError, LookupError):
        stack = ()
    if stack:
        return str(stack[-1][1])
    return str(path) if path else None


def refuse_duplicate_yaml_keys() -> None:
    """Make jsonargparse's YAML loader (config files and option values) refuse a mapping that names a key twice,
    naming the key, the file and both lines (it would keep the last value: a second ``trainer:`` block would replace
    the first), and, before it builds anything, YAML past the limits of `parse_yaml`
    (aliases expanding without bound, nesting too deep). What it loads is unchanged. Installed once, when the command
    starts."""
    import yaml
    from jsonargparse import get_loader, set_loader

    original = get_loader("yaml")
    if getattr(original, "refuses_duplicate_keys", False):
        return

    def load(stream: str, path: str = "") -> Any:
        if isinstance(stream, str) and stream.strip():
            name = _config_name(path)
            try:
                check_yaml_limits(stream, f"config file {name!r}" if name else f"value {show(stream.strip(), 60)}")
            except yaml.YAMLError:  # left to jsonargparse's own loader
                pass
        value = original(stream)
        if isinstance(value, (dict, list)):  # a key can only be repeated where a mapping was loaded
            name = _config_name(path)
            try:
                check_yaml_keys(stream, f"config file {name!r}" if name else f"value {stream.strip()!r}")
            except yaml.YAMLError:  # read by jsonargparse's own loader, not by PyYAML's pure-Python one
                pass
        return value

    load.refuses_duplicate_keys = True  # type: ignore[attr-defined]
    load.original = original  # type: ignore[attr-defined]
    set_loader("yaml", load, (yaml.YAMLError,))


def refuse_denied_imports() -> None:
    """Make jsonargparse refuse, before importing it, a class path that its import denylist names (``os``,
    ``subprocess``, ``pickle``, ...: what jsonargparse 5 refuses by default; 4.x only warns)."""
    from jsonargparse import set_parsing_settings

    set_parsing_settings(import_path_denylist=[])
