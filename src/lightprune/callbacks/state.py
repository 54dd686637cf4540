"""RunState: what lightprune's callbacks share during one run, so that none looks another up.

One object per trainer (`RunState.of`). Callbacks put what they produce here and take what they
need from here:

- ``calibration``: the [`CalibrationStats`][lightprune.experts.calibration.result.CalibrationStats] of the run
  (ExpertStats), and ``observer``, the calibration observer while it is active (ExpertStats; Evaluate pauses it);
- ``expert_scores``: importance by criterion name (RouterDelta puts ``router_delta``; ExpertPruning puts
  the criterion it scored), ``scoring_seconds``;
- ``expert_plan``: the ExpertPlan (ExpertPruning; Export applies it, Evaluate masks with it); ``merge_plan``: the
  MergePlan of a merging method (ExpertPruning with ``hc_smoe`` / ``m_smoe``; ``expert_plan`` is then its kept
  layout; Export writes the merged experts before the surgery, Evaluate merges reversibly);
- ``evaluation``: what Evaluate measured so far (the model card of an export shows it; Evaluate rewrites that
  card's evaluation once it has measured after the export); ``exported``: the checkpoint the run's export
  published (Export or WidthExport, on rank 0); ``summary``: the export's
  report (Export, when it prints a summary), printed as a table once every end-of-job step has run, with the
  evaluation's rows; ``datamodule``: the
  data of a ``lightprune calibrate`` run, which Lightning does not attach to the trainer (PruneTrainer);
- ``width_plan`` and the width masks active on the model (WidthSearch; WidthExport releases them, Evaluate
  reads whether they are on): one owner for those hooks, `apply_width_masks` /
  `release_width_masks`;
- the end-of-job steps: every [`JobEndCallback`][..job_end.JobEndCallback] registers at ``setup``
  and the first end-of-job hook runs them all, in phase order (`PHASES`: score, select, export,
  evaluate, report), each once. Where a callback is listed does not matter;
- the run files that must agree with the export (plan.json, scores.json, and the command's config.yaml:
  `stage_file`, `stage_text`) are held until the export phase has succeeded (or the job ends without
  one), then they are written together, each atomically. A run that fails before leaves the previous run's files as
  they were. With an export's ``overwrite``, the previous run's files that this run does not write (its
  calibration.json beside a new plan: `previous_files`) are deleted with that publishing.

Where a callback writes them: `run_directory`, its ``output_dir`` or else the trainer's
``default_root_dir``.

Which callbacks a run may list together ([`lightprune.callbacks.roster`][..roster]) is checked once, at the first
lightprune callback's ``setup`` (`RunState.check_callbacks`), before any work: it also records ``plan_file`` (Export's
``plan_path``: no ExpertPruning selects then) and ``plan_folder`` (with several ExpertPruning, the folder of the one
whose plan the run applies).
"""

from __future__ import annotations

import contextlib
import os
import stat
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from lightprune.callbacks.roster import ONCE, PER_FOLDER, check_roster
from lightprune.checkpoints.journal import complete, settle, write_pending
from lightprune.core import interrupt
from lightprune.core.jsonio import json_text, write_json
from lightprune.core.paths import write_atomically
from lightprune.width.mask import mask_width

if TYPE_CHECKING:  # annotations only
    import lightning.pytorch as pl

    from lightprune.experts.calibration import CalibrationStats, ExpertObserver
    from lightprune.experts.merging import MergePlan
    from lightprune.experts.plan import ExpertPlan
    from lightprune.experts.scores import ExpertScores
    from lightprune.width.plan import WidthPlan

__all__ = ["RunState", "PHASES", "run_directory"]

#: the end-of-job phases, in the order they run
PHASES: tuple[str, ...] = ("score", "select", "export", "evaluate", "report")

_STATES: "weakref.WeakKeyDictionary[Any, RunState]" = weakref.WeakKeyDictionary()


class _Text(str):
    """A staged file's text, written as it is (`RunState.stage_text`)."""


def _write_text(text: str, path: str) -> None:
    """``text`` to ``path`` in UTF-8 (`write_atomically`: parents created, the temporary
    file removed and the file named on failure)."""
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), "run file")


def _identity(path: str) -> tuple | None:
    """What tells whether the regular file ``path`` was rewritten (None: no regular file there)."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size


def _lightprune_class(callback: Any) -> str | None:
    """The name of the lightprune callback class ``callback`` is (or subclasses), None for any other callback."""
    known = {*ONCE, *PER_FOLDER, "ReportPage"}
    return next((cls.__name__ for cls in type(callback).__mro__
                 if cls.__name__ in known and cls.__module__.startswith("lightprune.callbacks.")), None)


def run_directory(trainer: "pl.Trainer", output_dir: str | os.PathLike | None) -> Path:
    """The directory a callback writes its run files to: ``output_dir``, else ``trainer.default_root_dir`` (``~``
    expanded)."""
    return Path(output_dir or trainer.default_root_dir).expanduser()


@dataclass(eq=False)
class RunState:
    """What one run's lightprune callbacks share (the module docstring lists who writes and reads each field)."""

    calibration: "CalibrationStats | None" = None
    observer: "ExpertObserver | None" = None
    expert_scores: "dict[str, ExpertScores]" = field(default_factory=dict)
    scoring_seconds: float = 0.0
    expert_plan: "ExpertPlan | None" = None
    merge_plan: "MergePlan | None" = None
    width_plan: "WidthPlan | None" = None
    evaluation: dict = field(default_factory=dict)
    exported: "Path | None" = None
    summary: "dict | None" = None
    datamodule: Any = None
    plan_file: "Path | None" = None
    plan_folder: "Path | None" = None
    _width_masks: Any = None
    _checked: bool = False
    _job_end: list = field(default_factory=list)
    _finishing: bool = False
    _tested: list = field(default_factory=list)
    _finished: list = field(default_factory=list)
    _staged: dict = field(default_factory=dict)
    _journal: Any = None  # the journal of the staged files written aside (checkpoints.journal), until committed
    _superseded: set = field(default_factory=set)
    _previous: dict = field(default_factory=dict)  # {absolute path: identity} of a previous run's files (overwrite)
    _stale: list = field(default_factory=list)  # those the journal deletes: this run did not write them

    @classmethod
    def of(cls, trainer: Any) -> "RunState":
        """The run state of ``trainer`` (created on first use; it lives as long as the trainer)."""
        state = _STATES.get(trainer)
        if state is None:
            state = _STATES[trainer] = cls()
        return state

    # ------------------------------------------------------------------ the callbacks listed
    def check_callbacks(self, trainer: Any) -> None:
        """Refuse lightprune callbacks that conflict in ``trainer.callbacks`` (one line naming the class:
        [`check_roster`][....roster.check_roster]) and record ``plan_file`` and ``plan_folder``; once per run,
        from the first lightprune callback's ``setup``."""
        if self._checked:
            return
        listed = []
        for callback in getattr(trainer, "callbacks", None) or []:
            name = _lightprune_class(callback)
            if name is not None:
                listed.append((name, {key: getattr(callback, key, None)
                                      for key in ("output_dir", "checkpoint_dir", "plan_path")}))
        roster = check_roster(listed, getattr(trainer, "default_root_dir", None))
        self.plan_file, self.plan_folder, self._checked = roster.plan_file, roster.plan_folder, True

    def gives_run_plan(self, run_dir: Any) -> bool:
        """Whether the ExpertPruning writing into ``run_dir`` gives the run's plan (the one Export applies): not with
        Export's ``plan_path``; with several ExpertPruning, the one in ``plan_folder``."""
        if self.plan_file is not None:
            return False
        return self.plan_folder is None or Path(run_dir).expanduser().resolve() == self.plan_folder

    # ------------------------------------------------------------------ calibration
    @contextlib.contextmanager
    def paused_observation(self) -> Iterator[None]:
        """Forward passes inside are not counted as calibration data (the observer's hooks are off)."""
        observer = self.observer
        if observer is None:
            yield
            return
        observer.__exit__(None, None, None)
        try:
            yield
        finally:
            observer.__enter__()

    # ------------------------------------------------------------------ width masks
    @property
    def width_masks_active(self) -> bool:
        return self._width_masks is not None

    def apply_width_masks(self, model: Any, plan: "WidthPlan") -> None:
        """Mask ``model`` with ``plan`` ([`lightprune.width.mask.mask_width`][lightprune.width.mask_width]), replacing
        the masks on it."""
        self.release_width_masks()
        self._width_masks = mask_width(model, plan)

    def release_width_masks(self) -> None:
        """Remove the width masks this state applied (idempotent)."""
        handle, self._width_masks = self._width_masks, None
        if handle is not None:
            handle.remove()

    # ------------------------------------------------------------------ run files
    def stage_file(self, path: Any, data: Any, indent: int | None = None) -> None:
        """Write JSON ``data`` to ``path`` once the job's export phase has succeeded (`commit_files`)."""
        self._staged[str(path)] = (data, indent)

    def stage_text(self, path: Any, text: str) -> None:
        """Write ``text`` to ``path`` with the staged JSON files (the run's config.yaml: ``lightprune.cli.app``)."""
        self._staged[str(path)] = (_Text(text), None)

    def commit_files(self) -> list[str]:
        """Write every staged file (each atomically; a signal meanwhile is held until all are written:
        `lightprune.core.interrupt.publishing`); returns their paths. Where the export wrote them aside before
        its checkpoint's rename (`_write_aside`), they are renamed into place."""
        written = []
        with interrupt.publishing(what="the run files"):
            if self._staged or self._journal is not None:
                interrupt.hold()
            if self._journal is not None:
                journal, self._journal = self._journal, None
                stale, self._stale = self._stale, []
                self._staged.clear()
                written = complete(journal, stale)  # a failure: one line, the journal kept for the next export
            while self._staged:
                path, (data, indent) = next(iter(self._staged.items()))
                if isinstance(data, _Text):
                    _write_text(data, path)
                else:
                    write_json(data, path, indent=indent)
                del self._staged[path]
                written.append(path)
        return written

    def _write_aside(self, staged: Any = None, out: Any = None) -> None:
        """Before an export renames its checkpoint into place (``staged`` -> ``out``), write the staged files beside
        their targets with a journal (`lightprune.checkpoints.journal`): a kill between the checkpoint's rename
        and `commit_files` is settled by the next run, forward or back, never leaving one run's checkpoint
        beside another's plan."""
        if staged is None or out is None or self._journal is not None:
            return
        texts = {path: str(data) if isinstance(data, _Text) else json_text(data, indent=indent) + "\n"
                 for path, (data, indent) in self._staged.items()}
        written = {os.path.abspath(path) for path in (*texts, *self._superseded)}
        stale = sorted(path for path, identity in self._previous.items()
                       if path not in written and _identity(path) == identity)  # not rewritten by this run
        if not texts and not self._superseded and not stale:
            return
        # every target and superseded file is proven replaceable first: an immutable one refuses, nothing published
        self._journal = write_pending(texts, Path(staged), Path(out), sorted({*self._superseded, *stale}))
        self._stale = stale

    def previous_files(self, folder: Any, names: Any) -> None:
        """Record the files ``names`` in ``folder`` (a previous run's: an export with ``overwrite``, before any work),
        so that those this run does not rewrite are deleted with its publishing (named superseded in its journal: a
        kill settles them too); only regular files."""
        for name in names:
            path = os.path.abspath(Path(folder).expanduser() / name)
            identity = _identity(path)
            if identity is not None:
                self._previous[path] = identity

    def supersedes(self, path: Any) -> None:
        """``path`` is rewritten once the export's checkpoint is in place (its report.json): a kill before that leaves
        the previous one, which no longer describes the checkpoint (`lightprune.checkpoints.journal`)."""
        self._superseded.add(str(path))

    # ------------------------------------------------------------------ end of job
    def add_job_end(self, callback: Any) -> None:
        """Register ``callback`` (a JobEndCallback) for `finish_job` (idempotent)."""
        if callback.phase not in PHASES:
            raise ValueError(f"{type(callback).__name__}.phase must be one of {list(PHASES)}, got {callback.phase!r}")
        if all(cb is not callback for cb in self._job_end):
            self._job_end.append(callback)

    def has_phase(self, phase: str) -> bool:
        """True when a registered end-of-job step runs in ``phase``."""
        return any(cb.phase == phase for cb in self._job_end)

    def finish_job(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Run every registered end-of-job step not run yet, phase by phase (list order within a phase)."""
        if self._finishing:
            return
        self._finishing = True
        # the export's checkpoint and the run files committed after it are one publishing group: a signal that comes
        # once the checkpoint is in place waits for the files (lightprune.core.interrupt.publishing)
        group = contextlib.ExitStack()
        try:
            while True:  # a step may register another (a later phase) while it runs
                pending = [cb for cb in self._in_phase_order() if all(cb is not done for done in self._finished)]
                if not pending:
                    break
                if PHASES.index(pending[0].phase) <= PHASES.index("export"):
                    group.enter_context(interrupt.publishing(before_hold=self._write_aside, what="the run files"))
                pending[0].run(trainer, pl_module)
                self._finished.append(pending[0])
                later = pending[1:]
                if not later or PHASES.index(later[0].phase) > PHASES.index("export") >= PHASES.index(pending[0].phase):
                    self.commit_files()  # the export (if any) succeeded: plan and scores go with it
                    group.close()
        finally:
            self._finishing = False
            with group:  # closed (the signals it holds let go) even when settling fails
                if self._journal is not None:  # a step failed once the files were aside: as the next run settles it
                    journal, self._journal = self._journal, None
                    self._staged.clear()
                    settle(journal)
        if self.summary is not None:  # every step ran: the export's figures with the evaluation's
            from lightprune.reporting.report import print_summary

            report, self.summary = self.summary, None
            print_summary(report, self.evaluation)

    def finish_test(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """The end of ``lightprune test``: every registered callback's ``run_test``, in phase order, once each."""
        for callback in self._in_phase_order():
            if all(cb is not callback for cb in self._tested):
                self._tested.append(callback)
                callback.run_test(trainer, pl_module)

    def _in_phase_order(self) -> list:
        return sorted(self._job_end, key=lambda cb: PHASES.index(cb.phase))
