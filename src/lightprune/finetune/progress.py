"""lightprune's progress bar: Lightning's default one (Rich when installed, else tqdm) that says what it shows.

- a calibration (``PruneTrainer.calibrate``, whose loop is Lightning's validation loop) is labelled
  "Calibration", not "Validation";
- a run bounded by steps (``max_epochs=-1``) shows "Epoch N", not Rich's "Epoch N/-2".
"""

from __future__ import annotations

from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar

__all__ = ["progress_bar"]


def progress_bar() -> ProgressBar:
    """A new instance of the bar (a class made on first call: Rich is optional)."""
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
    from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

    base = RichProgressBar if _RICH_AVAILABLE else TQDMProgressBar

    class LightpruneProgressBar(base):
        @property
        def validation_description(self) -> str:
            return "Calibration" if getattr(self.trainer, "calibrating", False) else super().validation_description

        def _get_train_description(self, current_epoch: int) -> str:  # Rich only: "Epoch N/max_epochs - 1"
            epochs = self.trainer.max_epochs
            if epochs is not None and epochs < 0:  # no epoch bound: no "/-2"
                return f"Epoch {current_epoch}"
            return super()._get_train_description(current_epoch)

    return LightpruneProgressBar()
