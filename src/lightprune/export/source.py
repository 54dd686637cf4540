"""The source checkpoint directory of an export: which it is (`resolve_source_dir`), that the output does not
replace it (`check_not_source`), and its fingerprint in the manifest (`source_fingerprint`: per
safetensors file its name, size and the SHA-256 of its header)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from torch import nn

from lightprune.checkpoints.directory import copied_files, weight_files
from lightprune.checkpoints.header import header_bytes
from lightprune.core.paths import check_path_text

__all__ = ["resolve_source_dir", "check_not_source", "source_fingerprint"]


def resolve_source_dir(model: nn.Module, source_dir: str | os.PathLike | None) -> Path | None:
    """The source checkpoint directory: ``source_dir`` (must be a directory), else ``config._name_or_path``
    when that is an existing local directory, else ``None``. A file the export would copy from it that is no regular
    file (a directory, a broken symlink, a special file) is refused here, before anything is written
    (`copied_files`)."""
    path = None
    if source_dir is not None:
        check_path_text(source_dir, "source_dir")
        path = Path(source_dir).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"source_dir {str(source_dir)!r} does not exist")
        if not path.is_dir():
            raise NotADirectoryError(f"source_dir {str(source_dir)!r} is not a directory")
    else:
        name = str(getattr(model.config, "_name_or_path", "") or "")
        if name and Path(name).expanduser().is_dir():
            check_path_text(name, "the source checkpoint directory (the model's config._name_or_path)")
            path = Path(name).expanduser()
    if path is None:
        return None
    copied_files(path)
    return path.absolute()


def check_not_source(out_dir: str | os.PathLike, source: Path | None) -> None:
    """Raise ``ValueError`` naming both paths when ``out_dir`` is the source directory or holds it."""
    if source is None:
        return
    out, src = (Path(os.path.realpath(Path(path).expanduser())) for path in (out_dir, source))  # loops: as they are
    if out == src or out in src.parents:
        where = "is" if out == src else "holds"
        raise ValueError(f"refusing to export into {str(out)!r}: it {where} the source checkpoint {str(src)!r}, "
                         "which replacing it would delete; choose another output directory")


def _header_fingerprint(file: Path, name: str) -> dict[str, Any]:
    return {"name": name, "size": file.stat().st_size, "header_sha256": hashlib.sha256(header_bytes(file)).hexdigest()}


def source_fingerprint(source: Path | None) -> list[dict[str, Any]] | None:
    """Per safetensors file of ``source``: name, size and SHA-256 of its header (the first 8 + header-length
    bytes, not the whole file); ``None`` without a local source directory."""
    if source is None:
        return None
    try:
        files = weight_files(source)
    except FileNotFoundError:  # a source folder without safetensors weights: nothing to fingerprint
        return []
    return [_header_fingerprint(f, f.relative_to(source).as_posix()) for f in files]
