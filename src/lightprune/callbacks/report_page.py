"""ReportPage: write the run's ``report.md`` (`lightprune.reporting.page.write_report_page`) at the end of
the job, after pruning, export and evaluation."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightprune.callbacks.job_end import JobEndCallback
from lightprune.callbacks.options import OPTIONS, uses_options
from lightprune.callbacks.state import run_directory
from lightprune.reporting.page import write_report_page

__all__ = ["ReportPage"]


@uses_options(OPTIONS["ReportPage"])
class ReportPage(JobEndCallback):
    """Write the run's ``report.md`` at the end of the job (phase ``report``: after pruning, export and
    [`Evaluate`][...evaluate.Evaluate], wherever it is listed). Only rank 0 writes.

    Args:
        output_dir: the run directory (default: ``trainer.default_root_dir``).
    """

    phase = "report"

    def __init__(self, output_dir: str | None = None):
        super().__init__()
        self.output_dir = output_dir
        self.path: Path | None = None

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.path is not None:
            return
        if trainer.is_global_zero:
            self.path = write_report_page(run_directory(trainer, self.output_dir))
            rank_zero_info(f"ReportPage: wrote {self.path}")
        else:
            self.path = run_directory(trainer, self.output_dir) / "report.md"

    def run_test(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # lightprune test: after Evaluate's test measurement (phase order), wherever either is listed
        if trainer.is_global_zero:
            self.path = write_report_page(run_directory(trainer, self.output_dir))
            rank_zero_info(f"ReportPage: wrote {self.path}")
