"""The command's remedy for an export's checkpoint directory taken by a racing run (not the Python API's
"pass overwrite=True"), ExpertStats' kept resume state named by an interrupted calibration, and Lightning's own
SIGTERM line dropped from a quiet run."""

from __future__ import annotations

import logging
import signal
import sys

import pytest

from lightprune.callbacks.expert_stats import ExpertStats
from lightprune.cli import app, quiet
from lightprune.core import interrupt


def _raiser(module_file: str):
    """A function whose frames are in ``module_file`` (the callback's module, as in a traceback)."""
    namespace: dict = {}
    exec(compile("def run():\n    raise FileExistsError(\"output directory '/r/model' exists and is not empty; pass "
                 "overwrite=True to replace it\")\n", module_file, "exec"), namespace)
    return namespace["run"]


@pytest.mark.parametrize(("module", "address"), [("export.py", "export"), ("width_export.py", "width_export")])
def test_a_racing_exports_refusal_names_the_commands_option(monkeypatch, capsys, module, address) -> None:
    from lightprune.callbacks.options import OPTIONS

    assert OPTIONS["WidthExport" if module == "width_export.py" else "Export"].address == address
    monkeypatch.setattr(app, "cli_main", _raiser(f"/x/src/lightprune/callbacks/{module}"))
    monkeypatch.setattr(sys, "argv", ["lightprune", "export"])
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    with pytest.raises(SystemExit):
        app.main()
    assert capsys.readouterr().err == (
        f"lightprune: error: output directory '/r/model' exists and is not empty; replace it with "
        f"--{address}.overwrite true (overwrite: true in the config), or choose another --trainer.default_root_dir\n")


def test_elsewhere_the_refusal_is_as_raised(monkeypatch, capsys) -> None:
    monkeypatch.setattr(app, "cli_main", _raiser("/x/src/lightprune/export/pipeline.py"))
    monkeypatch.setattr(sys, "argv", ["lightprune", "export"])
    monkeypatch.delenv("LIGHTPRUNE_DEBUG", raising=False)
    with pytest.raises(SystemExit):
        app.main()
    assert capsys.readouterr().err.endswith("; pass overwrite=True to replace it\n")


def test_an_interrupted_calibration_names_its_kept_state(tmp_path, monkeypatch) -> None:
    stats = ExpertStats(save_every_n_batches=4)
    state = tmp_path / "calibration_state.rank0.pt"
    state.write_bytes(b"x")
    monkeypatch.setattr(ExpertStats, "_state_path", lambda self, trainer: state)
    stats._observer = object()
    stats._saved_batches = 8
    with interrupt.installed():
        stats.on_exception(None, None, interrupt.Interrupted(signal.SIGTERM))
        line = interrupt.describe(interrupt.Interrupted(signal.SIGTERM), "calibrate")
    assert line == (f"lightprune: interrupted by SIGTERM during `calibrate`; kept: {state} (the calibration state "
                    "after 8 batches: the same command again resumes from it)")
    with interrupt.installed():  # no state saved yet, or another error: nothing recorded
        state.unlink()
        stats.on_exception(None, None, interrupt.Interrupted(signal.SIGTERM))
        state.write_bytes(b"x")
        stats.on_exception(None, None, RuntimeError("boom"))
        assert interrupt.describe(interrupt.Interrupted(signal.SIGTERM)).endswith("nothing was published (outputs "
                                                                                  "are renamed into place only when "
                                                                                  "complete)")


def test_lightnings_sigterm_line_is_dropped_in_a_quiet_run(caplog) -> None:
    logger = logging.getLogger(quiet.SIGTERM_LOG[0])
    before = list(logger.filters)
    try:
        quiet.install()
        with caplog.at_level(logging.INFO, logger=quiet.SIGTERM_LOG[0]):
            logger.info("[rank: 0] Received SIGTERM: 15")
            logger.info("[rank: 0] something else")
        assert [r.getMessage() for r in caplog.records] == ["[rank: 0] something else"]
    finally:
        logger.filters[:] = before
