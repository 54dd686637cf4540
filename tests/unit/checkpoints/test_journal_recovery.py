"""The journal's recovery, second round: paths recorded absolute (a recovery from another working directory), the
up-front check of an output directory settles a dead run's journal, a journal that cannot be settled is reported,
a pending file that is gone is an error, a kill at every step of :func:`write_pending` leaves nothing a recovery does
not remove, and the journal (not the files) is flushed to the disk."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.runs import DEAD_PID
from fixtures.runs import in_place as _in_place
from fixtures.runs import previous_run as _previous_run
from fixtures.runs import staged as _staged

from lightprune.checkpoints import journal as journal_module
from lightprune.checkpoints.journal import complete, journal_path, recover, settle, write_pending
from lightprune.checkpoints.staging import check_out_dir
from lightprune.core import paths


def _as_killed(journal: Path, run: Path) -> Path:
    """The journal as a dead process leaves it (named by its pid)."""
    dead = journal_path(run / "model", DEAD_PID)
    os.rename(journal, dead)
    return dead


def _files(run: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(run.iterdir()) if p.is_file()}


def test_a_journal_written_with_relative_paths_is_recovered_from_another_working_directory(tmp_path,
                                                                                              monkeypatch) -> None:
    """A run folder given relative (``default_root_dir: outputs/x``); the recovery runs elsewhere: it renames the
    pending files of that folder, not of one under its own working directory."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    run = tmp_path / "work" / "outputs" / "x"
    _previous_run(run)
    staged = _staged(run)
    journal = write_pending({"outputs/x/plan.json": "new plan"}, Path("outputs/x/.model.staged"),
                            Path("outputs/x/model"), superseded=["outputs/x/report.json"])
    record = json.loads(journal.read_text())
    assert record["checkpoint"] == str(run / "model") and list(record["files"]) == [str(run / "plan.json")]
    assert record["superseded"] == [str(run / "report.json")] and journal.is_absolute()
    _in_place(run, staged)
    dead = _as_killed(journal, run)
    monkeypatch.chdir(tmp_path)  # another working directory
    assert recover(run / "model") == [(dead, "forward")]
    assert _files(run) == {"plan.json": "new plan"}  # the previous report described the previous checkpoint
    assert sorted(p.name for p in run.iterdir()) == ["model", "plan.json"]


def test_the_up_front_check_settles_a_dead_runs_journal_before_it_refuses_the_folder(tmp_path) -> None:
    """A rerun without overwrite is refused (the checkpoint directory is not empty), and the run killed between its
    checkpoint and its files is settled first: the folder keeps the checkpoint with the files that describe it."""
    run = tmp_path / "run"
    _previous_run(run)
    staged = _staged(run)
    journal = write_pending({str(run / "plan.json"): "new plan"}, staged, run / "model")
    _in_place(run, staged)
    _as_killed(journal, run)
    with pytest.raises(FileExistsError, match="exists and is not empty"):
        check_out_dir(run / "model")
    assert _files(run) == {"plan.json": "new plan", "report.json": "old report.json"}
    assert sorted(p.name for p in run.iterdir()) == ["model", "plan.json", "report.json"]


def test_a_journal_that_cannot_be_settled_is_reported_and_kept_for_the_next_try(tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    _previous_run(run)
    staged = _staged(run)
    journal = write_pending({str(run / "plan.json"): "new plan"}, staged, run / "model")
    _in_place(run, staged)
    dead = _as_killed(journal, run)
    pending = run / f".plan.json.lightprune-pending-{os.getpid()}"

    def refused(src, dst):
        raise PermissionError(13, "Permission denied", str(src))

    monkeypatch.setattr(journal_module.os, "replace", refused)
    with pytest.warns(RuntimeWarning) as caught:
        assert recover(run / "model") == []
    (warning,) = caught
    assert str(warning.message) == (
        f"could not settle {str(dead)!r}, left by a run killed while publishing {str(run / 'model')!r} and its "
        f"files: [Errno 13] the checkpoint {str(run / 'model')!r} is in place but not all its run files: could not "
        f"replace {str(run / 'plan.json')!r} (permission denied); the journal {str(dead)!r} is kept, and the next "
        f"export to {str(run / 'model')!r} (or its check) finishes them once that is fixed; {str(run)!r} may hold "
        "that checkpoint beside another run's files until this is fixed (each export to it tries again)")
    assert dead.exists() and pending.read_text() == "new plan" and _files(run)["plan.json"] == "old plan.json"
    monkeypatch.undo()
    assert recover(run / "model") == [(dead, "forward")] and _files(run)["plan.json"] == "new plan"
    garbage = journal_path(run / "model", DEAD_PID)
    garbage.write_text("{not json")
    with pytest.warns(RuntimeWarning, match=rf"could not settle '{garbage}'.*: journal '{garbage}' is not one "
                                            r"lightprune writes \(JSONDecodeError"):
        recover(run / "model")
    assert garbage.exists()


def test_a_pending_file_that_is_gone_is_an_error_and_the_journal_is_kept(tmp_path) -> None:
    run = tmp_path / "run"
    _previous_run(run)
    staged = _staged(run)
    journal = write_pending({str(run / "plan.json"): "new plan", str(run / "scores.json"): "new scores"}, staged,
                            run / "model")
    (run / f".plan.json.lightprune-pending-{os.getpid()}").unlink()
    with pytest.raises(FileNotFoundError) as gone:
        complete(journal)
    assert str(gone.value) == (
        f"[Errno 2] the new text of {str(run / 'plan.json')!r} "
        f"({str(run / f'.plan.json.lightprune-pending-{os.getpid()}')!r}) is gone and the file does not hold it, so "
        f"it does not describe the checkpoint {str(run / 'model')!r}; export to it again (the journal "
        f"{str(journal)!r} is kept until then)")
    assert journal.exists() and _files(run)["scores.json"] == "new scores"  # the others renamed all the same
    assert _files(run)["plan.json"] == "old plan.json"


def test_a_completion_stopped_halfway_is_finished_by_the_next(tmp_path) -> None:
    """Killed during :func:`complete`, after one rename: the next completion finds that file holding its new text
    (its SHA-256 in the journal) and renames the rest."""
    run = tmp_path / "run"
    _previous_run(run)
    staged = _staged(run)
    journal = write_pending({str(run / "plan.json"): "new plan", str(run / "scores.json"): "new scores"}, staged,
                            run / "model")
    assert json.loads(journal.read_text())["files"][str(run / "plan.json")]["sha256"] == \
        hashlib.sha256(b"new plan").hexdigest()
    os.replace(run / f".plan.json.lightprune-pending-{os.getpid()}", run / "plan.json")  # the first rename
    assert complete(journal) == [str(run / "plan.json"), str(run / "scores.json")]
    assert _files(run) == {"plan.json": "new plan", "report.json": "old report.json", "scores.json": "new scores"}
    assert not journal.exists()


#: a child that writes a journal for ``run`` and is killed (SIGKILL: no ``finally`` runs) at its ``kill_at``-th
#: rename (the temporary file of that write there), or after write_pending returned (``kill_at`` 0)
_KILLED_CHILD = """
import os, signal, sys
from pathlib import Path
from lightprune.checkpoints import journal
run, kill_at = Path(sys.argv[1]), int(sys.argv[2])
real, calls = os.replace, []
def killed(src, dst):
    calls.append(dst)
    if len(calls) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst)
os.replace = killed
journal.write_pending({str(run / "plan.json"): "new plan", str(run / "scores.json"): "new scores"},
                      run / ".model.staged", run / "model", superseded=[str(run / "report.json")])
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("kill_at", [1, 2, 3, 0])
def test_a_kill_at_any_step_of_write_pending_leaves_nothing_the_recovery_does_not_remove(tmp_path, kill_at) -> None:
    """Killed while writing the journal (its temporary file left), while writing either pending file (the journal
    lists it, its temporary file left) or once all are aside: the recovery leaves the previous run's folder as it
    was, the staged directory (the staging's cleanup deletes it) aside."""
    run = tmp_path / "run"
    _previous_run(run)
    _staged(run)
    before = _files(run)
    child = subprocess.run([sys.executable, "-c", _KILLED_CHILD, str(run), str(kill_at)], capture_output=True,
                           text=True, timeout=120, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    left = sorted(p.name for p in run.iterdir() if p.name.startswith(".") and p.name != ".model.staged")
    assert left  # the kill left something
    settled = recover(run / "model")
    assert [how for _, how in settled] == ([] if kill_at == 1 else ["back"])
    assert _files(run) == before and sorted(p.name for p in run.iterdir()) == [".model.staged", "model",
                                                                                 "plan.json", "report.json"]


def test_the_journal_and_the_folders_are_flushed_to_the_disk_not_the_pending_files(tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    _previous_run(run)
    staged = _staged(run)
    flushed = []
    fsync = os.fsync

    def recorded(fd):
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(paths.os, "fsync", recorded)
    journal = write_pending({str(run / "plan.json"): "new plan"}, staged, run / "model")
    assert flushed == [f"{journal}.tmp", str(run)]  # the journal before its rename, its folder after
    flushed.clear()
    _in_place(run, staged)
    time.sleep(0.01)
    complete(journal)
    assert flushed == [str(run)] and not journal.exists()


def test_write_atomically_flushes_the_file_before_its_rename_and_the_folder_after_only_when_asked(
        tmp_path, monkeypatch) -> None:
    events = []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(paths.os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
                        or fsync(fd))
    monkeypatch.setattr(paths.os, "replace", lambda src, dst: events.append(("replace", str(dst))) or replace(src,
                                                                                                               dst))
    target = tmp_path / "sub" / "state.json"
    paths.write_atomically(target, lambda tmp: tmp.write_text("1"), "state")
    assert events == [("replace", str(target))]
    events.clear()
    paths.write_atomically(target, lambda tmp: tmp.write_text("2"), "state", fsync=True)
    assert events == [("fsync", f"{target}.tmp"), ("replace", str(target)), ("fsync", str(target.parent))]
    assert target.read_text() == "2"


def test_a_folder_that_cannot_be_flushed_is_a_warning_the_file_in_place(tmp_path, monkeypatch) -> None:
    flush = paths._flush

    def no_folders(path, flags):
        if os.path.isdir(path):
            raise OSError(22, "Invalid argument")
        flush(path, flags)

    monkeypatch.setattr(paths, "_flush", no_folders)
    target = tmp_path / "state.json"
    with pytest.warns(RuntimeWarning) as caught:
        paths.write_atomically(target, lambda tmp: tmp.write_text("1"), "state", fsync=True)
    assert [str(w.message) for w in caught] == [
        (f"could not flush the folder {str(tmp_path)!r} to the disk (invalid argument): state {str(target)!r} is in "
         "place, but a power loss may undo that")]
    assert target.read_text() == "1"


def test_settling_back_deletes_the_pending_files_and_their_temporary_files(tmp_path) -> None:
    run = tmp_path / "run"
    _previous_run(run)
    staged = _staged(run)
    journal = write_pending({str(run / "plan.json"): "new plan"}, staged, run / "model")
    pending = run / f".plan.json.lightprune-pending-{os.getpid()}"
    Path(f"{pending}.tmp").write_text("half")
    assert settle(journal) == "back"
    assert sorted(p.name for p in run.iterdir()) == [".model.staged", "model", "plan.json", "report.json"]
