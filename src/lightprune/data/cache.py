"""Cache folders that are written whole or not at all, and checked against a manifest on every read.

Every cache lightprune writes (the default corpus, generated QA sets, testbed corpora and models) is a
folder filled under a temporary name and renamed into place (`build_folder`): a reader never sees
half a folder, and concurrent builders that write identical bytes are safe. ``manifest.json``
(`write_manifest`) records the SHA-256 and size of every file, and `check_folder` refuses a
folder whose files differ from it (truncated or edited) with a `CacheError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from lightprune.core import interrupt
from lightprune.core.errors import register_error
from lightprune.core.jsonio import parse_json
from lightprune.core.parse_limits import ParseLimitError

__all__ = ["MANIFEST", "CacheError", "sha256_file", "write_manifest", "check_folder", "publish_folder",
           "build_folder"]

MANIFEST = "manifest.json"


@register_error
class CacheError(RuntimeError):
    """A cache folder is missing or corrupt; the message names the file."""


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of the file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(folder: Path, extra: dict[str, Any]) -> None:
    """Write ``manifest.json``: ``extra`` plus the SHA-256 and size of every other file in ``folder``."""
    files = {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps({**extra, "files": files}, indent=1, sort_keys=True) + "\n")


def check_folder(folder: Path, expect: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    """The folder's manifest after checking every file against it; a CacheError otherwise."""
    path = folder / MANIFEST
    if not path.is_file():
        raise CacheError(f"{path} is missing: {folder} is not a complete cache folder")
    try:
        manifest = parse_json(path.read_text(encoding="utf-8"), str(path))
        files = manifest["files"]
    except ParseLimitError as e:
        raise CacheError(str(e)) from None
    except (ValueError, KeyError, TypeError) as e:
        raise CacheError(f"{path} is corrupt ({e})") from None
    for key, value in expect.items():
        if manifest.get(key) != value:
            raise CacheError(f"{path}: {key} is {manifest.get(key)!r}, expected {value!r}")
    unlisted = [name for name in required if name not in files]
    if unlisted:
        raise CacheError(f"{path} is corrupt (it does not list {unlisted})")
    for name, entry in files.items():
        file = folder / name
        if not file.is_file():
            raise CacheError(f"{file} is missing from the cache folder")
        if file.stat().st_size != entry["bytes"] or sha256_file(file) != entry["sha256"]:
            raise CacheError(f"{file} is corrupt (size or SHA-256 differs from {path}; truncated or "
                                     "edited?)")
    return manifest


def publish_folder(tmp: Path, final: Path, replace: bool) -> None:
    """Rename the finished ``tmp`` folder to ``final`` (atomic); ``replace``: a corrupt ``final`` goes."""
    try:
        os.rename(tmp, final)
        return
    except OSError:
        if not replace:  # another process published it first: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
            return
    stale = final.with_name(f".{final.name}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(final, stale)
    except OSError:
        pass
    try:
        os.rename(tmp, final)
    except OSError:  # a concurrent builder won the race with identical bytes
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(stale, ignore_errors=True)


def build_folder(final: Path, fill, replace: bool) -> None:
    """``fill(tmp)`` a temporary sibling of ``final``, then rename it into place (`publish_folder`)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:  # made inside: an interrupt right after the mkdir still removes it
        tmp.mkdir()
        fill(tmp)
        publish_folder(tmp, final, replace)
        interrupt.kept(f"{final} (cached)")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
