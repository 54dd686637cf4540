"""Checkpoint sources: names like ``testbed:text-small`` that resolve to a local checkpoint folder.

A source is a prefix with two functions: ``check(name)`` raises a ValueError naming the choices for an
unknown name (called when the LightningModule is constructed, before any work), ``resolve(name)``
returns the folder (called when the model is built; it may train and cache the checkpoint first).
Packages register theirs with `register_source`, at import; a package is imported for its sources
when it declares a ``lightprune.checkpoint_sources`` entry point (``lightprune.testbed`` does), so this
module never imports the packages that provide sources. A plain path is a local directory. A leaf: the model
(MoECausalLM), tokenizer and processor loaders all resolve names here.
"""

from __future__ import annotations

import errno
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lightprune.core.paths import broken_link, check_path_text, file_problem

__all__ = ["CheckpointSource", "register_source", "sources", "check_checkpoint_name", "resolve_checkpoint",
           "ENTRY_POINT_GROUP", "not_a_directory"]

ENTRY_POINT_GROUP = "lightprune.checkpoint_sources"


@dataclass(frozen=True)
class CheckpointSource:
    prefix: str
    check: Callable[[str], object]
    resolve: Callable[[str], Path]


_SOURCES: dict[str, CheckpointSource] = {}
_ENTRY_POINTS_LOADED = False


def register_source(prefix: str, check: Callable[[str], object], resolve: Callable[[str], Path]) -> None:
    """Make checkpoint names starting with ``prefix`` (for example ``"testbed:"``) resolvable."""
    if not prefix.endswith(":") or len(prefix) < 2:
        raise ValueError(f"a checkpoint source prefix ends with ':' (like 'testbed:'), got {prefix!r}")
    _SOURCES[prefix] = CheckpointSource(prefix, check, resolve)


def sources() -> dict[str, CheckpointSource]:
    """Every registered source, by prefix (entry points loaded first)."""
    _load_entry_points()
    return dict(_SOURCES)


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        entry.load()  # importing the module registers its sources


def _source_of(name: str) -> CheckpointSource | None:
    if Path(name).is_dir():
        return None
    prefix, sep, _ = name.partition(":")
    if not sep or "/" in prefix or "\\" in prefix or len(prefix) < 2:  # a path (C:\..., ./a:b) is not a source
        return None
    found = sources().get(prefix + ":")
    if found is None:
        raise ValueError(f"unknown checkpoint source {prefix + ':'!r} in {name!r}; registered sources: "
                         f"{sorted(sources())} (or give a local checkpoint directory)")
    return found


def check_checkpoint_name(name: str) -> None:
    """Fail now for a bad checkpoint name: an unknown source name, or a directory that does not exist."""
    source = _source_of(name)
    if source is not None:
        source.check(name)
        return
    check_path_text(name, "checkpoint directory")
    if not Path(name).is_dir():
        problem = not_a_directory(name, "checkpoint directory")
        if problem is not None:
            raise problem
        hub = "" if name.startswith((".", "/", "~")) or name.count("/") != 1 else \
            " (it looks like a hub id: lightprune loads local directories only and never downloads; fetch the " \
            "checkpoint first and give its folder)"
        raise FileNotFoundError(f"checkpoint directory {name!r} does not exist{hub}")


def not_a_directory(path: str | os.PathLike, what: str) -> OSError | None:
    """The error for ``path`` (``what``: "checkpoint directory", ``~`` expanded) when a name exists there that is not
    a directory: a file (NotADirectoryError, its folder named), a dangling symlink (FileNotFoundError), a symlink
    loop (OSError ELOOP) or a special file (NotADirectoryError), each said as
    `file_problem` says it; None when it is a directory or nothing is there."""
    path = Path(path).expanduser()
    if path.is_dir() or not os.path.lexists(path):
        return None
    problem = file_problem(path)
    if problem is None:  # a regular file, or a link to one
        return _error(NotADirectoryError, errno.ENOTDIR, f"{what} {str(path)!r} is a file, not a directory: give its "
                                                         f"folder {str(path.absolute().parent)!r}")
    why = problem[1]
    link = broken_link(path)
    if link is not None and link[0] == "loop":
        return _error(OSError, errno.ELOOP, f"{what} {str(path)!r} {why}; point it at the directory, or give the "
                                            "directory itself")
    if link is not None:
        return _error(FileNotFoundError, errno.ENOENT, f"{what} {str(path)!r} {why}; restore it, or give the "
                                                       "directory")
    return _error(NotADirectoryError, errno.ENOTDIR, f"{what} {str(path)!r} {why} and not a directory; give the "
                                                     "directory")


def _error(cls: type[OSError], code: int, message: str) -> OSError:
    """``cls(message)`` with ``errno`` set (one line: ``str()`` is the message alone)."""
    error = cls(message)
    error.errno = code
    return error


def resolve_checkpoint(name: str) -> Path:
    """The local folder of checkpoint ``name`` (a source's folder, built if needed, or the path itself)."""
    source = _source_of(name)
    return Path(name) if source is None else Path(source.resolve(name))
