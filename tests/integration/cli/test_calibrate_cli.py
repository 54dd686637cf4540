"""`lightprune calibrate` with ExpertStats: same statistics as the functional API, and resumable."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

import lightprune as lp
import lightprune.callbacks
from lightprune.cli.app import cli_main
from lightprune.data import SyntheticTokens
from lightprune.testing.tiny import tiny_model

pytestmark = pytest.mark.exhaustive  # the exhaustive tier only: the command in a subprocess, interrupted and resumed


DATA = {"num_samples": 8, "seq_len": 12, "batch_size": 2, "seed": 4}


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["lightprune"])


def _args(run: Path, *callbacks: str) -> list[str]:
    data = [f"--data.init_args.{k}={v}" for k, v in DATA.items()]
    return ["calibrate", "--model", "lightprune.finetune.MoECausalLM", "--model.init_args.tiny", "qwen3_moe",
            "--data", "lightprune.data.SyntheticTokens", *data, "--trainer.accelerator", "cpu",
            "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(run), *callbacks]


def _reference_stats():
    dm = SyntheticTokens(**DATA)
    return lp.collect_expert_stats(tiny_model("qwen3_moe"), list(dm.calibration_dataloader()),
                                   subsets=("all", "text"), progress=False)


def test_calibrate_plan_equals_functional_api(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cli_main(_args(run, "--trainer.callbacks+=lightprune.callbacks.ExpertStats",
                   "--trainer.callbacks.init_args.subsets=[all, text]",
                   "--trainer.callbacks+=lightprune.callbacks.ExpertPruning",
                   "--trainer.callbacks.init_args.criterion=reap", "--trainer.callbacks.init_args.subset=text",
                   "--trainer.callbacks.init_args.ratio=0.25"))
    stats = _reference_stats()
    expected = lp.select_experts(stats.score("reap", "text"), 0.25, "uniform")
    assert lp.ExpertPlan.load(run / "plan.json").keep == expected.keep
    saved = json.loads((run / "calibration.json").read_text())["criteria"]
    for layer, values in stats.raw("delta_h", "all").items():
        torch.testing.assert_close(torch.tensor(saved["delta_h"]["all"]["raw"][str(layer)], dtype=torch.float64),
                                   values, rtol=1e-12, atol=0)


class _Interrupt(pl.Callback):
    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if batch_idx == 1:
            raise KeyboardInterrupt


def test_interrupted_calibration_resumes_where_it_stopped(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stats_cb = ["--trainer.callbacks+=lightprune.callbacks.ExpertStats",
                "--trainer.callbacks.init_args.subsets=[all, text]",
                "--trainer.callbacks.init_args.save_every_n_batches=1"]
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        cli_main(_args(run, *stats_cb, f"--trainer.callbacks+={__name__}._Interrupt"))
    state = torch.load(run / "calibration_state.rank0.pt", weights_only=True)
    assert state["format"] == "lightprune-calibration-state" and state["observer"]["batches_seen"] == 2
    cli = cli_main(_args(run, *stats_cb))
    assert not (run / "calibration_state.rank0.pt").exists()
    resumed = next(cb for cb in cli.trainer.callbacks if isinstance(cb, lp.callbacks.ExpertStats)).stats
    assert resumed.metadata["batches"] == 4
    reference = _reference_stats()
    for name in reference.criteria:
        for subset in ("all", "text"):
            for layer, values in reference.raw(name, subset).items():
                torch.testing.assert_close(resumed.raw(name, subset)[layer], values, rtol=1e-12, atol=1e-15)


def _interrupted(run: Path, stats_cb: list[str]) -> bytes:
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        cli_main(_args(run, *stats_cb, f"--trainer.callbacks+={__name__}._Interrupt"))
    return (run / "calibration_state.rank0.pt").read_bytes()


@pytest.mark.parametrize(("change", "message"), [
    (["--data.init_args.seed=5"], "first 2 calibration batches differ from the ones it accumulated"),
    (["--data.init_args.num_samples=2"], "holds 2 batches, but this run's calibration data has only 1"),
    (["--model.init_args.seed=1"], "was made with another model \\(its router weights differ"),
    (["--trainer.callbacks.init_args.subsets=[all]"], "another setup \\(subsets: saved \\['all', 'text'\\], now \\['all'\\]"),
])
def test_a_resume_with_other_data_model_or_setup_is_refused(tmp_path: Path, change: list[str], message: str) -> None:
    from lightprune.experts.calibration.resume import CalibrationStateError

    run = tmp_path / "run"
    stats_cb = ["--trainer.callbacks+=lightprune.callbacks.ExpertStats",
                "--trainer.callbacks.init_args.subsets=[all, text]",
                "--trainer.callbacks.init_args.save_every_n_batches=1"]
    saved = _interrupted(run, stats_cb)
    with pytest.raises(CalibrationStateError, match=message) as info:
        cli_main([*_args(run, *stats_cb), *change])
    assert "resume: false" in str(info.value) and "weights_only" not in str(info.value)
    assert (run / "calibration_state.rank0.pt").read_bytes() == saved  # nothing changed, nothing written
    assert not (run / "calibration.json").exists()


def test_a_garbage_state_is_refused_and_resume_false_starts_afresh(tmp_path: Path) -> None:
    from lightprune.experts.calibration.resume import CalibrationStateError

    run = tmp_path / "run"
    run.mkdir()
    (run / "calibration_state.rank0.pt").write_bytes(b"not a torch file at all")
    stats_cb = ["--trainer.callbacks+=lightprune.callbacks.ExpertStats",
                "--trainer.callbacks.init_args.subsets=[all, text]",
                "--trainer.callbacks.init_args.save_every_n_batches=1"]
    with pytest.raises(CalibrationStateError, match="cannot be read .*not a lightprune calibration state") as info:
        cli_main(_args(run, *stats_cb))
    assert "weights_only" not in str(info.value)
    torch.save({"batches_seen": 1}, run / "calibration_state.rank0.pt")  # the 0.1 format: no fingerprint
    with pytest.raises(CalibrationStateError, match="no fingerprint of its data and model"):
        cli_main(_args(run, *stats_cb))
    cli = cli_main(_args(run, *stats_cb, "--trainer.callbacks.init_args.resume=false"))
    fresh = next(cb for cb in cli.trainer.callbacks if isinstance(cb, lp.callbacks.ExpertStats)).stats
    reference = _reference_stats()
    assert fresh.metadata["batches"] == 4
    for layer, values in reference.raw("reap", "text").items():
        torch.testing.assert_close(fresh.raw("reap", "text")[layer], values, rtol=1e-12, atol=1e-15)
