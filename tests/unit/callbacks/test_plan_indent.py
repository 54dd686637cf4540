"""ExpertPruning stages plan.json and merge_plan.json with the plans' own JSON indentation (ExpertPlan.INDENT,
MergePlan.INDENT), as Export and ``plan.save`` write them: one file, one layout, whoever writes it."""

from __future__ import annotations

from pathlib import Path

from lightprune.callbacks import ExpertPruning
from lightprune.callbacks.state import RunState
from lightprune.experts.merging import MergePlan
from lightprune.experts.plan import ExpertPlan


class _Trainer:
    """What ExpertPruning.run reads of a trainer when it writes its run files."""

    is_global_zero = True

    def __init__(self, root: Path) -> None:
        self.default_root_dir = str(root)


def _staged(monkeypatch) -> dict[str, int | None]:
    """file name -> the indent it is staged with."""
    staged: dict[str, int | None] = {}

    def stage_file(self, path, data, indent=None) -> None:
        staged[Path(path).name] = indent

    monkeypatch.setattr(RunState, "stage_file", stage_file)
    return staged


def test_the_expert_plan_is_staged_with_its_own_indent(tmp_path, monkeypatch) -> None:
    from lightprune.finetune import MoECausalLM

    monkeypatch.setattr(ExpertPlan, "INDENT", 3)  # not the 2 it has: a hard-coded indent would show
    staged = _staged(monkeypatch)
    module = MoECausalLM(tiny="qwen3_moe", tiny_overrides={"num_hidden_layers": 2})
    module.configure_model()
    ExpertPruning("aimer", ratio=0.5).run(_Trainer(tmp_path), module)
    assert staged == {"scores.json": 1, "plan.json": 3}


def test_the_merge_plan_is_staged_with_its_own_indent(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(MergePlan, "INDENT", 4)  # not the 1 it has
    staged = _staged(monkeypatch)
    pruning = ExpertPruning("hc_smoe", ratio=0.5)
    plan = MergePlan(clusters={0: [[0, 1], [2, 3]]}, dominant={0: [0, 2]}, coefficients={0: [[0.5, 0.5], [0.5, 0.5]]},
                     num_experts={0: 4}, method="hc_smoe", ratio=0.5)
    monkeypatch.setattr(pruning.criterion, "merge_plan", lambda calibration, ratio, allocation: plan)
    pruning.run(_Trainer(tmp_path), None)
    assert staged == {"merge_plan.json": 4} and pruning.merge_plan is plan
