"""Paths lightprune reads or writes: `check_path_text`, `broken_link`, `file_problem`,
`check_state_file`, `write_atomically`.

lightprune records the paths it reads and writes in JSON (manifests, plans, reports) and hands them to libraries
that take UTF-8 only (safetensors' writer): a name that is not UTF-8 (on Linux a byte such as 0xFF, which Python
holds as a lone surrogate, ``'\\udcff'``) is refused up front, in one line naming it, on every path that takes one.

A file a run reads and rewrites (a resumable state) is checked before the run starts (`check_state_file`: a
name there that is not a regular file, a folder that cannot be written) and saved through a temporary file renamed
into place, removed on any failure (`write_atomically`); a file it must read, before it is read
(`check_input_file`: not there, not a regular file, empty). Every writer that renames a temporary file over its
target (`write_atomically`, `lightprune.core.jsonio.write_json`) first refuses a target, or a temporary
name, that is there and is no regular file (`check_write_target`): the rename would replace a directory's
name, a device (``/dev/full``), a FIFO or a socket with a regular file, and opening a FIFO to write it blocks.

A leaf: it imports nothing from lightprune.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import warnings
from pathlib import Path
from typing import BinaryIO, Callable

__all__ = ["broken_link", "check_input_file", "check_path_text", "check_state_file", "check_write_target",
           "file_problem", "flush_folder", "folder_problem", "through_file", "write_atomically"]


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


#: what a name that is not a regular file, a directory or a link is, by its ``stat`` type
_SPECIAL = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
            (stat.S_ISSOCK, "a socket"))


def file_problem(path: str | os.PathLike) -> tuple[type[Exception], str] | None:
    """(the error class, why) when the name ``path`` is there but cannot be read as a regular file: a directory
    (IsADirectoryError), a dangling symlink (FileNotFoundError), a symlink loop or a special file such as
    ``/dev/null`` (ValueError, naming its kind); None for a regular file, a symlink to one, or nothing there."""
    if not os.path.lexists(path) or os.path.isfile(path):
        return None
    link = broken_link(path)
    if link is not None:
        kind, target = link
        if kind == "loop":
            return ValueError, f"is a symlink loop (-> {target!r})"
        return FileNotFoundError, f"is a dangling symlink (its target {target!r} does not exist)"
    if os.path.isdir(path):
        return IsADirectoryError, "is a directory, not a file"
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        return OSError, f"cannot be read ({(err.strerror or str(err)).lower()})"
    kind = next((name for test, name in _SPECIAL if test(mode)), "a special file")
    return ValueError, f"is not a regular file ({kind})"


def folder_problem(folder: str | os.PathLike) -> tuple[type[Exception], str] | None:
    """(the error class, why) when no file can be written in ``folder``: it (or the closest folder above it that is
    there, where it would be created) is a file, or cannot be written (read-only for this user, or on a read-only
    file system: ``os.access`` says so even for root); None otherwise."""
    folder = Path(folder)
    there = next((p for p in (folder, *folder.parents) if os.path.lexists(p)), None)
    if there is None:
        return None
    if not there.is_dir():
        where = "is" if there == folder else f"would be created under {str(there)!r}, which is"
        return NotADirectoryError, f"its folder {str(folder)!r} {where} not a folder"
    if not os.access(there, os.W_OK | os.X_OK):
        where = "" if there == folder else f" ({str(there)!r}, where it would be created)"
        return PermissionError, (f"its folder {str(folder)!r} cannot be written{where}: read-only for this user, or "
                                 "on a read-only file system")
    return None


def _error(cls: type[Exception], message: str) -> Exception:
    """``cls(message)``, an OSError's ``errno`` set from its class (one line: ``str()`` is the message alone)."""
    error = cls(message)
    if isinstance(error, OSError):
        error.errno = {FileNotFoundError: errno.ENOENT, IsADirectoryError: errno.EISDIR,
                       NotADirectoryError: errno.ENOTDIR, PermissionError: errno.EACCES}.get(cls)
    return error


def check_input_file(path: str | os.PathLike, what: str, fix: str) -> None:
    """Refuse a file a run must read (``what``: "Lightning checkpoint (ckpt_path)") that is not there, is not a
    regular file (`file_problem`) or is empty; one line naming the file, why and ``fix`` (what to do)."""
    problem = file_problem(path)
    if problem is None and not os.path.lexists(path):
        problem = FileNotFoundError, "does not exist"
    if problem is None and os.path.getsize(path) == 0:
        problem = ValueError, "is empty (0 bytes)"
    if problem is not None:
        cls, why = problem
        raise _error(cls, f"{what} {os.fspath(path)!r} {why}; {fix}")


def check_state_file(path: str | os.PathLike, what: str, fix: str) -> None:
    """Refuse, before a run reads or rewrites it, the state file ``path`` (``what``: "calibration state") when the
    name there is not a regular file (`file_problem`) or its folder cannot be written
    (`folder_problem`); one line naming the file, why and ``fix`` (what to do)."""
    path = Path(path)
    problem = file_problem(path)
    if problem is not None:
        cls, why = problem
        raise _error(cls, f"{what} {str(path)!r} {why}: the run reads and rewrites it there; {fix}")
    problem = folder_problem(path.parent)
    if problem is not None:
        cls, why = problem
        raise _error(cls, f"{what} {str(path)!r}: {why}; {fix}")


def check_write_target(path: str | os.PathLike, tmp: str | os.PathLike, what: str = "") -> None:
    """Refuse, before anything is written, a target ``path`` a writer would rename its temporary file ``tmp`` over,
    or that temporary name, when the name is there and is not a regular file or a symlink to one
    (`file_problem`: a directory, a device, a FIFO, a socket, a dangling or looping symlink): one line naming
    ``what`` ("calibration state", or nothing) and the file, what is there and what to do. The error class is
    `file_problem`'s; an OSError carries its errno, said as the writers' other errors are (``[Errno 21]``)."""
    label = f"{what} " if what else ""
    for name, whose, fix in ((path, "it", "move it away, or write elsewhere"),
                             (tmp, f"its temporary file {str(tmp)!r}", "move it away")):
        problem = file_problem(name)
        if problem is not None:
            cls, why = problem
            message = f"could not write {label}{str(path)!r}: {whose} {why}: {fix}; it is as it was"
            error = _error(cls, message)
            raise cls(error.errno, message) if isinstance(error, OSError) and error.errno is not None else error


def through_file(save: Callable[[BinaryIO], object]) -> Callable[[Path], None]:
    """A ``write`` for `write_atomically` that opens the temporary file in Python and hands ``save`` the open
    binary file (``lambda f: torch.save(state, f)``): a library writing to a path from its own code loses the system's
    error (``torch.save`` on a full disk says "iostream error"); Python's file raises it as an OSError with its errno,
    which `write_atomically` names ("no space left on device")."""
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            save(handle)

    return write


def write_atomically(path: str | os.PathLike, write: Callable[[Path], object], what: str, *,
                     fsync: bool = False) -> Path:
    """Write ``path`` by ``write(tmp)``, ``tmp`` being ``<name>.tmp`` beside it, renamed into place (parents
    created). A ``path`` or ``tmp`` there that is not a regular file (a directory, a device, a FIFO) is refused first
    (`check_write_target`), nothing written. On any failure the temporary file is removed and ``path`` is as it
    was; an OSError, or the RuntimeError of ``torch.save``'s writer, is raised again naming ``what``, the file and the
    cause. ``fsync``: the temporary file is flushed to the disk before the rename and the folder after it (a folder
    that cannot be flushed: a RuntimeWarning naming it, the file being in place)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    check_write_target(path, tmp, what)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        if fsync:
            _flush(tmp, os.O_RDONLY)
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.isfile(tmp) or os.path.islink(tmp):  # ours; never a folder someone left there
            with contextlib.suppress(OSError):
                tmp.unlink()
        if not isinstance(err, (OSError, RuntimeError)):
            raise
        message = f"could not write {what} {str(path)!r}: {_cause(err)}; it is as it was"
        if isinstance(err, OSError):
            raise (type(err)(err.errno, message) if err.errno is not None else type(err)(message)) from err
        raise RuntimeError(message) from err
    if fsync:
        flush_folder(path.parent, f"{what} {str(path)!r}")
    return path


def _flush(path: str | os.PathLike, flags: int) -> None:
    """``fsync`` the file or folder ``path`` (opened with ``flags``)."""
    handle = os.open(path, flags)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def flush_folder(folder: str | os.PathLike, renamed: str) -> None:
    """Flush the folder ``folder`` to the disk, so that the renames and deletions in it survive a power loss; when it
    cannot be flushed (a file system without it: EINVAL), a RuntimeWarning names it and ``renamed`` (what was put in
    place there, which stays)."""
    try:
        _flush(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as err:
        warnings.warn(f"could not flush the folder {os.fspath(folder)!r} to the disk ({_cause(err)}): {renamed} is in "
                      "place, but a power loss may undo that", RuntimeWarning, stacklevel=3)


def _cause(err: BaseException) -> str:
    """The cause of a failed write in a few words: an OSError's ``strerror``, or what follows ``strerror:`` in the
    first line of ``torch.save``'s RuntimeError ("[enforce fail at ...] open file failed with strerror: ...")."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror.lower()
    line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return line.rpartition("strerror: ")[2].lower() if "strerror: " in line else line
