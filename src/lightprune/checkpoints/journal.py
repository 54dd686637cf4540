"""A run's files published with its checkpoint, so that no kill leaves one run's checkpoint beside another's plan.

A run writes its checkpoint (a staged directory renamed into place: `staging`) and,
beside it, the files that describe it (plan.json, scores.json, report.json, config.yaml). No rename puts several
paths in place at once, so the files go through a journal:

1. `write_pending`, before the checkpoint's rename: first the journal (``.<checkpoint>.lightprune-journal-
   <pid>.json`` beside the checkpoint), naming the staged directory by its device and inode, which its rename keeps,
   and each file by its absolute path, with the SHA-256 of its new text; then each file's new text beside it
   (``.<name>.lightprune-pending-<pid>``);
2. the checkpoint is renamed into place (only once `write_pending` has returned: every pending file is there);
3. `complete`: each pending file is renamed over its target, then the journal is deleted.

Files the run writes only after its checkpoint is in place (report.json with the export's figures, its PNG) are named
in the journal as ``superseded``: a roll forward deletes those the run had not rewritten yet (older than the
journal), which described the previous checkpoint. So are the previous run's files that this run does not write
(its calibration.json beside a new plan, with ``overwrite``): `complete` deletes those it is given
(``remove``), and a roll forward after a kill those still older than the journal.

Before anything is written, `write_pending` proves that every target of the journal (each file, each superseded
one) can be replaced (`check_replaceable`: an immutable or append-only file, a folder that cannot be written,
a read-only file system, a directory in a file's place) and refuses otherwise, naming the file, with nothing
written: a folder is never left with the new checkpoint beside files that could not follow it. What can still fail
after the checkpoint's rename (a file made immutable meanwhile) is one error saying so, the journal kept for the next
export to that checkpoint to finish (`recover`).

A process killed anywhere in between (SIGKILL) leaves the journal, or only its temporary file (``<journal>.tmp``)
when killed while writing it, before any pending file; `recover` (run by the next staging of the same
checkpoint, `clean_stale`, and by the up-front check of that output directory,
`check_out_dir`, so a rerun refused for a non-empty folder settles it too)
deletes such a temporary file and rolls a journal forward when the checkpoint in place is the staged directory it
names (its pending files, all written before that rename, describe it) and back otherwise (its pending files, those
there, are deleted): either way the folder holds one run's checkpoint and files. Journals of live processes (a
concurrent export) are left alone; a journal that cannot be settled is left, with a RuntimeWarning naming it.

The journal is flushed to the disk (``fsync``, with its folder) when written, and the folders once it is deleted;
the checkpoint's weights and the pending files are not. What holds is the above for a kill of the process at any
point; for a power loss, only as far as the file system keeps the renames in the order they were made.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import warnings
from pathlib import Path

from lightprune.core.paths import flush_folder, write_atomically

__all__ = ["check_replaceable", "complete", "journal_path", "process_alive", "recover", "settle", "write_pending"]

_PENDING = ".lightprune-pending-"
_PROBE = ".lightprune-probe-"

#: FS_IOC_GETFLAGS (``lsattr``) and its immutable and append-only flags
_GETFLAGS, _IMMUTABLE, _APPEND = 0x80086601, 0x10, 0x20


def journal_path(out: Path, pid: int | None = None) -> Path:
    """The journal of checkpoint ``out`` written by process ``pid`` (default: this one)."""
    return out.parent / f".{out.name}.lightprune-journal-{os.getpid() if pid is None else pid}.json"


def _pending(target: Path) -> Path:
    """Where this process writes the new text of ``target`` aside."""
    return target.with_name(f".{target.name}{_PENDING}{os.getpid()}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _flags(path: Path) -> int | None:
    """The inode flags of ``path`` (``lsattr``), None where they cannot be read (no such ioctl, no permission)."""
    try:
        import array
        import fcntl

        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except (ImportError, OSError):
        return None
    try:
        buf = array.array("l", [0])
        fcntl.ioctl(fd, _GETFLAGS, buf, True)
        return buf[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def _refusal(code: int, target: Path, why: str, out: Path | None) -> OSError:
    kept = (f"nothing was published, {str(out)!r} and its run files are as they were" if out is not None
            else "nothing was written")
    return OSError(code, f"cannot replace {str(target)!r}: {why}; {kept}")


def _probe(target: Path, out: Path | None) -> None:
    """Refuse (`check_replaceable`) ``target`` when it cannot be replaced or deleted."""
    if target.is_dir() and not target.is_symlink():
        raise _refusal(errno.EISDIR, target, "it is a directory", out)
    one, two = (target.with_name(f".{target.name}{_PROBE}{os.getpid()}{n}") for n in ("a", "b"))
    for path in (one, two):
        path.unlink(missing_ok=True)
    try:
        os.close(os.open(one, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # the folder can be written
    except FileNotFoundError:  # a folder still to be made: the pending file's write makes it (and says so)
        return
    except OSError as err:
        raise _refusal(err.errno, target, f"its folder cannot be written ({os.strerror(err.errno).lower()})",
                       out) from None
    try:
        if not os.path.lexists(target):
            return
        try:
            os.link(target, two, follow_symlinks=False)
        except OSError as err:
            if err.errno not in (errno.EPERM, errno.EACCES):
                return  # no hard link here (another device, too many links...): the rename tells
            flags = _flags(target)
            if flags is not None and flags & (_IMMUTABLE | _APPEND):
                raise _refusal(err.errno, target, "it is immutable or append-only (lsattr shows i or a; chattr -i "
                               "or -a, as root, clears it)", out) from None
            try:  # links refused for the file itself, not for any file of that folder: it cannot be replaced
                os.link(one, two)
            except OSError:
                return  # a file system without hard links: nothing more to tell
            try:
                owned = os.lstat(target).st_uid == os.geteuid()
            except OSError:
                owned = True
            if owned or os.geteuid() == 0:  # not another user's file, which the kernel may refuse to link
                raise _refusal(err.errno, target, f"{os.strerror(err.errno).lower()} (an immutable or append-only "
                               "file: lsattr shows it)", out) from None
    finally:
        for path in (two, one):
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


def check_replaceable(paths, out: Path | None = None) -> None:
    """Prove that each of ``paths`` can be renamed over (or deleted) without touching it: for one that exists, a hard
    link to it under a probe name beside it, then removed (``link`` fails with EPERM on an immutable or append-only
    file, with EACCES or EROFS where the folder cannot be written); for one that does not, an empty probe file in its
    folder. Raises an OSError (one line, without a filename) naming the first that cannot, saying that nothing of
    checkpoint ``out`` was published."""
    for path in paths:
        _probe(Path(path), out)


def write_pending(files: dict[str, str], staged: Path, out: Path, superseded: list[str] = ()) -> Path:
    """Write the journal of checkpoint ``out`` (to be renamed from ``staged``; ``superseded``: the files the run
    rewrites after it, and the previous run's it deletes), flushed to the disk, then each of ``files`` ({target path:
    text}) beside its target; returns the journal's path. Every path is recorded absolute. First every target and
    superseded file is proven replaceable (`check_replaceable`), else an OSError naming it, nothing written. On
    any failure what it wrote is removed (pending files first, the journal last)."""
    info = os.stat(staged)
    out = Path(out).absolute()
    check_replaceable([*(Path(target).absolute() for target in files),
                       *(Path(path).absolute() for path in superseded)], out)
    journal = journal_path(out)
    texts = {str(Path(target).absolute()): text for target, text in files.items()}
    aside = {target: _pending(Path(target)) for target in texts}
    record = {"checkpoint": str(out), "device": info.st_dev, "inode": info.st_ino,
              "files": {target: {"pending": str(aside[target]), "sha256": _sha256(text.encode("utf-8"))}
                        for target, text in texts.items()},
              "superseded": [str(Path(path).absolute()) for path in superseded]}
    try:
        write_atomically(journal, lambda tmp: tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8"),
                         "journal", fsync=True)
        for target, text in texts.items():
            write_atomically(aside[target], lambda tmp, text=text: tmp.write_text(text, encoding="utf-8"),
                             f"the new text of {target!r}, aside at")
    except BaseException:
        try:
            for path in aside.values():
                path.unlink(missing_ok=True)
            journal.unlink(missing_ok=True)
        except OSError as err:
            warnings.warn(f"could not remove {err.filename!r}, written aside for {str(out)!r} ({err.strerror}); the "
                          "next export to it removes it", RuntimeWarning, stacklevel=2)
        raise
    return journal


def _read(journal: Path) -> dict:
    """The record of ``journal``; a ValueError naming it when it is not one `write_pending` writes."""
    try:
        record = json.loads(Path(journal).read_text(encoding="utf-8"))
        fields = (record["checkpoint"], record["device"], record["inode"], record["files"], record["superseded"])
        valid = (isinstance(fields[0], str) and isinstance(fields[1], int) and isinstance(fields[2], int)
                 and isinstance(fields[3], dict) and isinstance(fields[4], list)
                 and all(isinstance(path, str) for path in fields[4])
                 and all(isinstance(entry, dict) and isinstance(entry.get("pending"), str)
                         and isinstance(entry.get("sha256"), str) for entry in fields[3].values()))
    except (ValueError, KeyError, TypeError) as err:  # JSON, UTF-8, a missing key, not an object
        raise ValueError(f"journal {str(journal)!r} is not one lightprune writes ({type(err).__name__}: {err})") \
            from err
    if not valid:
        raise ValueError(f"journal {str(journal)!r} is not one lightprune writes (a field of the wrong type)")
    return record


def _holds(target: str, sha256: str) -> bool:
    """Whether the file ``target`` holds the text whose SHA-256 is ``sha256`` (False: it is not there)."""
    try:
        return _sha256(Path(target).read_bytes()) == sha256
    except FileNotFoundError:
        return False


def _unfinished(journal: Path, record: dict, failed: list[tuple[str, OSError]]) -> OSError:
    """One error for the files of ``journal`` that could not be put in place (or deleted): the checkpoint is there,
    the journal kept, and what finishes it."""
    code = failed[0][1].errno or errno.EIO
    what = "; ".join(f"{path!r} ({os.strerror(err.errno).lower() if err.errno else err})" for path, err in failed)
    return OSError(code, f"the checkpoint {record['checkpoint']!r} is in place but not all its run files: could not "
                         f"replace {what}; the journal {str(journal)!r} is kept, and the next export to "
                         f"{record['checkpoint']!r} (or its check) finishes them once that is fixed")


def complete(journal: Path, remove=()) -> list[str]:
    """Delete the superseded files ``remove`` (the previous run's that this run does not write), rename every pending
    file of ``journal`` over its target, then delete the journal and flush the folders to the disk; returns the
    targets. A pending file that is missing while its target does not hold its text (it does when an earlier
    `complete` was stopped after renaming it) raises FileNotFoundError naming both, once the others are
    renamed; a file that cannot be renamed or deleted (made immutable meanwhile) raises one OSError naming each, once
    the others are done, saying that the journal is kept. The journal is then kept (every `recover` tries again
    and warns of it until it succeeds or an export replaces the checkpoint)."""
    record = _read(journal)
    missing, failed = [], []
    for path in remove:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as err:
            failed.append((str(path), err))
    for target, entry in record["files"].items():
        if os.path.lexists(entry["pending"]):
            try:
                os.replace(entry["pending"], target)
            except OSError as err:
                failed.append((target, err))
        elif not _holds(target, entry["sha256"]):
            missing.append(f"{target!r} ({entry['pending']!r})")
    if missing:
        raise FileNotFoundError(errno.ENOENT, f"the new text of {', '.join(missing)} is gone and the file does not "
                                f"hold it, so it does not describe the checkpoint {record['checkpoint']!r}; export "
                                f"to it again (the journal {str(journal)!r} is kept until then)")
    if failed:
        raise _unfinished(journal, record, failed)
    journal.unlink()
    for folder in sorted({Path(journal).parent, *(Path(target).parent for target in record["files"])}):
        flush_folder(folder, f"the files of {record['checkpoint']!r}")
    return list(record["files"])


def settle(journal: Path) -> str:
    """Finish what a journal began: forward (`complete`) when its checkpoint is in place, else back (its
    pending files, and their temporary files, deleted, then the journal); returns ``"forward"`` or ``"back"``. An
    error (a file that cannot be deleted or renamed) is raised, the journal kept."""
    record = _read(journal)
    try:
        info = os.stat(record["checkpoint"])
        in_place = (info.st_dev, info.st_ino) == (record["device"], record["inode"])
    except (FileNotFoundError, NotADirectoryError):
        in_place = False
    if in_place:
        written = os.stat(journal).st_mtime_ns
        stale = []
        for path in record["superseded"]:  # not rewritten since: the previous checkpoint's
            with contextlib.suppress(FileNotFoundError):
                if os.lstat(path).st_mtime_ns < written:
                    stale.append(path)
        complete(journal, stale)
        return "forward"
    for entry in record["files"].values():
        Path(entry["pending"]).unlink(missing_ok=True)
        Path(entry["pending"] + ".tmp").unlink(missing_ok=True)
    journal.unlink()
    return "back"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def recover(out: str | os.PathLike) -> list[tuple[Path, str]]:
    """Settle the journals a dead process left beside checkpoint ``out`` (`settle`) and delete their temporary
    files (a kill while the journal was written); a journal that cannot be settled (unreadable, a file that cannot be
    renamed or deleted) is left, with a RuntimeWarning naming it and the error. Returns (journal, "forward" | "back")
    for each one settled."""
    out = Path(out).expanduser().absolute()
    if not out.parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.lightprune-journal-(\d+)\.json(\.tmp)?$")
    probe = re.compile(rf"^\..+{re.escape(_PROBE)}(\d+)[ab]$")  # a kill while proving a file replaceable
    done = []
    for entry in sorted(out.parent.iterdir()):
        match = probe.match(entry.name)
        if match is not None and int(match.group(1)) != os.getpid() and not process_alive(int(match.group(1))):
            with contextlib.suppress(OSError):
                entry.unlink()
            continue
        match = pattern.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid() or process_alive(int(match.group(1))):
            continue
        try:
            if match.group(2):  # killed while writing its journal: nothing else was written yet
                entry.unlink(missing_ok=True)
            else:
                done.append((entry, settle(entry)))
        except (OSError, ValueError) as err:
            warnings.warn(f"could not settle {str(entry)!r}, left by a run killed while publishing {str(out)!r} and "
                          f"its files: {err}; {str(out.parent)!r} may hold that checkpoint beside another run's files "
                          "until this is fixed (each export to it tries again)", RuntimeWarning, stacklevel=2)
    return done
