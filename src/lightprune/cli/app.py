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
import warnings
from pathlib import Path
from typing import Any

from lightprune.cli import quiet

if not quiet.is_verbose(sys.argv):  # before lightning, transformers and deepspeed print their import-time notices
    quiet.install()
else:  # ``import lightprune`` dropped them for the Python API: a verbose command shows them
    quiet.remove_filters()

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lightprune.cli.errors import condense, lightning_problem
from lightprune.cli.names import prints_config, subcommand
from lightprune.cli.options import Addressed, OptionError, addressed_help, missing_callback, split_addressed
from lightprune.cli.parser_settings import refuse_denied_imports, refuse_duplicate_yaml_keys
from lightprune.cli.staged_config import StagedConfig
from lightprune.cli.trainer import PruneTrainer, check_ckpt_path
from lightprune.core import interrupt
from lightprune.core.errors import ERRORS
from lightprune.core.extras import missing_deepspeed
from lightprune.core.jsonio import clip_values
from lightprune.core.parse_limits import DuplicateKeyError, ParseLimitError
from lightprune.finetune import MoECausalLM

__all__ = ["LightpruneCLI", "apply_addressed", "cli_main", "main"]


class LightpruneArgumentParser(LightningArgumentParser):
    """A bad option is one ``lightprune: error:`` line naming the option, its value and what it accepts (with the
    closest option's name); an option is never taken from a prefix of its name (``allow_abbrev``: off, here and in
    the parsers jsonargparse makes from this class)."""

    #: set on the command's own parsers (the main one and the subcommands'), not on those jsonargparse makes inside
    one_line = False
    #: the addressed options (``--prune.ratio 0.3``) of a command line that asks for ``--print_config``: the config
    #: printed holds them, as the run would use them (set on the command's own parsers)
    printed_addressed: tuple[Addressed, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def format_help(self) -> str:
        """The parser's help; a subcommand's also lists the addressed options (`addressed_help`)."""
        text = super().format_help()
        if self.one_line and "--trainer.callbacks" in self._option_string_actions:
            text = f"{text.rstrip()}\n\n{addressed_help()}\n"
        return text

    def dump(self, cfg: Any, *args: Any, **kwargs: Any) -> str:
        """The config as text; for ``--print_config``, with the addressed options set (`apply_addressed`)."""
        if self.printed_addressed:
            cfg = cfg.clone()
            subcommand = cfg.get("subcommand") if "subcommand" in cfg else None
            apply_addressed(cfg[subcommand] if subcommand else cfg, self.printed_addressed)
        return super().dump(cfg, *args, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        if not self.one_line or os.environ.get("LIGHTPRUNE_DEBUG"):
            return super().error(message, ex)
        if isinstance(ex, OptionError):  # said already
            raise ex
        duplicate = _duplicate_key(ex)
        prog = self.prog.replace(" [options]", "")
        line = clip_values(str(duplicate) if duplicate else
                           f"{condense(message, self._option_string_actions)} (`{prog} --help` lists the options)")
        if not self.exit_on_error:  # the Python API (lp.run_recipe): the console's line as an exception
            raise OptionError(line) from ex
        sys.stderr.write(f"lightprune: error: {line}\n")
        self.exit(2)


def _duplicate_key(err: BaseException | None) -> DuplicateKeyError | ParseLimitError | None:
    """The `DuplicateKeyError` (a value naming a key twice) or `ParseLimitError` (YAML past the
    limits) behind a parser error, or None."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, (DuplicateKeyError, ParseLimitError)):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


class LightpruneCLI(LightningCLI):
    """LightningCLI whose trainer also has ``calibrate`` and ``export``, and whose callbacks' options also have
    stable addresses (``addressed``: the ``--prune.ratio``-style options, see `lightprune.cli.options`)."""

    def __init__(self, *args: Any, addressed: list[Addressed] | tuple[Addressed, ...] = (), **kwargs: Any):
        kwargs.setdefault("parser_class", LightpruneArgumentParser)
        kwargs.setdefault("save_config_callback", StagedConfig)
        self.addressed = list(addressed)
        given = kwargs.get("args")  # the command line parsed: args, or sys.argv (a dict or Namespace prints nothing)
        self.printing = bool(self.addressed) and prints_config(
            list(given) if isinstance(given, (list, tuple)) else sys.argv[1:] if given is None else [])
        super().__init__(*args, **kwargs)

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        parser = super().init_parser(**kwargs)
        parser.one_line = True  # type: ignore[attr-defined]
        if self.printing:
            parser.printed_addressed = tuple(self.addressed)  # type: ignore[attr-defined]
        return parser

    def _parse_ckpt_path(self) -> None:
        """Lightning reads ``ckpt_path``'s hyperparameters here, as the command line is parsed, before the trainer
        runs: the file is checked first (`check_ckpt_path`), and one torch cannot load
        is a one-line ValueError naming it."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        check_ckpt_path(ckpt_path)
        try:
            with warnings.catch_warnings():  # torch's notice on the pickle protocol of bytes that are no checkpoint
                warnings.filterwarnings("ignore", message="Detected pickle protocol")
                super()._parse_ckpt_path()
        except Exception as err:  # torch.load of bytes it cannot read raises what its unpickler meets (IndexError, ...)
            first = (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".:")
            raise ValueError(f"Lightning checkpoint (ckpt_path) {str(ckpt_path)!r} cannot be loaded "
                             f"({type(err).__name__}: {first}); give the .ckpt file a run saved (ModelCheckpoint's), "
                             "or leave ckpt_path out to start afresh") from err

    def _dump_config(self) -> None:
        """Lightning's dump, with a job without top-level data (``lightprune export``) dumped as ``data: {}``: Lightning
        reads ``config_dump["data"]`` as a mapping when it builds any datamodule, such as Evaluate's own ``data``."""
        super()._dump_config()
        for key in ("model", "data"):
            if self.config_dump.get(key, {}) is None:
                self.config_dump[key] = {}

    def before_instantiate_classes(self) -> None:
        """Refuse a ``fit`` without training data (no data module, and a model without its own ``train_dataloader``);
        set each addressed option on the one callback of its class (a subclass counts) in the parsed config, then
        run each callback's ``preflight``
        ([`JobEndCallback.preflight`][lightprune.callbacks.job_end.JobEndCallback.preflight]: an existing output
        directory) before anything is built."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        if self.subcommand == "fit" and config.get("data") is None and not _has_own_train_data(config.get("model")):
            raise OptionError(lightning_problem("`train_dataloader` must be implemented", "fit"))
        apply_addressed(config, self.addressed)
        callbacks = config.trainer.callbacks or []
        for entry in callbacks if isinstance(callbacks, list) else [callbacks]:
            preflight = getattr(_callback_class(entry), "preflight", None)
            if preflight is not None:
                init_args = entry.init_args
                preflight(init_args.as_dict() if hasattr(init_args, "as_dict") else dict(vars(init_args)),
                          config.trainer.default_root_dir)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        return {
            **LightningCLI.subcommands(),
            "calibrate": {"model", "dataloaders", "datamodule"},
            "export": {"model", "datamodule"},
        }


def apply_addressed(config: Any, addressed: list[Addressed] | tuple[Addressed, ...]) -> None:
    """Set each addressed option (``--prune.ratio 0.3``) on the one callback of its class (a subclass counts) in a
    subcommand's parsed ``config``; none or several: an `OptionError` naming the option."""
    entries = (config.trainer.callbacks or []) if addressed else []
    for item in addressed:
        matches = [entry for entry in entries if _is_callback(entry, item.callback)]
        if len(matches) != 1:
            raise OptionError(missing_callback(item) if not matches else
                              f"{item.option}: the job has {len(matches)} {item.callback} callbacks; set the "
                              "option in the config file instead")
        try:
            matches[0].init_args[item.argument] = item.value
        except (KeyError, TypeError, AttributeError):  # a nested option of a class that is not given
            raise OptionError(f"{item.option}: {item.callback}'s {item.argument.split('.')[0]} is not given as a "
                              "class here; set it whole") from None


_PACKAGE = str(Path(__file__).resolve().parents[1])  # the lightprune package


def _callback_class(entry: Any) -> type | None:
    """The class of a parsed ``trainer.callbacks`` entry (class_path + init_args), None when it has none or it
    cannot be imported (the parser says so when it builds it)."""
    import importlib

    class_path = getattr(entry, "class_path", None)
    if not isinstance(class_path, str) or getattr(entry, "init_args", None) is None:
        return None
    module, _, attr = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr) if module else None
    except (ImportError, AttributeError):
        return None
    return cls if isinstance(cls, type) else None


def _has_own_train_data(model: Any) -> bool:
    """Whether the parsed ``model`` entry's class defines its own ``train_dataloader`` (True when it cannot tell)."""
    import lightning.pytorch as pl

    cls = _callback_class(model) if model is not None else None
    return cls is None or getattr(cls, "train_dataloader", None) is not pl.LightningModule.train_dataloader


def _is_callback(entry: Any, name: str) -> bool:
    """Whether a parsed ``trainer.callbacks`` entry (class_path + init_args) is lightprune's callback ``name``."""
    import lightprune.callbacks as callbacks

    cls = _callback_class(entry)
    return cls is not None and issubclass(cls, getattr(callbacks, name))


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


def _load_callback_classes() -> None:
    """Import lightprune's callbacks (its package imports them on first use), so that jsonargparse resolves a
    callback given by its class name (``--trainer.callbacks+=ReportPage``, ``class_path: Export``) as it does
    Lightning's own."""
    import lightprune.callbacks as callbacks

    for name in callbacks.__all__:
        getattr(callbacks, name)


def cli_main(args: list[str] | None = None, exit_on_error: bool = True) -> LightpruneCLI:
    """Parse ``args`` (default: ``sys.argv``), run the subcommand, return the CLI object. The callbacks' stable
    addresses (``--prune.ratio 0.3``, `lightprune.cli.options`) are taken out and set once the config is parsed.
    ``exit_on_error=False``: a parser error is an `OptionError` with the line the
    command prints, instead of that line and exit status 2.

    A lightprune error raised while the config's classes are built is re-raised as itself (type
    and message), not inside jsonargparse's "Does not validate against any of the Union subtypes".
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    if args is None:  # LightningCLI reads sys.argv itself (given args too, it warns): leave it the rest
        rest, addressed = split_addressed(sys.argv[1:])
        sys.argv[1:] = rest
    else:
        args, addressed = split_addressed(args)
    kwargs: dict[str, Any] = {"save_config_kwargs": {"overwrite": True},  # the command's name, however it runs
                              "parser_kwargs": {"prog": "lightprune", "exit_on_error": exit_on_error}}
    refuse_duplicate_yaml_keys()
    refuse_denied_imports()
    _load_callback_classes()
    try:
        return LightpruneCLI(MoECausalLM, None, trainer_class=PruneTrainer, subclass_mode_model=True,
                             subclass_mode_data=True, args=args, auto_configure_optimizers=False,
                             addressed=addressed, **kwargs)
    except ValueError as err:
        own = None if _raised_here(err) else _own_error(err)
        if own is None:
            raise
        raise own from None


def main() -> None:
    """Entry point of the ``lightprune`` console script.

    A bad input or an OS error (a ValueError, an OSError such as a read-only output or a full disk, Lightning's
    MisconfigurationException such as a ``fit`` without training data: `lightning_problem`,
    or one of lightprune's own errors: `lightprune.core.errors.ERRORS`) is reported in one line (long values cut:
    `clip_values`) and exit status 2; set ``LIGHTPRUNE_DEBUG=1`` to see the traceback. SIGTERM or SIGINT stop the run
    where it is, with one line saying what it was doing and what it kept, and exit status 143 or 130
    (`lightprune.core.interrupt`). Third-party notices that say nothing about the run are dropped
    (`lightprune.cli.quiet`); ``--verbose`` or ``LIGHTPRUNE_VERBOSE=1`` shows them.
    """
    if "--verbose" in sys.argv:  # read at import (lightprune.cli.quiet); not an option of the parser
        sys.argv.remove("--verbose")
        os.environ[quiet.VERBOSE_ENV] = "1"  # and by lightprune's own quiet steps (lightprune.core.notices)
    try:
        with interrupt.installed():
            try:
                cli_main()
            except (MisconfigurationException, ValueError) as err:  # a DeepSpeed strategy without deepspeed (also
                # inside the parser's Union error when built from a config file): name the extra
                missing = missing_deepspeed(err)
                if missing is None:
                    raise
                raise missing from None
    except (ValueError, OSError, MisconfigurationException, *ERRORS) as err:
        if os.environ.get("LIGHTPRUNE_DEBUG"):
            raise
        line = str(err)
        if isinstance(err, MisconfigurationException):
            line = lightning_problem(line, subcommand(sys.argv[1:]))
        line = _command_remedy(err, line)
        print(clip_values(f"lightprune: error: {line}"), file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as err:  # (only those said below; the rest raised again as they are)
        line = None if os.environ.get("LIGHTPRUNE_DEBUG") else _runtime_problem(err)
        if line is None:
            raise
        print(clip_values(f"lightprune: error: {line}"), file=sys.stderr)
        raise SystemExit(2) from None
    except interrupt.Interrupted as err:
        interrupt.exit_interrupted(err, subcommand(sys.argv[1:]))


#: the Python API's remedy for an output folder that holds files (:mod:`lightprune.checkpoints.staging`)
_API_REMEDY = "; pass overwrite=True to replace it"
#: the export callbacks' modules -> the callback (its options' address is the command's remedy)
_EXPORT_MODULES = {"lightprune/callbacks/export.py": "Export", "lightprune/callbacks/width_export.py": "WidthExport"}


def _command_remedy(err: BaseException, line: str) -> str:
    """``line`` with the Python API's "pass overwrite=True" replaced by the command's option (``--export.overwrite
    true``) where an export callback's staging found its checkpoint directory taken (a run racing to the same fresh
    folder: it was empty when the first pass checked it)."""
    if not isinstance(err, FileExistsError) or not line.endswith(_API_REMEDY):
        return line
    from lightprune.callbacks.export_dirs import checkpoint_dir_remedy
    from lightprune.callbacks.options import OPTIONS

    files = [Path(frame.filename).as_posix() for frame in traceback.extract_tb(err.__traceback__)]
    names = [name for module, name in _EXPORT_MODULES.items() if any(f.endswith(module) for f in files)]
    if len(names) != 1:
        return line
    return f"{line[:-len(_API_REMEDY)]}; {checkpoint_dir_remedy(OPTIONS[names[0]].address)}"


def _runtime_problem(err: Exception) -> str | None:
    """The one line for an error that is no ValueError or OSError but says what went wrong with a file: a write of
    `lightprune.core.paths.write_atomically` that failed in ``torch.save``'s writer (a RuntimeError naming the
    file), a checkpoint that Lightning's ``torch.load`` cannot read (``ckpt_path``: an UnpicklingError, a RuntimeError
    of its zip reader: the first line of what it says); None for anything else."""
    text = str(err).strip()
    if isinstance(err, RuntimeError) and text.startswith("could not write "):
        return text
    frames = traceback.extract_tb(err.__traceback__)
    files = [Path(frame.filename).as_posix() for frame in frames]
    if any(name.endswith("torch/serialization.py") for name in files) and \
            any(name.endswith("checkpoint_connector.py") for name in files):  # Lightning's load of ckpt_path
        first = (text.splitlines() or [type(err).__name__])[0].rstrip(".")
        return (f"the Lightning checkpoint (ckpt_path) cannot be loaded ({type(err).__name__}: {first}); give the "
                ".ckpt file a run saved (ModelCheckpoint's), or leave ckpt_path out to start afresh")
    return None


if __name__ == "__main__":
    main()
