"""lp.run_recipe: a whole recipe in one call from Python, the same job as the command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from fixtures import REPO

import lightprune as lp
from lightprune.cli.options import OptionError
from lightprune.cli.recipe import recipe_command

pytestmark = pytest.mark.exhaustive  # the exhaustive tier only: whole jobs run from a recipe


@pytest.mark.parametrize("config,command", [("quickstart", "calibrate"), ("mwop", "fit"), ("router_lora", "fit"),
                                            ("reap_testbed", "calibrate"), ("maep", "calibrate"),
                                            ("hc_smoe", "calibrate"), ("aimer", "export"),
                                            ("custom_criterion", "export")])
def test_the_command_follows_from_the_callbacks(config, command) -> None:
    assert recipe_command(REPO / "configs" / f"{config}.yaml") == command


def test_two_implied_commands_ask_for_one() -> None:
    recipe = {"trainer": {"callbacks": [{"class_path": "lightprune.callbacks.ExpertStats"},
                                        {"class_path": "lightprune.callbacks.RouterDelta"}]}}
    with pytest.raises(ValueError, match=r"imply the commands \['calibrate', 'fit'\]; give command="):
        recipe_command(recipe)


def test_a_recipe_file_and_its_mapping_run_the_same_job(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher.py", "-f", "kernel.json"])  # a notebook's own arguments
    run = lp.run_recipe("configs/aimer_tiny.yaml", overrides={"trainer.default_root_dir": str(tmp_path / "file"),
                                                              "prune.ratio": 0.25, "prune.allocation": "global"})
    assert run == tmp_path / "file" and sys.argv == ["ipykernel_launcher.py", "-f", "kernel.json"]
    plan = lp.ExpertPlan.load(run / "plan.json")
    assert (plan.ratio, plan.allocation, plan.total_pruned) == (0.25, "global", 16)
    recipe = yaml.safe_load((REPO / "configs" / "aimer_tiny.yaml").read_text())
    recipe["trainer"]["default_root_dir"] = str(tmp_path / "mapping")
    recipe["trainer"]["callbacks"][-1]["init_args"].update(ratio=0.25, allocation="global")
    again = lp.run_recipe(recipe, "export")
    assert again == tmp_path / "mapping" and lp.ExpertPlan.load(again / "plan.json").keep == plan.keep
    assert (again / "model" / "model.safetensors").read_bytes() == (run / "model" / "model.safetensors").read_bytes()


def test_bad_options_fail_before_anything_is_built(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    with pytest.raises(OptionError, match="--prune.criterion: unknown criterion 'reapp'"):
        lp.run_recipe("configs/aimer_tiny.yaml", overrides={"trainer.default_root_dir": str(tmp_path / "a"),
                                                            "prune.criterion": "reapp"})
    recipe = {"trainer": {"callbacks": [{"class_path": "lightprune.callbacks.ExpertPruning",
                                         "init_args": {"ratio": 1.5}}]}}
    with pytest.raises(OptionError, match=r"ExpertPruning: ratio must be in \[0, 1\), got 1.5"):
        lp.run_recipe(recipe)
    with pytest.raises(FileNotFoundError, match="recipe 'configs/nope.yaml' does not exist"):
        lp.run_recipe("configs/nope.yaml")
    with pytest.raises(ValueError, match="command must be one of"):
        lp.run_recipe("configs/aimer_tiny.yaml", "prune")
    with pytest.raises(ValueError, match="option names without dashes"):
        lp.run_recipe("configs/aimer_tiny.yaml", overrides={"--prune.ratio": 0.3})
    assert not (tmp_path / "a").exists()
