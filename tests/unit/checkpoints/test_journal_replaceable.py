"""The journal proves every target replaceable before anything is written (an immutable file, a folder that cannot be
written, a directory in a file's place: refused, naming it, nothing published); a completion that still fails after
the checkpoint's rename (a race) is one error saying so, the journal kept for the next run to finish; the previous
run's files named superseded are deleted with the completion (those still older than the journal after a kill)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from fixtures.runs import DEAD_PID
from fixtures.runs import in_place as _in_place
from fixtures.runs import previous_run
from fixtures.runs import staged as _staged

from lightprune.checkpoints import journal as journal_module
from lightprune.checkpoints.journal import check_replaceable, complete, journal_path, recover, write_pending


def _listing(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): p.read_text() if p.is_file() else "<dir>" for p in sorted(run.rglob("*"))}


def _immutable(monkeypatch, *names: str) -> None:
    """``link`` refuses the files ``names`` as it does an immutable file (EPERM); any other file links."""
    real = os.link

    def link(src, dst, *args, **kwargs):
        if Path(src).name in names:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(journal_module.os, "link", link)


@pytest.mark.parametrize("name", ["plan.json", "kept.png", "calibration.json"])
def test_an_immutable_target_is_refused_before_anything_is_written(tmp_path, monkeypatch, name) -> None:
    """A file the journal renames (plan.json) or deletes or the run rewrites after the rename (superseded: kept.png, a
    previous run's calibration.json): refused, naming it; no journal, no pending or probe file."""
    run = tmp_path / "run"
    previous_run(run, ("plan.json", "report.json", "kept.png", "calibration.json"))
    staged = _staged(run)
    before = _listing(run)
    _immutable(monkeypatch, name)
    with pytest.raises(PermissionError) as refused:
        write_pending({str(run / "plan.json"): "new plan", str(run / "scores.json"): "new scores"}, staged,
                      run / "model", superseded=[str(run / "kept.png"), str(run / "calibration.json")])
    assert refused.value.errno == errno.EPERM and refused.value.filename is None
    assert str(refused.value) == (
        f"[Errno 1] cannot replace {str(run / name)!r}: operation not permitted (an immutable or append-only file: "
        f"lsattr shows it); nothing was published, {str(run / 'model')!r} and its run files are as they were")
    assert _listing(run) == before  # nothing aside, no journal, no probe left


def test_a_directory_in_a_files_place_and_an_unwritable_folder_are_refused(tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    previous_run(run, ("plan.json", "report.json", "kept.png", "calibration.json"))
    (run / "scores.json").mkdir()
    with pytest.raises(IsADirectoryError, match=r"cannot replace '.*scores\.json': it is a directory; nothing was "
                                                r"published"):
        check_replaceable([run / "plan.json", run / "scores.json"], run / "model")
    (run / "scores.json").rmdir()
    real = os.open

    def read_only(path, flags, *args):
        if journal_module._PROBE in os.fspath(path) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real(path, flags, *args)

    monkeypatch.setattr(journal_module.os, "open", read_only)
    with pytest.raises(OSError) as refused:
        check_replaceable([run / "scores.json"], run / "model")  # not there: its folder must be writable
    assert refused.value.errno == errno.EROFS
    assert str(refused.value) == (f"[Errno 30] cannot replace {str(run / 'scores.json')!r}: its folder cannot be "
                                  "written (read-only file system); nothing was published, "
                                  f"{str(run / 'model')!r} and its run files are as they were")


def test_a_file_system_without_hard_links_is_not_refused(tmp_path, monkeypatch) -> None:
    """``link`` refused for every file (vfat, some network file systems): nothing tells the target apart, so the
    journal goes on (the rename would tell)."""
    run = tmp_path / "run"
    previous_run(run, ("plan.json", "report.json", "kept.png", "calibration.json"))
    staged = _staged(run)

    def no_links(src, dst, *args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(src))

    monkeypatch.setattr(journal_module.os, "link", no_links)
    monkeypatch.setattr(journal_module, "_flags", lambda path: None)
    journal = write_pending({str(run / "plan.json"): "new plan"}, staged, run / "model")
    assert journal.exists()
    assert not [p for p in run.iterdir() if journal_module._PROBE in p.name]


@pytest.mark.skipif(shutil.which("chattr") is None, reason="no chattr")
def test_a_file_made_immutable_with_chattr_is_refused(tmp_path) -> None:
    run = tmp_path / "run"
    previous_run(run, ("plan.json", "report.json", "kept.png", "calibration.json"))
    staged = _staged(run)
    if subprocess.run(["chattr", "+i", str(run / "plan.json")], capture_output=True, check=False).returncode:
        pytest.skip("chattr +i is not allowed here (root on ext4 / xfs / btrfs only)")
    try:
        before = _listing(run)
        with pytest.raises(PermissionError, match=rf"cannot replace '{run / 'plan.json'}': it is immutable or "
                                                  r"append-only \(lsattr shows i or a; chattr -i or -a, as root, "
                                                  r"clears it\); nothing was published"):
            write_pending({str(run / "plan.json"): "new plan"}, staged, run / "model")
        assert _listing(run) == before
    finally:
        subprocess.run(["chattr", "-i", str(run / "plan.json")], check=False)


def test_a_completion_that_fails_after_the_rename_keeps_the_journal_for_the_next_run(tmp_path, monkeypatch) -> None:
    """plan.json made immutable between the proof and the completion: every other file is put in place (the previous
    run's calibration.json deleted), one error says what is left and that the journal is kept; the next run's
    recovery finishes it once the file can be replaced."""
    run = tmp_path / "run"
    previous_run(run, ("plan.json", "report.json", "kept.png", "calibration.json"))
    staged = _staged(run)
    journal = write_pending({str(run / "plan.json"): "new plan", str(run / "scores.json"): "new scores"}, staged,
                            run / "model", superseded=[str(run / "calibration.json"), str(run / "kept.png")])
    _in_place(run, staged)
    (run / "kept.png").write_text("new kept.png")  # rewritten after the rename
    real = os.replace

    def refused(src, dst):
        if Path(dst).name == "plan.json":
            raise PermissionError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))
        return real(src, dst)

    monkeypatch.setattr(journal_module.os, "replace", refused)
    with pytest.raises(PermissionError) as failed:
        complete(journal, [str(run / "calibration.json")])
    assert str(failed.value) == (
        f"[Errno 1] the checkpoint {str(run / 'model')!r} is in place but not all its run files: could not replace "
        f"{str(run / 'plan.json')!r} (operation not permitted); the journal {str(journal)!r} is kept, and the next "
        f"export to {str(run / 'model')!r} (or its check) finishes them once that is fixed")
    assert "\n" not in str(failed.value)
    files = _listing(run)
    assert files["plan.json"] == "old plan.json" and files["scores.json"] == "new scores"
    assert "calibration.json" not in files and files["kept.png"] == "new kept.png" and journal.exists()
    monkeypatch.undo()
    dead = journal_path(run / "model", DEAD_PID)
    os.rename(journal, dead)  # the process ended: the next run's recovery finishes the journal
    assert recover(run / "model") == [(dead, "forward")]
    assert {name: text for name, text in _listing(run).items() if "/" not in name} == {
        "kept.png": "new kept.png", "model": "<dir>", "plan.json": "new plan", "report.json": "old report.json",
        "scores.json": "new scores"}  # report.json: not named by this journal


def test_a_kill_before_completion_deletes_the_superseded_files_not_rewritten(tmp_path) -> None:
    """The previous run's calibration.json named superseded: a kill once the checkpoint is in place, the next run rolls
    forward and deletes it (older than the journal), keeping what this run rewrote; a probe file a killed run left
    is removed too."""
    run = tmp_path / "run"
    previous_run(run, ("plan.json", "report.json", "kept.png", "calibration.json"))
    staged = _staged(run)
    journal = write_pending({str(run / "plan.json"): "new plan"}, staged, run / "model",
                            superseded=[str(run / "calibration.json"), str(run / "report.json")])
    _in_place(run, staged)
    time.sleep(0.01)
    (run / "report.json").write_text("new report")
    os.rename(journal, journal_path(run / "model", DEAD_PID))
    (run / f".plan.json{journal_module._PROBE}{DEAD_PID}a").write_text("")
    assert [how for _, how in recover(run / "model")] == ["forward"]
    assert {name: text for name, text in _listing(run).items() if "/" not in name} == {
        "kept.png": "old kept.png", "model": "<dir>", "plan.json": "new plan", "report.json": "new report"}
