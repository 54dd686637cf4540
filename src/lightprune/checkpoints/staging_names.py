"""The names of an output's staging siblings: ``.<stem><tag><pid>-<random>``, the tag saying what the sibling is
(`TMP_TAG` staged, `OLD_TAG` set aside, `TRASH_TAG` being deleted) and the pid whose process made it.

A staging name fits the folder's limit on a name (``NAME_MAX``, 255 bytes on most file systems: ``os.pathconf``):
where the output's own name leaves no room for the tag, the pid and the random part, the name part is shortened to
its first bytes and a short hash of the whole name (``.<first bytes>~<hash>.lightprune-tmp-<pid>-<random>``, the same
for every staging of that output, so leftovers stay recognisable: `staging_stem`); an output whose own name is
past the limit is refused up front, in one line naming it (`check_name_length`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import uuid
from pathlib import Path

__all__ = ["OLD_TAG", "TMP_TAG", "TRASH_TAG", "check_name_length", "retagged", "sibling", "staging_stem"]

#: part of every staged directory's name, so leftovers are recognisable
TMP_TAG = ".lightprune-tmp-"
#: a previous output set aside during a replacement; complete, restored if the target is missing
OLD_TAG = ".lightprune-old-"
#: a previous output whose deletion may have started; only ever deleted
TRASH_TAG = ".lightprune-trash-"

#: the longest name (in bytes) where a folder's file system does not say (Linux's NAME_MAX)
_NAME_MAX = 255
#: what a staging name adds to the part it takes from its output's name: the leading dot, the longest tag, a pid
#: (up to 10 digits) and the random part with its dash
_RESERVE = 1 + len(TRASH_TAG) + 10 + 1 + 12
#: the hexadecimal digits of the hash that ends a shortened name part
_HASH_DIGITS = 12


def _name_max(folder: Path) -> int:
    """The longest name, in bytes, the file system of ``folder`` (or of the closest folder above it that is there)
    allows (``os.pathconf``'s ``PC_NAME_MAX``; 255 where it does not say)."""
    for there in (folder, *folder.parents):
        if os.path.isdir(there):
            try:
                limit = os.pathconf(there, "PC_NAME_MAX")
            except (OSError, ValueError):
                return _NAME_MAX
            return limit if limit > 0 else _NAME_MAX
    return _NAME_MAX


def staging_stem(out: str | os.PathLike) -> str:
    """The part of the name of ``out``'s staging siblings (``.<stem>.lightprune-tmp-<pid>-<random>``, ``-old-``,
    ``-trash-``) taken from ``out``'s name: the name itself, or where a sibling's name would pass the folder's
    ``NAME_MAX`` (`_name_max`), the name's first bytes (whole characters), ``~`` and the first
    `_HASH_DIGITS` hexadecimal digits of the SHA-256 of the whole name. The same for every staging of ``out``,
    so `clean_stale` recognises the leftovers of either form."""
    out = Path(out)
    raw = os.fsencode(out.name)
    room = _name_max(out.parent) - _RESERVE
    if len(raw) <= room:
        return out.name
    head = raw[:max(room - _HASH_DIGITS - 1, 0)].decode("utf-8", "ignore")  # a cut character dropped whole
    return f"{head}~{hashlib.sha256(raw).hexdigest()[:_HASH_DIGITS]}"


def check_name_length(out: Path, what: str) -> None:
    """Refuse an output (``what``: "output directory", "output file") whose name is longer than its folder's file
    system allows: one line naming it, its length and the limit."""
    size, limit = len(os.fsencode(out.name)), _name_max(out.parent)
    if size > limit:
        raise OSError(errno.ENAMETOOLONG, f"{what} name {out.name!r} is {size} bytes long, more than the {limit} the "
                      f"file system of {str(out.parent)!r} allows in a name; choose a shorter name")


def sibling(out: Path, tag: str) -> Path:
    """A new staging sibling of ``out`` for this process: ``.<stem><tag><pid>-<random>``."""
    return out.parent / f".{staging_stem(out)}{tag}{os.getpid()}-{uuid.uuid4().hex[:12]}"


def retagged(path: Path, old_tag: str, new_tag: str) -> Path:
    """``path`` with ``old_tag`` in its name replaced by ``new_tag`` (same pid and random part)."""
    return path.with_name(path.name.replace(old_tag, new_tag, 1))
