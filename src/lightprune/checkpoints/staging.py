"""All-or-nothing output directories: write beside the target, rename into place.

:func:`staging_dir` yields a new hidden sibling of the output directory
(``.<name>.lightprune-tmp-<random>``, same parent, so the final rename stays on one filesystem
and is atomic). When the block exits cleanly the staged directory is renamed to the output path;
when it raises, the staged directory is removed and the output path is left as it was. With
``overwrite=True`` an existing output directory is first renamed aside, the new one renamed in,
and only then the old one deleted (restored if the second rename fails).

Leftovers of a process that was killed (SIGKILL, power loss) carry its pid in their name
(``.<name>.lightprune-tmp-<pid>-<random>``): the next staging of the same target removes staged
directories whose process is gone and, when the target itself is missing because the kill came between
the two renames of a replacement, puts the set-aside previous directory back (:func:`clean_stale`).
Directories of live processes (a concurrent export on this machine) are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["check_out_dir", "staging_dir", "clean_stale", "TMP_TAG"]

#: part of every staged / set-aside directory name, so leftovers are recognisable
TMP_TAG = ".lightprune-tmp-"
_OLD_TAG = ".lightprune-old-"


def check_out_dir(out_dir: str | os.PathLike, overwrite: bool = False,
                  remedy: str = "pass overwrite=True to replace it") -> Path:
    """The absolute output path, after checking it may be written; errors name the path (a non-empty one without
    ``overwrite``: and ``remedy``, how the caller's user replaces it)."""
    out = Path(out_dir).expanduser().absolute()
    if out.name in ("", ".", ".."):
        raise ValueError(f"output directory {str(out_dir)!r} must name a directory, not {out.name!r}")
    if out.exists() or out.is_symlink():
        if not out.is_dir() or out.is_symlink():
            raise FileExistsError(f"output path {str(out)!r} exists and is not a plain directory")
        if any(out.iterdir()):
            if not overwrite:
                raise FileExistsError(f"output directory {str(out)!r} exists and is not empty; {remedy}")
            cwd = Path.cwd().resolve()
            if out.resolve() == cwd or out.resolve() in cwd.parents:
                raise ValueError(f"refusing to replace {str(out)!r}: it holds the current working directory")
    return out


def _sibling(out: Path, tag: str) -> Path:
    return out.parent / f".{out.name}{tag}{os.getpid()}-{uuid.uuid4().hex[:12]}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def clean_stale(out_dir: str | os.PathLike) -> list[Path]:
    """Remove staged directories of ``out_dir`` left by dead processes (and restore a set-aside previous
    ``out_dir`` when the target is missing); returns what was removed or restored."""
    out = Path(out_dir).expanduser().absolute()
    if not out.parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.lightprune-(tmp|old)-(?:(\d+)-)?[0-9a-f]{{12}}$")
    done = []
    for entry in sorted(out.parent.iterdir()):
        match = pattern.match(entry.name)
        if match is None or not entry.is_dir():
            continue
        kind, pid = match.group(1), match.group(2)
        if pid is not None and (int(pid) == os.getpid() or _alive(int(pid))):
            continue
        if kind == "old" and not out.exists():
            os.rename(entry, out)  # killed between the two renames of a replacement: the previous one returns
        else:
            shutil.rmtree(entry, ignore_errors=True)
        done.append(entry)
    return done


@contextmanager
def staging_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty staging directory that replaces ``out_dir`` when the block succeeds."""
    clean_stale(out_dir)
    out = check_out_dir(out_dir, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(out, TMP_TAG)
    tmp.mkdir()
    try:
        yield tmp
        out = check_out_dir(out, overwrite)  # the target may have appeared meanwhile
        _commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _commit(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.rename(tmp, out)
        return
    old = _sibling(out, _OLD_TAG)
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
