"""``lightprune export --export.plan_path`` with a config that also lists ExpertPruning (configs/aimer_tiny.yaml): the
checkpoint, the run's plan.json, report.json and the manifest all describe the file's plan; nothing is scored."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from fixtures import REPO

import lightprune as lp


def test_plan_path_is_the_plan_every_run_file_describes(tmp_path: Path, monkeypatch, caplog) -> None:
    from lightprune.cli import command

    monkeypatch.chdir(REPO)
    custom = tmp_path / "custom.json"  # the config's model: 4 MoE layers of 16 experts; keep experts 0..7
    lp.ExpertPlan(keep={i: list(range(8)) for i in range(4)}, num_experts={i: 16 for i in range(4)},
                  criterion="mine").save(custom)
    run = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["lightprune", "export", "--config", "configs/aimer_tiny.yaml",
                                      "--trainer.default_root_dir", str(run), "--export.plan_path", str(custom)])
    with caplog.at_level(logging.INFO):
        command.main()
    said = "\n".join(caplog.messages)
    assert "ExpertPruning: aimer selects nothing: Export applies the plan in" in said and "aimer selects 32" not in said
    plan = lp.ExpertPlan.load(run / "plan.json")
    assert plan.criterion == "mine" and plan.keep == {i: list(range(8)) for i in range(4)}
    assert not (run / "scores.json").exists()
    manifest = json.loads((run / "model" / "lightprune_export.json").read_text())
    assert manifest["plan"]["criterion"] == "mine"
    assert manifest["plan"]["keep"] == json.loads(custom.read_text())["keep"]
    report = json.loads((run / "report.json").read_text())
    assert report["criterion"] == "mine" and report["kept_per_layer"] == {str(i): 8 for i in range(4)}
    assert lp.load_pruned(run / "model").config.num_experts == 8
