"""Which of lightprune's callbacks one run may list together, from their options alone: [`check_roster`][].

Torch-free, so that the ``lightprune`` command checks a job's callbacks list before Lightning is imported
(`lightprune.cli.command_line_checks.check_command_line`), and every lightprune callback's ``setup`` checks the
trainer's list before any work (`lightprune.callbacks.state.RunState.check_callbacks`). The rules:

- once per run (`ONCE` says why): ExpertStats, RouterDelta, Export, WidthExport, WidthSearch;
- one per folder (`PER_FOLDER`): ExpertPruning and Evaluate. Several ExpertPruning score several criteria
  in one run, each writing plan.json and scores.json into its own ``output_dir``; the plan the run then applies
  (Export) and measures after pruning (Evaluate) is the one written into Export's folder (without an Export:
  Evaluate's), so one of them must write there;
- with Export's ``plan_path`` the plan applied is that file's: no ExpertPruning selects one, and the run's
  plan.json is the file's plan; WidthExport's ``plan_path`` and a WidthSearch are refused together (the search's
  fit would choose a plan that is not the one exported, and write it as the run's width_plan.json);
- an export's checkpoint directory is none of the run's folders, holds none and lies inside no file the run writes
  (`check_checkpoint_place`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightprune.callbacks.export_dirs import check_checkpoint_place, checkpoint_dir_of, folder_of

__all__ = ["ONCE", "PER_FOLDER", "Roster", "check_roster"]

#: callbacks a run lists once, and why a second conflicts
ONCE: dict[str, str] = {
    "ExpertStats": "one ExpertStats collects every statistic (list all the subsets and criteria in it)",
    "RouterDelta": "one RouterDelta scores the run's one adapter fit",
    "Export": "one Export prunes and exports the model (a second would prune the pruned model again)",
    "WidthExport": "one WidthExport exports the width-pruned model",
    "WidthSearch": "one WidthSearch drives the fit's search",
}
#: callbacks a run lists once per folder, and what a second in the same folder would replace
PER_FOLDER: dict[str, str] = {"ExpertPruning": "plan.json and scores.json", "Evaluate": "evaluation in report.json"}
#: the export callbacks, by the option address their checkpoint directory is named with
_EXPORTS = {"Export": "export", "WidthExport": "width_export"}


@dataclass(frozen=True)
class Roster:
    """What [`check_roster`][] found: ``plan_folder``, the folder whose ExpertPruning gives the run's plan when
    several select one (None: one or none does); ``plan_file``, Export's ``plan_path`` (the plan applied)."""

    plan_folder: Path | None = None
    plan_file: Path | None = None


def _path(value: Any) -> str | None:
    return os.fspath(value) if isinstance(value, (str, os.PathLike)) and os.fspath(value) else None


def check_roster(callbacks: Sequence[tuple[str, Mapping[str, Any]]], default_root_dir: Any) -> Roster:
    """Check a run's lightprune callbacks, each ``(class name, options)`` in list order (other callbacks left out;
    ``options`` as given: ``output_dir``, ``checkpoint_dir``, ``plan_path`` are read), against the rules of the module
    docstring; ``default_root_dir`` is the trainer's (None: the working directory). Raises ``ValueError`` in one line
    naming the callback and what to do."""
    root = _path(default_root_dir)
    entries = [(name, {key: _path(options.get(key)) for key in ("output_dir", "checkpoint_dir", "plan_path")})
               for name, options in callbacks]
    for name, why in ONCE.items():
        count = sum(1 for entry, _ in entries if entry == name)
        if count > 1:
            raise ValueError(f"{name} is listed {count} times in trainer.callbacks: {why}; keep one")
    folders: dict[str, dict[Path, int]] = {name: {} for name in PER_FOLDER}
    for name, options in entries:
        if name in PER_FOLDER:
            folder = folder_of(options["output_dir"], root)
            if folder in folders[name]:
                raise ValueError(f"{name} is listed twice writing into {str(folder)!r}: the second's "
                                 f"{PER_FOLDER[name]} would replace the first's; keep one, or give each its own "
                                 "output_dir")
            folders[name][folder] = len(folders[name])
    run_folders = {folder_of(None, root)} | {folder_of(options["output_dir"], root) for _, options in entries}
    for name, options in entries:
        if name in _EXPORTS:
            check_checkpoint_place(checkpoint_dir_of(options, root), run_folders, _EXPORTS[name])
    if any(name == "WidthExport" and options["plan_path"] for name, options in entries) and \
            any(name == "WidthSearch" for name, _ in entries):
        raise ValueError("WidthExport's plan_path and a WidthSearch conflict: the search's fit would choose a plan "
                         "that is not the one exported (and write it as the run's width_plan.json); drop the "
                         "WidthSearch to export a saved plan, or plan_path to export the search's choice")
    plan_file = next((Path(options["plan_path"]).expanduser() for name, options in entries
                      if name == "Export" and options["plan_path"]), None)
    selecting = folders["ExpertPruning"]
    if plan_file is not None or len(selecting) < 2:
        return Roster(plan_file=plan_file)
    consumer = next((name for name in ("Export", "Evaluate") if any(entry == name for entry, _ in entries)), None)
    if consumer is None:
        return Roster()
    folder = folder_of(next(options["output_dir"] for name, options in entries if name == consumer), root)
    if folder not in selecting:
        raise ValueError(f"{consumer} takes the plan of the ExpertPruning writing into its folder {str(folder)!r}, "
                         f"and none of the {len(selecting)} ExpertPruning callbacks (writing into "
                         f"{', '.join(repr(str(f)) for f in selecting)}) does: set one's output_dir to that folder, "
                         f"or {consumer}'s output_dir to one of theirs")
    return Roster(plan_folder=folder)
