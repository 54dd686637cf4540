"""JobEndCallback: a callback that acts once, at the end of whichever job it runs in.

``lightprune export`` ends in ``on_export``, ``lightprune calibrate`` in ``on_calibrate_end``
(both called by `PruneTrainer`) and ``lightprune fit`` in Lightning's
``on_fit_end``. Every JobEndCallback registers with the run's `RunState`
at ``setup``; the first end-of-job hook runs them all in the order of their `phase` (score, select,
export, evaluate, report), so where a callback is listed does not matter.

At ``setup`` the run's list of callbacks is checked first (`RunState.check_callbacks`: two Exports, two ExpertPruning
writing one folder, ...).
Subclasses set `phase` and implement two methods, in the manner of Lightning's ``BaseFinetuning``:
[`check`][.JobEndCallback.check] (fail fast against the model at setup, before any data is spent) and `run` (the work;
idempotent). [`run_test`][.JobEndCallback.run_test] is what a callback does at the end of ``lightprune test`` (nothing
by default).
[`preflight`][.JobEndCallback.preflight] (a classmethod) refuses what needs no model (an output directory that exists)
from the parsed
options alone: the ``lightprune`` command calls it before anything is built, so that refusal comes in a second.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl

from lightprune.callbacks.state import RunState

__all__ = ["JobEndCallback"]


class JobEndCallback(pl.Callback):
    """Registers with the run state at ``setup``; its end-of-job hooks run every registered step in phase order."""

    #: when this callback's :meth:`run` comes at the end of the job (one of ``callbacks.state.PHASES``)
    phase: str = "export"

    @classmethod
    def preflight(cls, init_args: Mapping[str, Any], default_root_dir: str | None) -> None:
        """Raise when the options ``init_args`` (the callback's parsed arguments) cannot work whatever the model,
        ``default_root_dir``: the trainer's (None: the working directory). Default: nothing to check."""

    def check(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Raise before any work when this callback cannot act on ``pl_module`` (default: nothing to check)."""

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        raise NotImplementedError

    def run_test(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The end of ``lightprune test`` (default: nothing)."""

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        state = RunState.of(trainer)
        state.check_callbacks(trainer)  # callbacks that conflict (two Exports, ...): refused before any work
        state.add_job_end(self)
        self.check(trainer, pl_module, stage)

    def _finish(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        state = RunState.of(trainer)
        state.add_job_end(self)
        state.finish_job(trainer, pl_module)

    def on_export(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish(trainer, pl_module)

    def on_calibrate_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish(trainer, pl_module)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish(trainer, pl_module)

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        state = RunState.of(trainer)
        state.add_job_end(self)
        state.finish_test(trainer, pl_module)
