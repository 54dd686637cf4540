"""A run's files published with its checkpoint, so that no kill leaves one run's checkpoint beside another's plan.

A run writes its checkpoint (a staged directory renamed into place: :mod:`~lightprune.checkpoints.staging`) and,
beside it, the files that describe it (plan.json, scores.json, report.json, config.yaml). No rename puts several
paths in place at once, so the files go through a journal:

1. :func:`write_pending`, before the checkpoint's rename: each file's new text is written beside it
   (``.<name>.lightprune-pending``), then the journal (``.<checkpoint>.lightprune-journal-<pid>.json`` beside the
   checkpoint) naming the staged directory by its device and inode, which its rename keeps, and the files;
2. the checkpoint is renamed into place;
3. :func:`complete`: each pending file is renamed over its target, then the journal is deleted.

Files the run writes only after its checkpoint is in place (report.json with the export's figures, its PNG) are named
in the journal as ``superseded``: a roll forward deletes those the run had not rewritten yet (older than the
journal), which described the previous checkpoint.

A process killed anywhere in between (SIGKILL, a power loss) leaves the journal; :func:`recover` (run by the next
staging of the same checkpoint, :func:`~lightprune.checkpoints.staging.clean_stale`, and by a run over the same
folder) rolls forward when the checkpoint in place is the staged directory the journal names (the pending files
describe it) and back otherwise (they are deleted): either way the folder holds one run's checkpoint and files.
Journals of live processes (a concurrent export) are left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

__all__ = ["complete", "journal_path", "process_alive", "recover", "settle", "write_pending"]

_PENDING = ".lightprune-pending"


def journal_path(out: Path, pid: int | None = None) -> Path:
    """The journal of checkpoint ``out`` written by process ``pid`` (default: this one)."""
    return out.parent / f".{out.name}.lightprune-journal-{os.getpid() if pid is None else pid}.json"


def _pending(target: Path) -> Path:
    return target.with_name(f".{target.name}{_PENDING}")


def _write(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary file renamed into place, flushed to the disk first."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def write_pending(files: dict[str, str], staged: Path, out: Path, superseded: list[str] = ()) -> Path:
    """Write each of ``files`` ({target path: text}) beside its target, then the journal of checkpoint ``out``
    (to be renamed from ``staged``; ``superseded``: the files the run rewrites after it); returns the journal's
    path. On any failure what it wrote is removed."""
    info = os.stat(staged)
    journal = journal_path(out)
    written: list[Path] = []
    try:
        for target, text in files.items():
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            _write(_pending(Path(target)), text)
            written.append(_pending(Path(target)))
        _write(journal, json.dumps({"checkpoint": str(out), "device": info.st_dev, "inode": info.st_ino,
                                    "files": list(files), "superseded": list(superseded)}, indent=1) + "\n")
    except BaseException:
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        raise
    return journal


def complete(journal: Path) -> list[str]:
    """Rename every pending file of ``journal`` over its target, then delete the journal; returns the targets."""
    record = json.loads(journal.read_text(encoding="utf-8"))
    for target in record["files"]:
        if os.path.lexists(_pending(Path(target))):
            os.replace(_pending(Path(target)), target)
    journal.unlink()
    return list(record["files"])


def settle(journal: Path) -> str:
    """Finish what a journal began: forward (:func:`complete`) when its checkpoint is in place, else back (its
    pending files deleted, then the journal); returns ``"forward"`` or ``"back"``."""
    record = json.loads(journal.read_text(encoding="utf-8"))
    try:
        info = os.stat(record["checkpoint"])
        in_place = (info.st_dev, info.st_ino) == (record["device"], record["inode"])
    except OSError:
        in_place = False
    if in_place:
        written = os.stat(journal).st_mtime_ns
        for path in record.get("superseded", []):  # not rewritten since: the previous checkpoint's
            with contextlib.suppress(OSError):
                if os.stat(path).st_mtime_ns < written:
                    os.unlink(path)
        complete(journal)
        return "forward"
    for target in record["files"]:
        with contextlib.suppress(OSError):
            _pending(Path(target)).unlink(missing_ok=True)
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
    """Settle the journals a dead process left beside checkpoint ``out`` (:func:`settle`); a journal that cannot be
    read is left, with the pending files it names. Returns (journal, "forward" | "back") for each one settled."""
    out = Path(out).expanduser().absolute()
    if not out.parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.lightprune-journal-(\d+)\.json$")
    done = []
    for entry in sorted(out.parent.iterdir()):
        match = pattern.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid() or process_alive(int(match.group(1))):
            continue
        try:
            done.append((entry, settle(entry)))
        except (OSError, ValueError, KeyError):
            continue
    return done
