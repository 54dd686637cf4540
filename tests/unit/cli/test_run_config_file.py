"""The command's config.yaml is published with the run's other files (a run that fails or is interrupted leaves the
previous run's as it was), and a lightprune callback is given by its class name wherever a class path is taken."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import pytest
from fixtures import REPO

from lightprune.cli import app

CONFIG = REPO / "configs" / "aimer_tiny.yaml"


@pytest.fixture(autouse=True)
def _plain(monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["lightprune"])
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)


def _run(monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["lightprune", *argv])
    app.main()


def test_a_failed_run_leaves_the_previous_config_yaml_and_a_short_callback_name_works(tmp_path: Path, monkeypatch,
                                                                                       capsys) -> None:
    """``--trainer.callbacks+=ReportPage`` (what ``lightprune --help`` documents) adds the callback; an overwrite run
    that fails late (a full disk) kept model/, plan.json and the rest but replaced config.yaml with its own: now every
    file stays as the previous run left it, and a run that succeeds publishes its config.yaml with its outputs."""
    run = tmp_path / "run"
    job = ["export", "--config", str(CONFIG), "--trainer.default_root_dir", str(run)]
    _run(monkeypatch, *job, "--trainer.callbacks+=ReportPage")
    assert (run / "report.md").is_file()
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert "class_path: lightprune.callbacks.ReportPage" in before["config.yaml"].decode()
    assert "ratio: 0.5" in before["config.yaml"].decode()

    from lightprune.callbacks import export as export_module

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(run / "model"))

    with monkeypatch.context() as patched:
        patched.setattr(export_module, "export_pruned", full)
        with pytest.raises(SystemExit) as info:
            _run(patched, *job, "--export.overwrite", "true", "--prune.ratio", "0.25")
    assert info.value.code == 2 and "No space left on device" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert not list(run.glob("*.tmp"))
    _run(monkeypatch, *job, "--export.overwrite", "true", "--prune.ratio", "0.25")
    assert "ratio: 0.25" in (run / "config.yaml").read_text()


def test_a_config_names_lightprunes_callbacks_by_class_name(tmp_path: Path, monkeypatch, capsys) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(CONFIG.read_text().replace("lightprune.callbacks.Export", "Export")
                      .replace("lightprune.callbacks.ExpertPruning", "ExpertPruning"))
    assert "class_path: Export\n" in config.read_text()
    with pytest.raises(SystemExit) as info:
        app.cli_main(["export", "--config", str(config), "--trainer.default_root_dir", str(tmp_path / "run"),
                      "--prune.ratio", "0.25", "--print_config"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "class_path: lightprune.callbacks.Export\n" in out
    assert "class_path: lightprune.callbacks.ExpertPruning\n" in out
    with pytest.raises(app.OptionError, match=r"^trainer.callbacks: 'ReportPag' is no callback's class name \(did you "
                                              r"mean 'ReportPage'\?\)"):
        app.cli_main(["export", "--config", str(config), "--trainer.default_root_dir", str(tmp_path / "run"),
                      "--trainer.callbacks+=ReportPag"], exit_on_error=False)
