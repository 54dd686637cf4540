"""RunState: the end-of-job steps run in phase order wherever they are listed, once each; the calibration
observer can be paused; the width masks on a model have one owner."""

from __future__ import annotations

import pytest
import torch
from fixtures.width import dense_lm, lm_batch, random_keep

from lightprune.callbacks.job_end import JobEndCallback
from lightprune.callbacks.state import PHASES, RunState
from lightprune.width.plan import WidthPlan


class Step(JobEndCallback):
    def __init__(self, phase: str, log: list, spawn: JobEndCallback | None = None):
        super().__init__()
        self.phase, self.log, self.spawn = phase, log, spawn

    def run(self, trainer, pl_module) -> None:
        self.log.append(self.phase)
        if self.spawn is not None:
            RunState.of(trainer).add_job_end(self.spawn)

    def run_test(self, trainer, pl_module) -> None:
        self.log.append(f"test:{self.phase}")


class Trainer:  # what RunState keys on: any object that lives as long as the run
    pass


def test_steps_run_in_phase_order_once_whatever_the_list_order() -> None:
    trainer, log = Trainer(), []
    steps = [Step(phase, log) for phase in reversed(PHASES)]
    for step in steps:
        step.setup(trainer, None, "fit")
    steps[2].on_fit_end(trainer, None)  # whichever callback Lightning calls first
    assert log == list(PHASES)
    for step in steps:  # every other callback's hook finds the job finished
        step.on_fit_end(trainer, None)
    assert log == list(PHASES)
    steps[0].on_test_end(trainer, None)
    steps[4].on_test_end(trainer, None)
    assert log[len(PHASES):] == [f"test:{p}" for p in PHASES]
    assert RunState.of(trainer) is RunState.of(trainer) and RunState.of(Trainer()) is not RunState.of(trainer)


def test_a_step_may_add_a_later_step_while_it_runs() -> None:
    trainer, log = Trainer(), []
    later = Step("export", log)
    Step("score", log, spawn=later).setup(trainer, None, "fit")
    Step("select", log).on_export(trainer, None)  # setup never ran for this one: the hook registers it
    assert log == ["score", "select", "export"]


def test_an_unknown_phase_is_named() -> None:
    with pytest.raises(ValueError, match="Step.phase must be one of .* got 'later'"):
        Step("later", []).setup(Trainer(), None, "fit")


def test_paused_observation_leaves_and_reenters_the_observer() -> None:
    calls = []

    class Observer:
        def __enter__(self):
            calls.append("enter")
            return self

        def __exit__(self, *exc):
            calls.append("exit")

    state = RunState()
    with state.paused_observation():
        calls.append("work")
    assert calls == ["work"]  # nothing to pause
    state.observer = Observer()
    with pytest.raises(RuntimeError), state.paused_observation():
        calls.append("work")
        raise RuntimeError("the work fails")
    assert calls == ["work", "exit", "work", "enter"]  # re-entered even when the work fails


@torch.no_grad()
def test_width_masks_have_one_owner() -> None:
    model, batch = dense_lm(), lm_batch()
    dense = model(**batch).logits
    plan = WidthPlan.dense(model)
    plan = plan.replace(attn_keep=random_keep(plan, columns=(0, 1, 2), seed=3))
    state = RunState()
    state.apply_width_masks(model, plan)
    masked = model(**batch).logits
    assert state.width_masks_active and not torch.allclose(masked, dense)
    state.apply_width_masks(model, plan)  # replaces its own masks (mask_width itself refuses to nest)
    torch.testing.assert_close(model(**batch).logits, masked, rtol=0, atol=0)
    state.release_width_masks()
    state.release_width_masks()  # idempotent
    assert not state.width_masks_active
    torch.testing.assert_close(model(**batch).logits, dense, rtol=0, atol=0)


def test_every_callback_writes_to_its_output_dir_or_the_trainers_root(tmp_path) -> None:
    from lightprune.callbacks import Evaluate, ExpertPruning, ExpertStats
    from lightprune.callbacks.export import checkpoint_path
    from lightprune.callbacks.state import run_directory

    trainer = Trainer()
    trainer.default_root_dir = str(tmp_path / "root")
    assert run_directory(trainer, None) == tmp_path / "root"
    assert run_directory(trainer, tmp_path / "mine") == tmp_path / "mine"
    assert checkpoint_path(trainer, None, None) == tmp_path / "root" / "model"
    assert checkpoint_path(trainer, str(tmp_path / "mine"), None) == tmp_path / "mine" / "model"
    for callback in (Evaluate(), ExpertPruning(), ExpertStats()):
        assert callback.run_dir(trainer) == tmp_path / "root"
        callback.output_dir = str(tmp_path / "mine")
        assert callback.run_dir(trainer) == tmp_path / "mine"
