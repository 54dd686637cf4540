"""An export with ``overwrite`` over a previous run's folder: a run file that cannot be replaced (immutable) is refused
before the checkpoint's rename, the folder as it was; one that fails after it (a race) is one error, the journal kept
for the next run to finish; the previous run's files that this run does not write (its calibration.json) are deleted
with the publishing, those it writes kept."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import signals_at_default

from lightprune.callbacks import ExpertPruning, Export
from lightprune.cli.trainer import PruneTrainer


@pytest.fixture(autouse=True)
def _signals_as_from_a_terminal():
    with signals_at_default():
        yield


def _module():
    from lightprune.finetune import MoECausalLM

    return MoECausalLM(tiny="qwen3_moe", tiny_overrides={"num_hidden_layers": 2})


def _export(run: Path, ratio: float, overwrite: bool = True) -> None:
    PruneTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                 default_root_dir=str(run), callbacks=[Export(overwrite=overwrite, summary=False),
                                                       ExpertPruning("aimer", ratio=ratio)]).export(_module())


def _files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def _kept(run: Path) -> set[int]:
    return {len(ids) for ids in json.loads((run / "plan.json").read_text())["keep"].values()}


@pytest.mark.parametrize("name", ["plan.json", "kept_experts.png", "calibration.json"])
def test_an_immutable_run_file_refuses_the_export_before_its_checkpoint_is_published(tmp_path, monkeypatch,
                                                                                     name) -> None:
    """``chattr +i`` on the previous run's plan.json (renamed over from the journal), kept_experts.png (rewritten
    after the rename) or calibration.json (deleted): the export fails naming it, and the folder is byte for byte the
    previous run's, no journal, pending or probe file beside it."""
    run = tmp_path / "run"
    _export(run, 0.5)
    (run / "calibration.json").write_text("{}")  # a previous calibrate run's statistics
    before = _files(run)
    real = os.link

    def link(src, dst, *args, **kwargs):
        if Path(src) == run / name:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "link", link)
    with pytest.raises(PermissionError, match=rf"cannot replace '{run / name}': operation not permitted .*; nothing "
                                              rf"was published, '{run / 'model'}' and its run files are as they were"):
        _export(run, 0.25)
    assert _files(run) == before


def test_a_run_file_that_fails_after_the_checkpoint_is_in_place_is_finished_by_the_next_run(tmp_path,
                                                                                           monkeypatch) -> None:
    """plan.json refused after the proof (made immutable meanwhile): one error saying the checkpoint is in place, the
    journal kept; the next staging of that checkpoint finishes it once the file can be replaced."""
    from lightprune.checkpoints.journal import journal_path
    from lightprune.checkpoints.staging import clean_stale

    run = tmp_path / "run"
    _export(run, 0.5)
    real = os.replace

    def replace(src, dst):
        if Path(dst) == run / "plan.json":
            raise PermissionError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(PermissionError, match=rf"the checkpoint '{run / 'model'}' is in place but not all its run "
                                              rf"files: could not replace '{run / 'plan.json'}' \(operation not "
                                              r"permitted\); the journal '.*' is kept"):
        _export(run, 0.25)
    monkeypatch.undo()
    assert _kept(run) == {4} and json.loads((run / "model" / "config.json").read_text())["num_local_experts"] == 6
    (journal,) = run.glob(".model.lightprune-journal-*.json")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    os.rename(journal, journal_path(run / "model", child.pid))  # the process ended
    clean_stale(run / "model")
    assert _kept(run) == {6} and sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []


def test_overwrite_deletes_the_previous_runs_files_this_run_does_not_write(tmp_path, monkeypatch) -> None:
    """A finished calibrate run's folder (its calibration.json, report.md, merge_plan.json) overwritten by an export
    that writes none of them: they go with the publishing; a calibration.json this run writes is kept, and without
    overwrite nothing is deleted (the checkpoint refuses the run first)."""
    from lightprune.callbacks import export as export_module

    run = tmp_path / "run"
    _export(run, 0.5)
    for name in ("calibration.json", "report.md", "merge_plan.json"):
        (run / name).write_text(f"old {name}")
    (run / "lightning_logs").mkdir()  # Lightning's: not a file lightprune deletes
    _export(run, 0.25)
    assert sorted(p.name for p in run.iterdir()) == ["kept_experts.png", "lightning_logs", "model", "plan.json",
                                                     "report.json", "scores.json"]
    assert _kept(run) == {6}
    (run / "calibration.json").write_text("old calibration.json")
    real = export_module.export_with_report

    def calibrated(*args, **kwargs):  # this run's statistics, written before its export (ExpertStats)
        (run / "calibration.json").write_text("new calibration.json")
        return real(*args, **kwargs)

    monkeypatch.setattr(export_module, "export_with_report", calibrated)
    _export(run, 0.5)
    assert (run / "calibration.json").read_text() == "new calibration.json" and _kept(run) == {4}
    with pytest.raises(FileExistsError):
        _export(run, 0.25, overwrite=False)
    assert (run / "calibration.json").read_text() == "new calibration.json"
