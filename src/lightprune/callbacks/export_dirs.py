"""Where an export callback (Export, WidthExport) writes its checkpoint, and the refusal of one that holds an
earlier run's files, from the callback's options alone: torch-free, so that the ``lightprune`` command refuses it
before Lightning is imported (:func:`lightprune.cli.options.check_command_line`), and the callbacks' ``preflight``
and ``check`` alike."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightprune.checkpoints.staging import check_out_dir

__all__ = ["WritesCheckpoint", "check_checkpoint_dir", "checkpoint_dir_of"]


def checkpoint_dir_of(init_args: Mapping[str, Any], default_root_dir: str | os.PathLike | None) -> Path:
    """An export callback's checkpoint directory from its options and the trainer's ``default_root_dir`` (None: the
    working directory, as Lightning's): ``checkpoint_dir``, else ``<output_dir or default_root_dir>/model``."""
    if init_args.get("checkpoint_dir"):
        return Path(init_args["checkpoint_dir"])
    return Path(init_args.get("output_dir") or default_root_dir or os.getcwd()) / "model"


def check_checkpoint_dir(path: Path, overwrite: bool, address: str) -> None:
    """Refuse a checkpoint directory holding an earlier run's files unless ``overwrite``, saying how to replace it
    (``--<address>.overwrite true`` on the command line, ``overwrite: true`` in the config)."""
    check_out_dir(path, overwrite, remedy=f"replace it with --{address}.overwrite true (overwrite: true in the "
                                          "config), or choose another --trainer.default_root_dir")


class WritesCheckpoint:
    """Mixin of the export callbacks (``OPTIONS``: their option spec, ``output_dir`` / ``checkpoint_dir`` /
    ``overwrite`` among their options): their ``preflight`` refuses a checkpoint directory holding an earlier
    run's files from the options alone."""

    @classmethod
    def preflight(cls, init_args: Mapping[str, Any], default_root_dir: str | None) -> None:
        check_checkpoint_dir(checkpoint_dir_of(init_args, default_root_dir), bool(init_args.get("overwrite")),
                             cls.OPTIONS.address)
