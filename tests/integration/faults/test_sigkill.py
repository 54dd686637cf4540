"""Killed with SIGKILL, an export leaves the target as it was and the next export cleans up after it; a killed
calibration resumes from its last saved state with the same statistics as an uninterrupted one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import lightprune as lp
from lightprune.testing.tiny import tiny_model

# exhaustive tier: processes killed mid-write
pytestmark = [pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL"), pytest.mark.exhaustive]

_EXPORT = textwrap.dedent("""
    import os, signal, sys
    import lightprune as lp
    from lightprune.checkpoints import staging
    from lightprune.export import save
    from lightprune.testing.tiny import tiny_model

    out, where, ratio = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if where == "staged":        # dies with the new checkpoint written but not yet verified
        save.verify_reloaded = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    elif where == "between":     # dies after the old checkpoint was set aside, before the new one is renamed in
        rename, calls = os.rename, []
        def dying(a, b):
            calls.append(a)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return rename(a, b)
        staging.os.rename = dying
    model = tiny_model("qwen3_moe", num_hidden_layers=2)
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio)
    lp.export_pruned(model, plan, out, overwrite=True)
""")


def _export(out: Path, where: str, ratio: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _EXPORT, str(out), where, str(ratio)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _export_here(out: Path, ratio: float) -> None:
    """The export _EXPORT runs, without a kill, in this process (a subprocess is needed only to be killed)."""
    model = tiny_model("qwen3_moe", num_hidden_layers=2)
    lp.export_pruned(model, lp.select_experts(lp.score_weights(model, "aimer"), ratio), out, overwrite=True)


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_killed_export_leaves_the_target_and_the_next_export_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "model"
    _export_here(out, 0.5)
    before = _listing(out)
    killed = _export(out, "staged", 0.25)
    assert killed.returncode == -signal.SIGKILL
    assert _listing(out) == before  # the previous checkpoint, byte for byte
    stale = [p.name for p in tmp_path.iterdir() if p.name.startswith(".model.lightprune-tmp-")]
    assert len(stale) == 1 and any((tmp_path / stale[0]).iterdir())  # a whole staged model, left behind
    _export_here(out, 0.25)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # the next export removed the leftover
    assert lp.find_moe_layers(lp.load_pruned(out))[0].num_experts == 6  # 25% of 8 pruned


def test_killed_between_the_two_renames_the_previous_checkpoint_comes_back(tmp_path: Path) -> None:
    out = tmp_path / "model"
    _export_here(out, 0.5)
    before = _listing(out)
    killed = _export(out, "between", 0.25)
    assert killed.returncode == -signal.SIGKILL
    assert not out.exists()  # set aside, the new one not renamed in
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(".model.lightprune-old-")]
    assert len(aside) == 1 and _listing(aside[0]) == before
    from lightprune.checkpoints.staging import clean_stale

    assert clean_stale(out) and _listing(out) == before  # what the next export does first


_CALIBRATE = textwrap.dedent("""
    import os, signal, sys
    import lightning.pytorch as pl
    from lightprune.cli.app import cli_main

    class Die(pl.Callback):
        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            if batch_idx == int(sys.argv[2]):
                os.kill(os.getpid(), signal.SIGKILL)

    run = sys.argv[1]
    extra = [f"--trainer.callbacks+={__name__}.Die"] if int(sys.argv[2]) >= 0 else []
    cli_main(["calibrate", "--model", "lightprune.finetune.MoECausalLM", "--model.init_args.tiny", "qwen3_moe",
              "--data", "lightprune.data.SyntheticTokens", "--data.init_args.num_samples=8",
              "--data.init_args.seq_len=12", "--data.init_args.batch_size=2", "--data.init_args.seed=4",
              "--trainer.accelerator", "cpu", "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
              "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", run,
              "--trainer.callbacks+=lightprune.callbacks.ExpertStats", "--trainer.callbacks.init_args.subsets=[all, text]",
              "--trainer.callbacks.init_args.save_every_n_batches=1", *extra])
""")


def test_a_killed_calibration_resumes_to_the_uninterrupted_statistics(tmp_path: Path) -> None:
    run = tmp_path / "run"
    script = tmp_path / "calibrate.py"
    script.write_text(_CALIBRATE)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tmp_path)}
    killed = subprocess.run([sys.executable, str(script), str(run), "2"], capture_output=True, text=True, env=env,
                            cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    state = torch.load(run / "calibration_state.rank0.pt", weights_only=True)
    assert state["observer"]["batches_seen"] == 3 and not (run / "calibration.json").exists()
    resumed = subprocess.run([sys.executable, str(script), str(run), "-1"], capture_output=True, text=True, env=env,
                             cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming calibration" in resumed.stderr + resumed.stdout
    assert not (run / "calibration_state.rank0.pt").exists()
    import json

    got = json.loads((run / "calibration.json").read_text())["criteria"]
    from lightprune.data import SyntheticTokens

    dm = SyntheticTokens(num_samples=8, seq_len=12, batch_size=2, seed=4)
    reference = lp.collect_expert_stats(tiny_model("qwen3_moe"), list(dm.calibration_dataloader()),
                                        subsets=("all", "text"), progress=False)
    for name in ("reap", "frequency", "delta_h"):
        for layer, values in reference.raw(name, "text").items():
            torch.testing.assert_close(torch.tensor(got[name]["text"]["raw"][str(layer)], dtype=torch.float64),
                                       values, rtol=1e-12, atol=1e-15)
