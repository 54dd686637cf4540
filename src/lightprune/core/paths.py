"""Paths lightprune reads or writes: :func:`check_path_text`, :func:`broken_link`.

lightprune records the paths it reads and writes in JSON (manifests, plans, reports) and hands them to libraries
that take UTF-8 only (safetensors' writer): a name that is not UTF-8 (on Linux a byte such as 0xFF, which Python
holds as a lone surrogate, ``'\\udcff'``) is refused up front, in one line naming it, on every path that takes one.

A leaf: it imports nothing from lightprune.
"""

from __future__ import annotations

import errno
import os

__all__ = ["broken_link", "check_path_text"]


def check_path_text(path: str | os.PathLike, what: str) -> None:
    """Raise ``ValueError`` naming ``path`` (``what``: "checkpoint directory", "output directory", ...) when its
    name is not UTF-8 text."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        try:
            text.decode("utf-8")
            return
        except UnicodeDecodeError as err:
            bad = text[err.start]
            text = os.fsdecode(text)
    else:
        try:
            text.encode("utf-8")
            return
        except UnicodeEncodeError as err:
            char = text[err.start]
            bad = ord(char) - 0xDC00 if 0xDC80 <= ord(char) <= 0xDCFF else None
    byte = f" (byte {bad:#04x})" if bad is not None else ""
    raise ValueError(f"{what} {text!r} is not UTF-8 text{byte}: lightprune records paths in JSON; rename it")


def broken_link(path: str | os.PathLike) -> tuple[str, str] | None:
    """``("loop", target)`` for a symlink that leads back to itself, ``("dangling", target)`` for one whose target
    does not exist, else None (not a link, or a link that resolves)."""
    if not os.path.islink(path) or os.path.exists(path):
        return None
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    try:
        os.stat(path)
    except OSError as err:
        return ("loop" if err.errno == errno.ELOOP else "dangling"), target
    return None
