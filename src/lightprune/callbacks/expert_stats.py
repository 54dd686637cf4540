"""ExpertStats: calibration statistics over ``lightprune calibrate``'s forward passes.

Drives `ExpertObserver` from Lightning's validation loop while
the trainer calibrates: the observer is entered at ``on_validation_start`` and fed each batch at
``on_validation_batch_start`` by the Python API's own driver
(`lightprune.experts.calibration.feed.observe_batch`: the same model inputs, the output head skipped, no loss;
``MoECausalLM.validation_step`` then does nothing, and ``val/ppl`` is not measured on calibration batches; a module
without ``leaves_calibration_forwards`` runs its own forward after the batch is declared), and at
``on_validation_end`` the per-rank accumulators
are summed across ranks, every rank gets the same
[`CalibrationStats`][lightprune.experts.calibration.result.CalibrationStats] (``self.stats``, and the
run state's ``calibration``), and rank 0 writes ``calibration.json``. [`ExpertPruning`][..expert_pruning.ExpertPruning]
with a calibration criterion (``reap``, ``delta_h``, ``maep``, ...) reads the run state's ``calibration``. While
it observes, the observer is the run state's ``observer`` (so that another callback's own forward passes,
Evaluate's, can pause it).

Resuming: with ``save_every_n_batches > 0`` the accumulators are saved (atomically, one file per
rank) every n batches to ``<output_dir>/calibration_state.rank<r>.pt``, with a fingerprint of the
setup, the model and the batches accumulated (`lightprune.experts.calibration.resume`); a rerun
finds them, checks that its own setup, model and first batches are the same
([`check_resume`][.ExpertStats.check_resume],
used by ``PruneTrainer.calibrate`` before any batch is skipped; a mismatch is an error naming it), that every field
of the state is well-formed and agrees with the others when it is read, and that its sums are the ones this job
collects before they are loaded (a wrong field is an error naming the file and the field), and
skips the batches already seen. ``resume=False`` deletes a saved state and starts afresh. The files
are removed once calibration completes. A state path that is not a regular file (a directory, a dangling link, a
special file) or whose folder cannot be written is refused before any batch, naming it. The state is also in
``state_dict`` so a Lightning checkpoint carries it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightprune.callbacks.options import OPTIONS, uses_options
from lightprune.callbacks.state import RunState, run_directory
from lightprune.core import interrupt
from lightprune.core.batch import head_skipped
from lightprune.core.jsonio import write_json
from lightprune.core.paths import check_state_file
from lightprune.experts.calibration import CalibrationStats, ExpertObserver
from lightprune.experts.calibration.feed import observe_batch
from lightprune.experts.calibration.resume import (
    chain_digest,
    check_batches,
    check_model,
    check_observer_state,
    load_state,
    model_fingerprint,
    save_state,
)
from lightprune.models import find_moe_layers

__all__ = ["ExpertStats"]


@uses_options(OPTIONS["ExpertStats"])
class ExpertStats(pl.Callback):
    """Collect every calibration criterion over ``subsets`` during ``lightprune calibrate``.

    Args:
        subsets: token subsets (``all``, ``text``, ``vision``, ``vision_low_attn``, ``vision_high_attn``).
        criteria: calibration criteria to compute (default: all but ``delta_h_promoted``).
        low_attn_quantile: q of the low / high attention vision subsets.
        output_dir: where calibration.json and resume files go (default: ``trainer.default_root_dir``).
        save_every_n_batches: save resumable state every n batches (0: never).
        resume: resume from a saved state of the same calibration (False: delete it and start afresh).
    """

    def __init__(self, subsets: Iterable[str] = ("all",), criteria: Iterable[str] | None = None,
                 low_attn_quantile: float = 0.02, output_dir: str | None = None, save_every_n_batches: int = 0,
                 resume: bool = True):
        super().__init__()
        options = self.OPTIONS
        self.subsets = options.check("subsets", subsets)
        self.criteria = options.check("criteria", criteria)
        save_every_n_batches = options.check("save_every_n_batches", save_every_n_batches)
        self.low_attn_quantile = options.check("low_attn_quantile", low_attn_quantile)
        self.output_dir = output_dir
        self.save_every_n_batches = save_every_n_batches
        self.resume = bool(resume)
        self.stats: CalibrationStats | None = None
        self._observer: ExpertObserver | None = None
        self._head: dict[str, Any] = {}  # the model's head_skipped arguments, read once per pass
        self._pending_state: dict[str, Any] | None = None  # observer state to load (a file's or a checkpoint's)
        self._resumed: dict[str, Any] | None = None  # the state file being resumed (fingerprint included)
        self._digest: str | None = None  # the chain digest of the batches accumulated so far
        self._model_fingerprint: dict[str, Any] | None = None

    # ------------------------------------------------------------------ files
    def run_dir(self, trainer: pl.Trainer) -> Path:
        return run_directory(trainer, self.output_dir)

    def _state_path(self, trainer: pl.Trainer) -> Path:
        return self.run_dir(trainer) / f"calibration_state.rank{trainer.global_rank}.pt"

    def _setup(self) -> dict[str, Any]:
        return {"subsets": list(self.subsets), "criteria": None if self.criteria is None else list(self.criteria),
                "low_attn_quantile": float(self.low_attn_quantile)}

    def batches_to_skip(self, trainer: pl.Trainer) -> int:
        """Batches a previous, interrupted calibration already accumulated (0 when starting afresh). A state path that
        is not a regular file, or whose folder cannot be written, is refused first (before any batch)."""
        path = self._state_path(trainer)
        if self.save_every_n_batches or os.path.lexists(path):  # written, or read and deleted, by this run
            check_state_file(path, "calibration state", "move it away (or delete it), or give ExpertStats another "
                                                        "output_dir (--stats.output_dir)")
        if not self.resume:
            if path.is_file():
                path.unlink()
                rank_zero_info(f"ExpertStats: resume=False, deleted {path}; calibrating afresh")
            return 0
        if self._resumed is None and path.is_file():
            self._resumed = load_state(path, self._setup())
            self._pending_state = self._resumed["observer"]
            rank_zero_info(f"ExpertStats: resuming calibration from {path} "
                           f"({self._pending_state['batches_seen']} batches done)")
        return int(self._resumed["observer"]["batches_seen"]) if self._resumed else 0

    def check_resume(self, trainer: pl.Trainer, batches) -> None:
        """Refuse to resume unless ``batches`` (this run's calibration batches, from the first) begin with exactly
        the batches the saved state accumulated; called before they are skipped."""
        if self._resumed is not None:
            check_batches(self._state_path(trainer), self._resumed, batches)

    def _save_state(self, trainer: pl.Trainer) -> None:
        save_state(self._state_path(trainer), self._observer.state_dict(), self._setup(), self._model_fingerprint,
                   self._digest)
        self._saved_batches = self._observer.batches_seen

    # ------------------------------------------------------------------ lifecycle
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        RunState.of(trainer).check_callbacks(trainer)  # a second ExpertStats, ...: refused before any work

    @staticmethod
    def _calibrating(trainer: pl.Trainer) -> bool:
        return bool(getattr(trainer, "calibrating", False))

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._calibrating(trainer):
            return
        self.stats = None
        skeleton = getattr(pl_module, "skeleton", None)  # a streamed model: its sums go where its layers compute
        observer = ExpertObserver(pl_module.model, self.subsets, self.criteria, self.low_attn_quantile,
                                  device=None if skeleton is None else skeleton.device)
        if self.save_every_n_batches or self._resumed is not None:
            self._model_fingerprint = _fingerprint(pl_module)
        if self._resumed is not None:  # the saved state must come from this model
            check_model(self._state_path(trainer), self._resumed, self._model_fingerprint)
            self._digest = self._resumed["digest"]
        if self._pending_state is not None:  # what the job collects, before anything is loaded
            source = self._state_path(trainer) if self._resumed is not None else \
                "the Lightning checkpoint's ExpertStats"
            check_observer_state(source, self._pending_state, observer)
            observer.load_state_dict(self._pending_state)
            self._pending_state = None
        observer.__enter__()
        self._head = head_skipped(pl_module.model)  # one signature look-up per pass, not per batch
        self._observer = observer
        RunState.of(trainer).observer = observer

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        if self._observer is not None:
            if self.save_every_n_batches:  # what the state accumulated, for a resumed run to check
                self._digest = chain_digest(self._digest, batch)
            if _leaves_forwards(pl_module):  # fed here as the Python API feeds it: the same inputs, no head
                observe_batch(self._observer, pl_module.model, batch, head=self._head, forward=pl_module)
            else:
                self._observer.begin_batch(batch)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        observer = self._observer
        save = observer is not None and self.save_every_n_batches and \
            observer.batches_seen % self.save_every_n_batches == 0
        if observer is not None and _defers(pl_module) and (save or pl_module.deferred_full()):
            self._flush(pl_module)  # the state saved must hold every batch counted
        if save:
            self._save_state(trainer)

    def _flush(self, pl_module: pl.LightningModule) -> None:
        """Run the forwards a sequential module deferred (``MoECausalLM(sequential=True)``), declaring each batch to
        the observer again before every layer it enters (it was counted when it arrived)."""
        observer = self._observer
        pl_module.flush_deferred(lambda batch: observer.begin_batch(batch, count=False, remember=True))

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._observer is not None and _defers(pl_module):
            self._flush(pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        observer = self._observer
        if observer is None:
            return
        state = RunState.of(trainer)
        try:
            observer.all_reduce()
            self.stats = state.calibration = observer.result()
        finally:
            observer.__exit__(None, None, None)
            self._observer = state.observer = None
        self._state_path(trainer).unlink(missing_ok=True)
        self._resumed = None
        if trainer.is_global_zero:
            write_json(self.stats.to_json(), self.run_dir(trainer) / "calibration.json", indent=1)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """A calibration stopped by a signal (`lightprune.core.interrupt.Interrupted`) keeps its saved state:
        recorded (`lightprune.core.interrupt.kept`), so the command's line names it and says a rerun resumes."""
        if not isinstance(exception, interrupt.Interrupted) or self._observer is None:
            return
        path = self._state_path(trainer)
        if os.path.isfile(path):
            batches = getattr(self, "_saved_batches", None)
            after = f" after {batches} batches" if batches else ""
            interrupt.kept(f"{path} (the calibration state{after}: the same command again resumes from it)")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._observer is not None:  # an interrupted loop: restore the model, keep the saved state
            self._observer.__exit__(None, None, None)
            self._observer = RunState.of(trainer).observer = None

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {"observer": self._observer.state_dict() if self._observer is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("observer") is not None:
            self._pending_state = state_dict["observer"]


def _fingerprint(pl_module: pl.LightningModule) -> dict[str, Any]:
    """`model_fingerprint` of the module's model; a streamed one (``MoECausalLM(sequential=True)``) has its
    routers read in for it."""
    skeleton = getattr(pl_module, "skeleton", None)
    if skeleton is None:
        return model_fingerprint(pl_module.model)
    names = {id(module): name for name, module in pl_module.model.named_modules()}
    routers = [names[id(layer.router)] for layer in find_moe_layers(pl_module.model)]
    with skeleton.resident(*routers):
        return model_fingerprint(pl_module.model)


def _defers(pl_module: pl.LightningModule) -> bool:
    return bool(getattr(pl_module, "defers_forwards", lambda: False)())


def _leaves_forwards(pl_module: pl.LightningModule) -> bool:
    """Whether the module's ``validation_step`` leaves a calibration batch's forward to the observed pass's driver
    (``MoECausalLM`` with its model in memory); another module runs its own forward after the batch is declared."""
    return bool(getattr(pl_module, "leaves_calibration_forwards", lambda: False)())
