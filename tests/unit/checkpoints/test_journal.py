"""The run files published with a checkpoint go through a journal: a process killed between the checkpoint's rename
and the files' is settled by the next run, forward when the checkpoint in place is the one the journal names, back
otherwise, so a folder never keeps one run's checkpoint beside another's plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lightprune.checkpoints.journal import journal_path, recover, settle, write_pending
from lightprune.checkpoints.staging import clean_stale


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _previous_run(run: Path) -> None:
    (run / "model").mkdir(parents=True)
    (run / "model" / "weights").write_text("old")
    for name in ("plan.json", "report.json", "kept.png"):
        (run / name).write_text(f"old {name}")


def _as_killed(journal: Path, run: Path) -> Path:
    """The journal as a dead process leaves it (named by its pid)."""
    dead = journal_path(run / "model", _dead_pid())
    os.rename(journal, dead)
    return dead


def test_killed_once_the_checkpoint_is_in_place_the_next_run_rolls_forward(tmp_path) -> None:
    run = tmp_path / "run"
    _previous_run(run)
    staged = run / ".model.staged"
    staged.mkdir()
    (staged / "weights").write_text("new")
    journal = write_pending({str(run / "plan.json"): "new plan"}, staged, run / "model",
                            superseded=[str(run / "report.json"), str(run / "kept.png")])
    assert (run / "plan.json").read_text() == "old plan.json"  # nothing in place yet
    os.rename(run / "model", run / ".model.old")
    os.rename(staged, run / "model")  # the checkpoint in place ...
    time.sleep(0.01)
    (run / "kept.png").write_text("new kept.png")  # ... the run rewrote one file after it, then was killed
    dead = _as_killed(journal, run)
    assert (run / "plan.json").read_text() == "old plan.json"  # one run's checkpoint beside another's plan
    clean_stale(run / "model")  # the next staging of the checkpoint settles it
    assert (run / "plan.json").read_text() == "new plan"
    assert not (run / "report.json").exists()  # the previous run's report described the previous checkpoint
    assert (run / "kept.png").read_text() == "new kept.png"
    assert not dead.exists() and not (run / f".plan.json.lightprune-pending-{os.getpid()}").exists()


def test_killed_before_the_checkpoint_is_in_place_the_next_run_rolls_back(tmp_path) -> None:
    run = tmp_path / "run"
    _previous_run(run)
    staged = run / ".model.staged"
    staged.mkdir()
    journal = write_pending({str(run / "plan.json"): "new plan", str(run / "scores.json"): "new scores"}, staged,
                            run / "model", superseded=[str(run / "report.json")])
    dead = _as_killed(journal, run)  # killed before the rename: the staged directory is a leftover
    assert [(j.name, how) for j, how in recover(run / "model")] == [(dead.name, "back")]
    assert {p.name: p.read_text() for p in run.iterdir() if p.is_file()} == {
        "plan.json": "old plan.json", "report.json": "old report.json", "kept.png": "old kept.png"}
    assert (run / "model" / "weights").read_text() == "old"


def test_a_live_processs_journal_is_left_alone(tmp_path) -> None:
    run = tmp_path / "run"
    _previous_run(run)
    staged = run / ".model.staged"
    staged.mkdir()
    journal = write_pending({str(run / "plan.json"): "new plan"}, staged, run / "model")
    assert journal == journal_path(run / "model") and recover(run / "model") == []  # this process: alive
    assert json.loads(journal.read_text())["files"] == {str(run / "plan.json"): {
        "pending": str(run / f".plan.json.lightprune-pending-{os.getpid()}"),
        "sha256": "c7af058f2d0d55e3030b6fa0b65ffdeb9cbdb0d19fbfd385f91ea1a9b0f78b26"}}  # sha256sum of "new plan"
    assert settle(journal) == "back" and sorted(p.name for p in run.iterdir()) == [".model.staged", "kept.png",
                                                                                    "model", "plan.json",
                                                                                    "report.json"]
