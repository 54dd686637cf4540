"""PruneTrainer: Lightning's Trainer with the two lightprune entry points, ``calibrate`` and ``export``.

- ``calibrate``: forward passes over calibration data with no optimizer (Lightning's
  validation loop over the datamodule's ``calibration_dataloader`` when it has one), then the
  ``on_calibrate_end(trainer, pl_module)`` hook of every callback that defines it.
- ``export``: no data and no training; runs the ``on_export(trainer, pl_module)`` hook of every
  callback that defines it (scoring from weights, selection, surgery, export).

Callbacks that act "at the end of the job" implement ``on_fit_end``, ``on_calibrate_end`` and
``on_export`` and run once, in the order of their phase
([`lightprune.callbacks.job_end.JobEndCallback`][lightprune.callbacks.job_end.JobEndCallback]).
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable, Iterator

import lightning.pytorch as pl
from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar
from lightning.pytorch.trainer import call
from lightning.pytorch.trainer.states import TrainerFn, TrainerStatus
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightprune.callbacks.state import RunState
from lightprune.core.extras import missing_deepspeed
from lightprune.core.paths import check_input_file
from lightprune.finetune.progress import progress_bar

__all__ = ["PruneTrainer", "SkipBatches", "check_ckpt_path"]


class SkipBatches:
    """An iterable over ``loader`` without its first ``skip`` batches (a resumed calibration).

    The skipped batches are still loaded (not run through the model). Lightning treats this as a
    plain iterable: under DDP the loader must already shard by rank.
    """

    def __init__(self, loader: Iterable, skip: int):
        self.loader, self.skip = loader, skip

    def __iter__(self) -> Iterator:
        return itertools.islice(iter(self.loader), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.loader) - self.skip)


_CKPT = "Lightning checkpoint (ckpt_path)"
_CKPT_FIX = "give the .ckpt file a run saved (ModelCheckpoint's), or leave ckpt_path out to start afresh"


def checkpoint_format_problem(path: Any) -> str | None:
    """Why the file ``path`` is not a Lightning checkpoint, from its first bytes (``torch.save``'s zip archive,
    ``PK\\x03\\x04``, or its legacy pickle, ``\\x80``), or None: a safetensors file (model weights: the model's
    checkpoint folder takes them) is named as one; anything else is said to be neither."""
    with open(path, "rb") as handle:
        head = handle.read(16)
    if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
        return None
    if len(head) > 9 and head[8:10] in (b'{"', b"{}") and int.from_bytes(head[:8], "little") > 1:
        return ("is a safetensors file (model weights), not a Lightning checkpoint; a model's weights are read from "
                "its folder, --model.init_args.checkpoint")
    return (f"is not a Lightning checkpoint: it starts with {head[:8]!r}, neither torch's zip archive "
            "(b'PK\\x03\\x04') nor its pickle (b'\\x80')")


def check_ckpt_path(ckpt_path: Any) -> None:
    """Refuse a local ``ckpt_path`` (a remote one is fsspec's; None: none) that is not there, not a regular file,
    empty, or not a Lightning checkpoint (`checkpoint_format_problem`), in one line naming it."""
    if ckpt_path is not None and "://" not in str(ckpt_path):
        check_input_file(ckpt_path, _CKPT, _CKPT_FIX)
        problem = checkpoint_format_problem(ckpt_path)
        if problem:
            raise ValueError(f"{_CKPT} {str(ckpt_path)!r} {problem}; {_CKPT_FIX}")


class PruneTrainer(pl.Trainer):
    """A `lightning.pytorch.Trainer` that also calibrates and exports."""

    #: True while ``calibrate`` runs its validation loop (callbacks tell calibration from validation by it)
    calibrating: bool = False

    def __init__(self, *args: Any, **kwargs: Any):
        if kwargs.get("enable_progress_bar", True) is not False:  # our default bar says "Calibration" when it is one
            callbacks = kwargs.get("callbacks")
            callbacks = [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) \
                else [callbacks]
            if not any(isinstance(c, ProgressBar) for c in callbacks):
                kwargs["callbacks"] = [*callbacks, progress_bar()]
        try:
            super().__init__(*args, **kwargs)
        except MisconfigurationException as err:  # a DeepSpeed strategy without deepspeed: name the extra
            missing = missing_deepspeed(err)
            if missing is None:
                raise
            raise missing from None

    def _run(self, model: pl.LightningModule, ckpt_path: Any = None, *args: Any, **kwargs: Any) -> Any:
        """Lightning's run of every loop, the checkpoint to resume from (``ckpt_path``, ``best`` / ``last`` resolved)
        checked first: before any setup hook and before the model is built."""
        check_ckpt_path(ckpt_path)
        return super()._run(model, ckpt_path, *args, **kwargs)

    def _call_custom_hook(self, hook: str, model: pl.LightningModule) -> None:
        for callback in self.callbacks:
            fn = getattr(callback, hook, None)
            if callable(fn):
                fn(self, model)

    def calibrate(self, model: pl.LightningModule | None = None, dataloaders: Any = None,
                  datamodule: pl.LightningDataModule | None = None, ckpt_path: str | None = None) -> None:
        """Run forward passes over calibration data (no optimizer), then the callbacks' ``on_calibrate_end``."""
        model = model or self.lightning_module
        if model is None:
            raise ValueError("calibrate needs a model")
        if dataloaders is None and datamodule is not None and hasattr(datamodule, "calibration_dataloader"):
            if self.is_global_zero:  # the loop does not see this datamodule: prepare it as fit would
                datamodule.prepare_data()
            self.strategy.barrier("calibration_prepare_data")
            datamodule.setup("calibrate")
            RunState.of(self).datamodule = datamodule  # the loop does not see it; callbacks may (its tokenizer)
            dataloaders = datamodule.calibration_dataloader()
            datamodule = None
        skip = max((cb.batches_to_skip(self) for cb in self.callbacks if hasattr(cb, "batches_to_skip")), default=0)
        if skip and dataloaders is not None:
            for cb in self.callbacks:  # a resumed state must hold this run's first batches: checked before skipping
                if hasattr(cb, "check_resume"):
                    cb.check_resume(self, iter(dataloaders))
            dataloaders = SkipBatches(dataloaders, skip)
        if dataloaders is not None or datamodule is not None:
            self.calibrating = True
            try:
                # launched like validate, so that under ddp_spawn/ddp_fork the end-of-calibration
                # hooks run in the worker processes, where the model and the statistics live
                self.strategy._lightning_module = model
                self.state.fn = TrainerFn.VALIDATING
                self.state.status = TrainerStatus.RUNNING
                self.validating = True
                call._call_and_handle_interrupt(self, self._calibrate_impl, model, dataloaders, datamodule, ckpt_path)
            finally:
                self.calibrating = False
        else:
            rank_zero_info("calibrate: no calibration data given; only weight-based callbacks will act")
            self._attach(model)
            self._run_without_loop("calibrate", "on_calibrate_end", model)

    def _calibrate_impl(self, model: pl.LightningModule, dataloaders: Any, datamodule: Any,
                        ckpt_path: str | None) -> None:
        self._validate_impl(model, dataloaders, ckpt_path, False, datamodule)
        self._call_custom_hook("on_calibrate_end", model)

    def export(self, model: pl.LightningModule | None = None,
               datamodule: pl.LightningDataModule | None = None) -> None:
        """Score, select, prune and export with the configured callbacks, without data or training."""
        model = model or self.lightning_module
        if model is None:
            raise ValueError("export needs a model")
        self._attach(model)
        self._run_without_loop("export", "on_export", model)

    def _run_without_loop(self, stage: str, hook: str, model: pl.LightningModule) -> None:
        """``setup``, then ``hook`` of every callback, then ``teardown`` (as a loop would, without one)."""
        for callback in self.callbacks:
            callback.setup(self, model, stage=stage)
        try:
            self._call_custom_hook(hook, model)
        finally:
            for callback in self.callbacks:
                callback.teardown(self, model, stage=stage)

    def _attach(self, model: pl.LightningModule) -> None:
        """Make ``model`` the trainer's module (as fit/validate would) without running a loop."""
        self.strategy.connect(model)
        model.trainer = self
        if hasattr(model, "configure_model"):
            model.configure_model()
