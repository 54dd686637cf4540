"""All-or-nothing output directories: write beside the target, rename into place.

:func:`staging_dir` yields a new hidden sibling of the output directory
(``.<name>.lightprune-tmp-<random>``, same parent, so the final rename stays on one filesystem
and is atomic). When the block exits cleanly the staged directory is renamed to the output path;
when it raises, the staged directory is removed and the output path is left as it was. With
``overwrite=True`` an existing output directory is first renamed aside, the new one renamed in,
and only then the old one deleted (restored if the second rename fails).
"""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["check_out_dir", "staging_dir", "TMP_TAG"]

#: part of every staged / set-aside directory name, so leftovers are recognisable
TMP_TAG = ".lightprune-tmp-"
_OLD_TAG = ".lightprune-old-"


def check_out_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """The absolute output path, after checking it may be written; errors name the path."""
    out = Path(out_dir).expanduser().absolute()
    if out.name in ("", ".", ".."):
        raise ValueError(f"output directory {str(out_dir)!r} must name a directory, not {out.name!r}")
    if out.exists() or out.is_symlink():
        if not out.is_dir() or out.is_symlink():
            raise FileExistsError(f"output path {str(out)!r} exists and is not a plain directory")
        if any(out.iterdir()):
            if not overwrite:
                raise FileExistsError(f"output directory {str(out)!r} exists and is not empty; "
                                      "pass overwrite=True to replace it")
            cwd = Path.cwd().resolve()
            if out.resolve() == cwd or out.resolve() in cwd.parents:
                raise ValueError(f"refusing to replace {str(out)!r}: it holds the current working directory")
    return out


def _sibling(out: Path, tag: str) -> Path:
    return out.parent / f".{out.name}{tag}{uuid.uuid4().hex[:12]}"


@contextmanager
def staging_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty staging directory that replaces ``out_dir`` when the block succeeds."""
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
