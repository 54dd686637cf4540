"""The ``lightprune`` command: LightningCLI with ``calibrate`` and ``export`` beside fit/validate/test.

    lightprune export --config configs/aimer.yaml --model.init_args.checkpoint path/to/checkpoint
    lightprune fit --config configs/...yaml

The working directory is put first on ``sys.path`` so project-local criteria and callbacks
(for example the top-level ``callbacks/`` folder) can be named by ``class_path`` in a config.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

from lightprune import quiet

if not quiet.is_verbose(sys.argv):  # before lightning, transformers and deepspeed print their import-time notices
    quiet.install()

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightprune.cli_errors import condense
from lightprune.errors import ERRORS
from lightprune.extras import missing_deepspeed
from lightprune.finetune import MoECausalLM
from lightprune.trainer import PruneTrainer

__all__ = ["LightpruneCLI", "cli_main", "main"]


class LightpruneArgumentParser(LightningArgumentParser):
    """A bad option is one ``lightprune: error:`` line naming the option, its value and what it accepts."""

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or os.environ.get("LIGHTPRUNE_DEBUG"):
            return super().error(message, ex)
        prog = self.prog.replace(" [options]", "")
        sys.stderr.write(f"lightprune: error: {condense(message)} (`{prog} --help` lists the options)\n")
        self.exit(2)


class LightpruneCLI(LightningCLI):
    """LightningCLI whose trainer also has ``calibrate`` and ``export``."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("parser_class", LightpruneArgumentParser)
        super().__init__(*args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {
            **LightningCLI.subcommands(),
            "calibrate": {"model", "dataloaders", "datamodule"},
            "export": {"model", "datamodule"},
        }


_PACKAGE = str(Path(__file__).resolve().parent)


def _raised_here(err: BaseException) -> bool:
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and str(Path(frames[-1].filename).resolve()).startswith(_PACKAGE)


def _own_error(err: BaseException) -> BaseException | None:
    """The lightprune error that jsonargparse wrapped into ``err`` while instantiating a class, or None.

    jsonargparse reports a failed ``__init__`` of a ``class_path`` (for example MoECausalLM's
    "checkpoint directory ... does not exist") as a ValueError "Does not validate against any of
    the Union subtypes", listing the real error beside "Expected a NoneType" and a dump of every
    init arg, and losing its type (FileNotFoundError becomes ValueError).
    """
    cause = err.__cause__
    while cause is not None:
        if _raised_here(cause):
            return cause
        cause = cause.__cause__
    return None


def cli_main(args: list[str] | None = None) -> LightpruneCLI:
    """Parse ``args`` (default: ``sys.argv``), run the subcommand, return the CLI object.

    A lightprune error raised while the config's classes are built is re-raised as itself (type
    and message), not inside jsonargparse's "Does not validate against any of the Union subtypes".
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    kwargs: dict[str, Any] = {"save_config_kwargs": {"overwrite": True}}
    try:
        return LightpruneCLI(MoECausalLM, None, trainer_class=PruneTrainer, subclass_mode_model=True,
                             subclass_mode_data=True, args=args, auto_configure_optimizers=False, **kwargs)
    except ValueError as err:
        own = None if _raised_here(err) else _own_error(err)
        if own is None:
            raise
        raise own from None


def main() -> None:
    """Entry point of the ``lightprune`` console script.

    A bad input or an OS error (a ValueError, an OSError such as a read-only output or a full disk, or one of
    lightprune's own errors: :data:`lightprune.errors.ERRORS`) is reported in one line and exit status 2; set
    ``LIGHTPRUNE_DEBUG=1`` to see the traceback. Third-party notices that say nothing about the run are dropped
    (:mod:`lightprune.quiet`); ``--verbose`` or ``LIGHTPRUNE_VERBOSE=1`` shows them.
    """
    if "--verbose" in sys.argv:  # read at import (lightprune.quiet); not an option of the parser
        sys.argv.remove("--verbose")
    try:
        try:
            cli_main()
        except (MisconfigurationException, ValueError) as err:  # a DeepSpeed strategy without deepspeed (also
            # inside the parser's Union error when built from a config file): name the extra
            missing = missing_deepspeed(err)
            if missing is None:
                raise
            raise missing from None
    except (ValueError, OSError, *ERRORS) as err:
        if os.environ.get("LIGHTPRUNE_DEBUG"):
            raise
        print(f"lightprune: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
