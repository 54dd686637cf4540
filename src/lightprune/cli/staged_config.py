"""config.yaml published with the run's other files: `StagedConfig`, the command's save-config callback.

Where the job ends in lightprune's end-of-job steps the config is staged with plan.json and the export and written
once they succeed; elsewhere Lightning writes it at ``setup``, as it always does.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.cli import SaveConfigCallback

from lightprune.callbacks.state import RunState

__all__ = ["StagedConfig"]


class StagedConfig(SaveConfigCallback):
    """Lightning's SaveConfigCallback, whose config.yaml is published with the run's other files: where the job ends
    in lightprune's end-of-job steps (``export``, ``calibrate``, a ``fit`` with lightprune's callbacks) it is staged
    with plan.json and the export (`RunState.stage_text`) and written once they succeed, so a run that fails or is
    interrupted leaves the previous run's config.yaml as it was. Elsewhere (or to a remote folder, or in several files)
    it is written at ``setup``, as Lightning writes it."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.already_saved or not self.save_to_log_dir or self.multifile or not self.overwrite or \
                not _ends_in_job_steps(trainer, stage):
            return super().setup(trainer, pl_module, stage)
        from lightning.fabric.utilities.cloud_io import _is_local_file_protocol

        log_dir = trainer.log_dir  # this broadcasts the directory
        if not _is_local_file_protocol(log_dir):
            return super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero:
            text = self.parser.dump(self.config, **_DUMP_ALL)
            RunState.of(trainer).stage_text(os.path.join(log_dir, self.config_filename), text)
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)


def _dump_all() -> dict[str, bool]:
    """The dump's keyword keeping unset values (``skip_unset`` since jsonargparse 4.49, ``skip_none`` before), as
    Lightning's ``skip_none=False`` save keeps them."""
    import inspect

    from jsonargparse import ArgumentParser

    return {"skip_unset" if "skip_unset" in inspect.signature(ArgumentParser.save).parameters else "skip_none": False}


_DUMP_ALL = _dump_all()


def _ends_in_job_steps(trainer: Any, stage: str) -> bool:
    """Whether the run ends in lightprune's end-of-job steps (which publish the staged files once they succeed)."""
    from lightprune.callbacks.job_end import JobEndCallback

    ends = stage in ("fit", "export", "calibrate") or getattr(trainer, "calibrating", False)
    return ends and any(isinstance(callback, JobEndCallback) for callback in trainer.callbacks)
