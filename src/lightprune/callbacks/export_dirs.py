"""Where an export callback (Export, WidthExport) writes its checkpoint, and the refusals of a checkpoint directory
from the callback's options alone: one that holds an earlier run's files, one that is (or holds, or lies inside a file
of) the run's own folder, a ``plan_path`` that is no file. Torch-free, so that the ``lightprune`` command refuses them
before Lightning is imported (`lightprune.cli.command_line_checks.check_command_line`), and the callbacks'
``preflight`` and ``check`` alike. Every path option takes ``~`` for the home directory, as ``trainer.default_root_dir``
does."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lightprune.checkpoints.staging import check_out_dir
from lightprune.core.paths import broken_link, file_problem

__all__ = ["RUN_FILES", "WritesCheckpoint", "check_checkpoint_dir", "checkpoint_dir_remedy", "check_checkpoint_place",
           "checkpoint_dir_of",
           "check_plan_path", "folder_of"]

#: what a run writes into its folders besides the checkpoint: lightprune's run files, the command's config.yaml and
#: Lightning's logs and checkpoints (a checkpoint directory inside one of them would be replaced by it, or replace it)
RUN_FILES = ("config.yaml", "plan.json", "scores.json", "merge_plan.json", "report.json", "report.md",
             "kept_experts.png", "calibration.json", "width_plan.json", "search.json", "candidates", "checkpoints",
             "lightning_logs")


def folder_of(output_dir: str | os.PathLike | None, default_root_dir: str | os.PathLike | None) -> Path:
    """A callback's run folder, absolute, for comparing folders: ``output_dir``, else ``default_root_dir`` (None: the
    working directory, as Lightning's), ``~`` expanded, links resolved. A ``~user`` of no user, a symlink loop or a
    name too long: a ValueError in one line naming the folder."""
    folder = output_dir or default_root_dir or os.getcwd()
    try:
        return _expanded(folder).resolve()
    except (RuntimeError, OSError) as err:  # pathlib's "Symlink loop from ...", ENAMETOOLONG
        why = "it is a symlink loop" if isinstance(err, RuntimeError) or getattr(err, "errno", None) == errno.ELOOP \
            else (err.strerror or str(err)).lower()
        raise ValueError(f"{str(folder)!r} cannot be used as a folder: {why}; give another folder") from None


def _expanded(path: str | os.PathLike) -> Path:
    """``path`` with ``~`` expanded; ``~user`` of no user (or ``~`` without a home folder): a ValueError naming it."""
    try:
        return Path(path).expanduser()
    except RuntimeError:  # pathlib's "Could not determine home directory."
        raise ValueError(f"{str(path)!r}: {str(path).split('/', 1)[0]!r} names no home folder on this machine (no "
                         "such user); write the folder out") from None


def checkpoint_dir_of(init_args: Mapping[str, Any], default_root_dir: str | os.PathLike | None) -> Path:
    """An export callback's checkpoint directory from its options and the trainer's ``default_root_dir`` (None: the
    working directory, as Lightning's): ``checkpoint_dir``, else ``<output_dir or default_root_dir>/model``; ``~``
    expanded."""
    if init_args.get("checkpoint_dir"):
        return _expanded(init_args["checkpoint_dir"])
    return _expanded(init_args.get("output_dir") or default_root_dir or os.getcwd()) / "model"


def check_checkpoint_dir(path: Path, overwrite: bool, address: str) -> None:
    """Refuse a checkpoint directory holding an earlier run's files unless ``overwrite``, saying how to replace it
    (``--<address>.overwrite true`` on the command line, ``overwrite: true`` in the config)."""
    check_out_dir(path, overwrite, remedy=checkpoint_dir_remedy(address))


def checkpoint_dir_remedy(address: str) -> str:
    """How the command's user replaces an export callback's checkpoint directory that holds files (``address``:
    the callback's, ``export``)."""
    return (f"replace it with --{address}.overwrite true (overwrite: true in the config), or choose another "
            "--trainer.default_root_dir")


def check_checkpoint_place(path: Path, folders: Iterable[Path], address: str) -> None:
    """Refuse (``ValueError``, one line) a checkpoint directory ``path`` that is one of the run's ``folders`` (absolute:
    `folder_of`), holds one, or lies inside a file or folder the run writes there (`RUN_FILES`): the
    export replaces its directory whole, so the run's config.yaml, plan.json and report.json would go with it. Whatever
    ``overwrite`` says: ``<folder>/model`` (the default) or a folder elsewhere is the place for it."""
    ckpt = folder_of(path, None)
    remedy = (f"choose another --{address}.checkpoint_dir (checkpoint_dir: in the config; by default the checkpoint "
              "goes to <run folder>/model)")
    for folder in sorted(set(folders)):
        if ckpt == folder:
            raise ValueError(f"{address}.checkpoint_dir {str(path)!r} is the run's folder, where it writes its "
                             f"config.yaml, plan.json and report.json: the export would replace them; {remedy}")
        if ckpt in folder.parents:
            raise ValueError(f"{address}.checkpoint_dir {str(path)!r} holds the run's folder {str(folder)!r}: the "
                             f"export replaces its directory whole and would delete the run's files; {remedy}")
        if folder in ckpt.parents and ckpt.relative_to(folder).parts[0] in RUN_FILES:
            name = ckpt.relative_to(folder).parts[0]
            raise ValueError(f"{address}.checkpoint_dir {str(path)!r} is the run's {name} in {str(folder)!r}, or "
                             f"inside it; {remedy}")


def check_plan_path(plan_path: str | os.PathLike) -> str:
    """``plan_path`` with ``~`` expanded, when it is a file; else an OSError whose message says what is there
    (``plan_path: '/x' does not exist``): IsADirectoryError for a directory, FileNotFoundError when nothing is there or
    for a dangling symlink, OSError (EINVAL; ELOOP for a symlink loop) for a special file such as a FIFO, in the
    words of `file_problem`."""
    path = Path(plan_path).expanduser()
    if path.is_dir():
        raise IsADirectoryError(f"plan_path: {str(plan_path)!r} is a directory, not a plan file: name the plan.json "
                                "(or merge_plan.json) in it")
    problem = file_problem(path)
    if problem is not None:
        cls, why = problem
        error = (cls if issubclass(cls, OSError) else OSError)(f"plan_path: {str(plan_path)!r} {why}: name the plan "
                                                               "file itself")
        if not issubclass(cls, OSError):  # a symlink loop, a special file: the OSError the CLI reports in one line
            link = broken_link(path)
            error.errno = errno.ELOOP if link is not None and link[0] == "loop" else errno.EINVAL
        raise error
    if not path.is_file():
        raise FileNotFoundError(f"plan_path: {str(plan_path)!r} does not exist")
    return str(path)


class WritesCheckpoint:
    """Mixin of the export callbacks (``OPTIONS``: their option spec, ``output_dir`` / ``checkpoint_dir`` /
    ``overwrite`` among their options): their ``preflight`` refuses, from the options alone, a checkpoint directory
    that is the run's folder (or holds it), then one holding an earlier run's files."""

    @classmethod
    def preflight(cls, init_args: Mapping[str, Any], default_root_dir: str | None) -> None:
        path = checkpoint_dir_of(init_args, default_root_dir)
        folders = {folder_of(None, default_root_dir), folder_of(init_args.get("output_dir"), default_root_dir)}
        check_checkpoint_place(path, folders, cls.OPTIONS.address)
        check_checkpoint_dir(path, bool(init_args.get("overwrite")), cls.OPTIONS.address)
