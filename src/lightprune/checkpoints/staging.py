"""All-or-nothing output directories: write beside the target, rename into place.

`staging_dir` yields a new hidden sibling of the output directory (``.<name>.lightprune-tmp-<pid>-<random>``,
same parent, so every rename stays on one filesystem and is atomic). Whatever exception or interrupt
(KeyboardInterrupt) ends the block or arrives during any step (a second interrupt during the recovery is handled as
a kill, below):

- the output path holds the complete previous directory or the complete new one; a staged directory is renamed into
  place only after the block finished, never a partial one;
- when the block fails the staged directory is removed and the previous output is left untouched;
- with ``overwrite=True`` the previous directory is renamed aside (``-old-``), the new one renamed in, and the aside
  copy renamed once more (``-trash-``) before its deletion starts, so a copy that may be half-deleted is never put
  back. A trash copy that cannot be deleted (a read-only subdirectory) is reported by a RuntimeWarning naming it: the
  new output is complete, the copy is left to be deleted by hand (or by the next staging of the same target);
- a full disk (ENOSPC, EDQUOT, safetensors' "No space left on device"), a file over the size limit (EFBIG: ``ulimit
  -f``) or an unwritable output (EACCES, EROFS, EPERM while creating the staging directory or writing in it) raises
  one `OutputDirError` naming the output directory and what happened, chained from the original error; an
  input the block could not read (EACCES, EPERM, EISDIR, ELOOP on a file outside the output) is restated in one line
  naming it (`input_error`), its class kept;
- a SIGTERM while the staging directory exists, in a process that left SIGTERM's default action (a Python script
  calling the API), removes the staging directory before the process ends, as that signal ends it (status 143):
  `terminated_cleanly`; one that comes once the staged directory is being put in
  place ends the process once that is done, and once every output published with it is (a run's files:
  `publishing`). A process with its own SIGTERM handler keeps it.

A staging name fits the folder's limit on a name (`staging_names`); an output whose
own name is past the limit is refused up front, in one line naming it.

Leftovers of a process that died (SIGKILL, power loss, an interrupt during a deletion) carry its pid in their name.
The next staging of the same target (`clean_stale`) settles the journal of the run files a dead process was
publishing with it (`journal`; `check_out_dir`, the up-front check, does too),
deletes the staged and trash directories of dead processes, and renames an ``-old-`` copy back only when the target
is missing, which means the kill came between the two renames of a replacement (an ``-old-`` copy is complete: its
deletion never starts under that name).
Directories of live processes (a concurrent export on this machine) are left alone.

`staging_file` is the same for one file (a GGUF conversion): the target is checked up front
(`check_out_file`: a file name whose folder exists, not an existing directory, an existing file only with
``overwrite``), the block writes a hidden sibling renamed over the target once it succeeded, and on any failure the
sibling is deleted and the target is as it was; a full disk is the same one `OutputDirError`.

Output paths that are not UTF-8 text are refused up front (`check_path_text`): the
output's path is recorded in JSON.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError

from lightprune.checkpoints.journal import process_alive, recover
from lightprune.checkpoints.staging_names import (
    OLD_TAG,
    TMP_TAG,
    TRASH_TAG,
    check_name_length,
    retagged,
    sibling,
    staging_stem,
)
from lightprune.core import interrupt
from lightprune.core.checks import check_bool
from lightprune.core.errors import register_error
from lightprune.core.paths import check_path_text, file_problem

__all__ = ["OutputDirError", "check_out_dir", "check_out_file", "clean_stale", "staging_dir",
           "staging_file"]

#: how safetensors' Rust writer reports a full disk
_NO_SPACE_MARKERS = ("No space left on device", "StorageFull", "os error 28")
#: how it reports the other write errors restated here, by errno
_RUST_ERRORS = {errno.EFBIG: ("File too large", "os error 27", "FileTooLarge"),
                errno.EROFS: ("Read-only file system", "os error 30", "ReadOnlyFilesystem"),
                errno.EDQUOT: ("Disk quota exceeded", "os error 122", "FilesystemQuotaExceeded"),
                errno.EACCES: ("os error 13",)}
#: errno values meaning the output's parent cannot be written
_UNWRITABLE = (errno.EACCES, errno.EROFS, errno.EPERM)


@register_error
class OutputDirError(OSError):
    """An output directory (or file: `staging_file`) that could not be written (full disk, unwritable parent).
    The message names the output and what happened; ``errno`` is the original error's, ``__cause__`` the original
    error."""


def check_out_dir(out_dir: str | os.PathLike, overwrite: bool = False,
                  remedy: str = "pass overwrite=True to replace it") -> Path:
    """The absolute output path, after checking it may be written; errors name the path (a non-empty one without
    ``overwrite``: and ``remedy``, how the caller's user replaces it). First the journals a dead process left for it
    are settled (`recover`: a run killed while publishing its files with it),
    so that the folder judged, and kept when refused, holds one run's checkpoint and files."""
    check_bool(overwrite, "overwrite")
    check_path_text(out_dir, "output directory")
    out = Path(out_dir).expanduser().absolute()
    if out.name in ("", ".", ".."):
        raise ValueError(f"output directory {str(out_dir)!r} must name a directory, not {out.name!r}")
    check_name_length(out, "output directory")
    recover(out)
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


def _remove(path: Path, leftover_of: str) -> bool:
    """Delete the directory ``path``; True once it is gone. When it cannot be deleted, a RuntimeWarning names it
    (``leftover_of`` says what it held) and asks for deletion by hand."""
    if not os.path.lexists(path):
        return True
    try:
        shutil.rmtree(path)
    except OSError as exc:
        warnings.warn(f"could not delete {str(path)!r}, {leftover_of} ({exc}); delete it by hand (the next export "
                      "to the same directory tries again)", RuntimeWarning, stacklevel=3)
        return False
    return True


def clean_stale(out_dir: str | os.PathLike) -> list[Path]:
    """Tidy the leftovers of dead processes beside ``out_dir``: staged and trash directories are deleted, a set-aside
    previous ``out_dir`` is renamed back when ``out_dir`` is missing and otherwise retired to trash and deleted.
    Leftovers of live processes are skipped; one that cannot be deleted gets a RuntimeWarning naming it. Returns the
    leftovers deleted or restored."""
    out = Path(out_dir).expanduser().absolute()
    if not out.parent.is_dir():
        return []
    recover(out)  # the run files a killed run was publishing with its checkpoint: forward or back (journal.py)
    stem = re.escape(staging_stem(out))
    pattern = re.compile(rf"^\.{stem}\.lightprune-(tmp|old|trash)-(?:(\d+)-)?[0-9a-f]{{12}}$")
    done = []
    for entry in sorted(out.parent.iterdir()):
        match = pattern.match(entry.name)
        if match is None or not entry.is_dir() or entry.is_symlink():
            continue
        kind, pid = match.group(1), match.group(2)
        if pid is not None and (int(pid) == os.getpid() or process_alive(int(pid))):
            continue
        doomed = entry
        if kind == "old":
            if not os.path.lexists(out):
                os.rename(entry, out)  # killed between the two renames of a replacement: the previous one returns
                done.append(entry)
                continue
            doomed = retagged(entry, OLD_TAG, TRASH_TAG)
            os.rename(entry, doomed)  # from here on a half deletion can never be restored
        if _remove(doomed, f"left beside {str(out)!r} by an earlier run that did not finish"):
            done.append(entry)
    return done


def _inside(filename: str | bytes | None, out: Path) -> bool:
    """Whether ``filename`` is the output ``out``, in it, or one of its staged siblings (or in one)."""
    if filename is None:
        return False
    path = Path(os.fsdecode(filename)).absolute()
    prefix = f".{staging_stem(out)}.lightprune-"
    for part in (path, *path.parents):
        if part == out or (part.parent == out.parent and part.name.startswith(prefix)):
            return True
    return False


def _rust_errno(exc: BaseException) -> int | None:
    """The errno of a write error safetensors' Rust writer reports in words (`_RUST_ERRORS`), else None."""
    if not isinstance(exc, SafetensorError):
        return None
    text = str(exc)
    if any(marker in text for marker in _NO_SPACE_MARKERS):
        return errno.ENOSPC
    return next((code for code, markers in _RUST_ERRORS.items() if any(m in text for m in markers)), None)


def _output_dir_error(exc: BaseException, out: Path, creating: bool) -> OSError | None:
    """``exc`` restated as an `OutputDirError` naming ``out``, when it is a full disk, a file over the size
    limit or (``creating`` the staging directory, or writing in the output) an unwritable output; an input the block
    could not read restated naming it (`input_error`); None for any other
    exception."""
    if isinstance(exc, OutputDirError):
        return None
    if os.path.lexists(out):
        kept = f"nothing was written, {str(out)!r} is as it was"
    else:
        kept = f"nothing was written, {str(out)!r} was not created"
    code = exc.errno if isinstance(exc, OSError) else _rust_errno(exc)
    filename = getattr(exc, "filename", None)
    writing = isinstance(exc, SafetensorError) or _inside(filename, out)
    if code in (errno.ENOSPC, errno.EDQUOT):
        what = "disk quota exceeded" if code == errno.EDQUOT else "no space left"
        message = f"{what} on the device holding {str(out)!r}; {kept}"
    elif code == errno.EFBIG:
        message = (f"file too large for the device holding {str(out)!r} (the file size limit: `ulimit -f`, or the "
                   f"file system's largest file); {kept}")
    elif code in _UNWRITABLE and (creating or writing):
        blocked = Path(os.fsdecode(filename)).parent if filename else out.parent
        message = f"cannot write to {str(blocked)!r}: {os.strerror(code).lower()}; {kept}"
    elif isinstance(exc, OSError) and not writing:
        from lightprune.checkpoints.directory import input_error  # torch: not at import (the command's checks)

        return input_error(exc, kept)
    else:
        return None
    error = OutputDirError(message)
    error.errno = code
    return error


@contextmanager
def _creating(out: Path) -> Iterator[None]:
    """Restate a full disk or an unwritable parent raised in the block as an `OutputDirError`."""
    try:
        yield
    except OSError as exc:
        error = _output_dir_error(exc, out, creating=True)
        if error is None:
            raise
        raise error from exc


@contextmanager
def staging_dir(out_dir: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty staging directory that replaces ``out_dir`` when the block succeeds; on any exception or
    interrupt ``out_dir`` is left as it was (guarantees: the module's docstring)."""
    check_bool(overwrite, "overwrite")
    check_path_text(out_dir, "output directory")
    check_name_length(Path(out_dir).expanduser().absolute(), "output directory")
    with _creating(Path(out_dir).expanduser().absolute()):
        clean_stale(out_dir)
    out = check_out_dir(out_dir, overwrite)
    staged = sibling(out, TMP_TAG)
    with interrupt.terminated_cleanly():  # a script's SIGTERM: the staged directory removed, then the process ends
        try:
            with _creating(out):
                out.parent.mkdir(parents=True, exist_ok=True)
                os.mkdir(staged)
            yield staged
            # a signal from here on waits for what is published with it (a run's files)
            with interrupt.publishing(what=repr(str(out))):
                interrupt.hold(staged, out)
                out = check_out_dir(out, overwrite)  # the target may have appeared meanwhile
                _commit(staged, out)
                interrupt.kept(str(out))
        except BaseException as exc:
            _remove(staged, f"the unfinished staging of {str(out)!r}")
            error = _output_dir_error(exc, out, creating=False)
            if error is None:
                raise
            raise error from exc


def _commit(staged: Path, out: Path) -> None:
    """Rename ``staged`` to ``out``. An existing ``out`` is set aside first and discarded once the new one is in
    place; when interrupted before that, the previous one is renamed back."""
    if not os.path.lexists(out):
        os.rename(staged, out)
        return
    old = sibling(out, OLD_TAG)
    try:
        os.rename(out, old)
        os.rename(staged, out)
    except BaseException:
        if os.path.lexists(old):
            if os.path.lexists(staged):  # the new one is not in place: the previous one returns
                os.rename(old, out)
            else:  # interrupted just after the new one came in
                _discard(old, out)
        raise
    _discard(old, out)


def _discard(old: Path, out: Path) -> None:
    """Retire the set-aside previous ``out`` to trash (never restored from there), then delete it."""
    trash = retagged(old, OLD_TAG, TRASH_TAG)
    os.rename(old, trash)
    _remove(trash, f"the previous version of {str(out)!r}, which now holds the new output")


def check_out_file(out_file: str | os.PathLike, overwrite: bool = False,
                   remedy: str = "pass overwrite=True to replace it") -> Path:
    """The absolute output file path, after checking it may be written: it names a file, not a directory, its name
    within the folder's ``NAME_MAX``; its folder exists; a name there only when it is a regular file or a symlink to
    one (`file_problem`: a FIFO, a device, a dangling link is refused) and only with
    ``overwrite`` (else a FileExistsError ending with ``remedy``)."""
    check_bool(overwrite, "overwrite")
    check_path_text(out_file, "output file")
    out = Path(out_file).expanduser().absolute()
    if out.name in ("", ".", "..") or os.fspath(out_file).endswith(("/", os.sep)):
        raise IsADirectoryError(f"output file {os.fspath(out_file)!r} names a directory; name the file to write")
    check_name_length(out, "output file")
    if out.is_dir():
        raise IsADirectoryError(f"output path {str(out)!r} is a directory; name the file to write (a path in it)")
    if not out.parent.is_dir():
        what = "is not a directory" if out.parent.exists() else "does not exist"
        raise (NotADirectoryError if out.parent.exists() else FileNotFoundError)(
            f"the folder of output file {str(out)!r} {what}; create the folder first, or choose another path")
    if os.path.lexists(out):
        problem = file_problem(out)
        if problem is not None:  # a FIFO, a device, a socket, a dangling or looping link: the rename would replace it
            raise FileExistsError(f"output file {str(out)!r} {problem[1]}: move it away, or choose another path")
        if not overwrite:
            raise FileExistsError(f"output file {str(out)!r} exists; {remedy}")
    return out


def _clean_stale_files(out: Path) -> None:
    """Delete the staged files of dead processes beside ``out`` (left by a kill during a `staging_file`)."""
    pattern = re.compile(rf"^\.{re.escape(staging_stem(out))}{re.escape(TMP_TAG)}(\d+)-[0-9a-f]{{12}}$")
    for entry in out.parent.iterdir():
        match = pattern.match(entry.name)
        if match and entry.is_file() and not entry.is_symlink() and not process_alive(int(match.group(1))):
            entry.unlink(missing_ok=True)


@contextmanager
def staging_file(out_file: str | os.PathLike, overwrite: bool = False,
                 remedy: str = "pass overwrite=True to replace it") -> Iterator[Path]:
    """Yield an empty file beside ``out_file`` (same folder) for the block to write; renamed over ``out_file`` once
    the block succeeded, deleted on any exception or interrupt, which leaves ``out_file`` as it was (a full disk or
    an unwritable folder: one `OutputDirError` naming ``out_file``). ``out_file`` is checked first
    (`check_out_file`)."""
    out = check_out_file(out_file, overwrite, remedy)
    _clean_stale_files(out)
    staged = sibling(out, TMP_TAG)
    with interrupt.terminated_cleanly():  # a script's SIGTERM: the staged file removed, then the process ends
        with _creating(out):
            with open(staged, "xb"):
                pass
        try:
            yield staged
            if not staged.is_file() or staged.is_symlink():
                raise RuntimeError(f"the staged file {str(staged)!r} of {str(out)!r} is gone: nothing was written")
            check_out_file(out, overwrite, remedy)  # the target may have appeared meanwhile
            os.replace(staged, out)
            interrupt.kept(str(out))
        except BaseException as exc:
            if staged.is_dir() and not staged.is_symlink():
                _remove(staged, f"the unfinished staging of {str(out)!r}")
            else:
                staged.unlink(missing_ok=True)
            error = _output_dir_error(exc, out, creating=False)
            if error is None:
                raise
            raise error from exc
