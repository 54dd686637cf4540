"""Which lightprune callbacks one run may list together (callbacks/roster.py), checked at setup before any work;
where the export's checkpoint directory may go (callbacks/export_dirs.py); Export's plan_path as the run's plan."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import lightprune as lp
from lightprune.callbacks import Evaluate, ExpertPruning, ExpertStats, Export, WidthExport
from lightprune.callbacks.roster import check_roster
from lightprune.cli.trainer import PruneTrainer


def _module():
    from lightprune.finetune import MoECausalLM

    return MoECausalLM(tiny="qwen3_moe", tiny_overrides={"num_hidden_layers": 2})  # 2 MoE layers of 8 experts


def _trainer(run: Path, callbacks: list) -> PruneTrainer:
    return PruneTrainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(run), callbacks=callbacks)


# ----------------------------------------------------------------------------------- from the options alone
@pytest.mark.parametrize("name", ["ExpertStats", "RouterDelta", "Export", "WidthExport", "WidthSearch"])
def test_a_callback_that_acts_once_is_refused_twice(tmp_path, name) -> None:
    with pytest.raises(ValueError, match=rf"^{name} is listed 2 times in trainer.callbacks: .*; keep one$"):
        check_roster([(name, {}), ("ReportPage", {}), (name, {"output_dir": str(tmp_path / "x")})], str(tmp_path))


@pytest.mark.parametrize("name, files", [("ExpertPruning", "plan.json and scores.json"),
                                         ("Evaluate", "evaluation in report.json")])
def test_two_writing_one_folder_are_refused_and_two_folders_are_not(tmp_path, name, files) -> None:
    same = [(name, {}), (name, {"output_dir": str(tmp_path)})]  # the default folder is the root: one folder
    with pytest.raises(ValueError, match=f"^{name} is listed twice writing into '{tmp_path}': the second's {files} "
                                         "would replace the first's"):
        check_roster(same, str(tmp_path))
    check_roster([(name, {}), (name, {"output_dir": str(tmp_path / "other")})], str(tmp_path))


def test_several_plans_and_an_export_need_one_in_its_folder(tmp_path) -> None:
    plans = [("ExpertPruning", {}), ("ExpertPruning", {"output_dir": str(tmp_path / "reap")})]
    assert check_roster([*plans, ("Export", {})], str(tmp_path)).plan_folder == tmp_path.resolve()
    assert check_roster([*plans, ("Evaluate", {"output_dir": str(tmp_path / "reap")})],
                        str(tmp_path)).plan_folder == (tmp_path / "reap").resolve()
    with pytest.raises(ValueError, match=r"^Export takes the plan of the ExpertPruning writing into its folder "
                                         rf"'{tmp_path / 'elsewhere'}', and none of the 2 ExpertPruning callbacks"):
        check_roster([*plans, ("Export", {"output_dir": str(tmp_path / "elsewhere")})], str(tmp_path))
    assert check_roster(plans, str(tmp_path)).plan_folder is None  # nothing applies them: each writes its own
    with pytest.raises(ValueError, match=r"^WidthExport's plan_path and a WidthSearch conflict: the search's fit"):
        check_roster([("WidthSearch", {}), ("WidthExport", {"plan_path": "width_plan.json"})], str(tmp_path))
    check_roster([("WidthSearch", {}), ("WidthExport", {})], str(tmp_path))
    given = check_roster([*plans, ("Export", {"plan_path": "~/p.json", "output_dir": str(tmp_path / "x")})], None)
    assert given.plan_file == Path("~/p.json").expanduser() and given.plan_folder is None


@pytest.mark.parametrize("where, says", [
    (lambda run: run, "is the run's folder"),
    (lambda run: run.parent, "holds the run's folder"),
    (lambda run: run / "plan.json", "is the run's plan.json"),
    (lambda run: run / "config.yaml" / "model", "is the run's config.yaml"),
])
def test_a_checkpoint_dir_that_is_or_holds_the_run_folder_is_refused_whatever_overwrite_says(tmp_path, where,
                                                                                              says) -> None:
    run = tmp_path / "runs" / "run"
    for cls, address in ((Export, "export"), (WidthExport, "width_export")):
        with pytest.raises(ValueError, match=rf"^{address}.checkpoint_dir '.*' {says}.*choose another "
                                             rf"--{address}.checkpoint_dir"):
            cls.preflight({"checkpoint_dir": str(where(run)), "overwrite": True}, str(run))
        with pytest.raises(ValueError, match=says):
            check_roster([(cls.__name__, {"checkpoint_dir": str(where(run))})], str(run))
    with pytest.raises(ValueError, match="holds the run's folder"):  # another callback's folder counts too
        check_roster([("Export", {"checkpoint_dir": str(tmp_path / "stats")}),
                      ("ExpertStats", {"output_dir": str(tmp_path / "stats" / "calibration")})], str(run))
    Export.preflight({"checkpoint_dir": str(tmp_path / "elsewhere"), "overwrite": True}, str(run))
    Export.preflight({"checkpoint_dir": str(run / "model")}, str(run))


# ----------------------------------------------------------------------------------- in a run
def test_two_expert_prunings_in_one_folder_are_refused_before_any_work(tmp_path) -> None:
    run = tmp_path / "run"
    scored = []
    pruning = ExpertPruning("aimer", ratio=0.25)
    pruning.run = lambda *a: scored.append(1)
    with pytest.raises(ValueError, match="^ExpertPruning is listed twice writing into"):
        _trainer(run, [Export(summary=False), pruning, ExpertPruning("aimer", ratio=0.5)]).export(_module())
    assert not scored and not any(run.rglob("*"))


def test_two_exports_are_refused_before_any_work(tmp_path) -> None:
    run = tmp_path / "run"
    with pytest.raises(ValueError, match="^Export is listed 2 times in trainer.callbacks"):
        _trainer(run, [Export(summary=False), ExpertPruning("aimer", ratio=0.5),
                       Export(checkpoint_dir=str(tmp_path / "other"))]).export(_module())
    assert not any(run.rglob("*")) and not (tmp_path / "other").exists()


def test_several_expert_prunings_export_the_plan_in_the_export_folder(tmp_path, caplog) -> None:
    run = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        _trainer(run, [ExpertPruning("magnitude", ratio=0.5, output_dir=str(run / "magnitude")), Export(summary=False),
                       ExpertPruning("aimer", ratio=0.25)]).export(_module())
    kept = lp.ExpertPlan.load(run / "plan.json")  # the AIMER plan, in Export's folder: 6 of 8 kept per layer
    assert kept.criterion == "aimer" and kept.kept_counts() == {0: 6, 1: 6}
    assert lp.ExpertPlan.load(run / "magnitude" / "plan.json").kept_counts() == {0: 4, 1: 4}
    manifest = json.loads((run / "model" / "lightprune_export.json").read_text())
    assert manifest["plan"]["keep"] == {str(k): v for k, v in kept.keep.items()}
    assert json.loads((run / "report.json").read_text())["kept_per_layer"] == {"0": 6, "1": 6}
    # the line says where the plan goes and when: it is not written by a run that fails before
    assert f"ExpertPruning: aimer selects 4 experts to prune (uniform, ratio 0.25); plan.json is written to {run} " \
           "once the export has succeeded" in caplog.messages


def test_export_plan_path_is_the_run_plan_and_expert_pruning_selects_nothing(tmp_path, caplog) -> None:
    run = tmp_path / "run"
    custom = tmp_path / "custom.json"
    lp.ExpertPlan(keep={0: [0, 1, 2], 1: [5, 6, 7]}, num_experts={0: 8, 1: 8}, criterion="mine").save(custom)
    pruning = ExpertPruning("aimer", ratio=0.5)
    with caplog.at_level(logging.INFO):
        _trainer(run, [Export(summary=False, plan_path=str(custom)), pruning]).export(_module())
    assert pruning.plan is None and not (run / "scores.json").exists()
    plan = lp.ExpertPlan.load(run / "plan.json")
    assert plan.criterion == "mine" and plan.keep == {0: [0, 1, 2], 1: [5, 6, 7]}
    manifest = json.loads((run / "model" / "lightprune_export.json").read_text())
    assert manifest["plan"]["keep"] == {"0": [0, 1, 2], "1": [5, 6, 7]} and manifest["plan"]["criterion"] == "mine"
    assert json.loads((run / "report.json").read_text())["kept_per_layer"] == {"0": 3, "1": 3}
    said = "ExpertPruning: aimer selects nothing: Export applies the plan in"
    assert any(m.startswith(said) for m in caplog.messages)


def test_path_options_take_tilde_and_a_directory_is_no_plan_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    lp.ExpertPlan(keep={0: [0, 1]}, num_experts={0: 8}).save(tmp_path / "plan.json")
    assert Export(plan_path="~/plan.json").plan_path == str(tmp_path / "plan.json")
    for cls in (Export, WidthExport):
        with pytest.raises(IsADirectoryError, match=rf"^plan_path: '{tmp_path}' is a directory, not a plan file"):
            cls(plan_path=str(tmp_path))
        with pytest.raises(FileNotFoundError, match=r"^plan_path: '~/missing.json' does not exist"):
            cls(plan_path="~/missing.json")
    from lightprune.callbacks.state import run_directory

    class Trainer:
        default_root_dir = "~/runs/a"

    assert run_directory(Trainer(), None) == tmp_path / "runs" / "a"
    assert run_directory(Trainer(), "~/b") == tmp_path / "b"
    assert Evaluate(output_dir="~/e").output_dir == "~/e" and ExpertStats(output_dir="~/s").output_dir == "~/s"
