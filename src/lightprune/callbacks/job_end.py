"""JobEndCallback: a callback that acts once, at the end of whichever job it runs in.

``lightprune export`` ends in ``on_export``, ``lightprune calibrate`` in ``on_calibrate_end``
(both called by :class:`~lightprune.trainer.PruneTrainer`) and ``lightprune fit`` in Lightning's
``on_fit_end``. Subclasses implement :meth:`run` and make it idempotent.
"""

from __future__ import annotations

import lightning.pytorch as pl

__all__ = ["JobEndCallback"]


class JobEndCallback(pl.Callback):
    """Calls :meth:`run` from ``on_export``, ``on_calibrate_end`` and ``on_fit_end``."""

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        raise NotImplementedError

    def on_export(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.run(trainer, pl_module)

    def on_calibrate_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.run(trainer, pl_module)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.run(trainer, pl_module)
