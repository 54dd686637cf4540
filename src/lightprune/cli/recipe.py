"""One call for a whole recipe from Python (a notebook, a script): what ``lightprune COMMAND --config ...`` does.

    run_dir = lp.run_recipe("configs/reap_testbed.yaml", overrides={"prune.ratio": 0.25})
    plan = lp.ExpertPlan.load(run_dir / "plan.json")

The recipe is a config file or the same content as a mapping; ``overrides`` are the command line's options without their
dashes (``"prune.ratio"``, ``"trainer.max_steps"``, ``"model.init_args.checkpoint"``), checked as the command checks
them (`lightprune.cli.command_line_checks.check_command_line`) before anything is built. The command is the one
the recipe's callbacks imply unless given (`recipe_command`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from lightprune.cli.command_line_checks import check_command_line
from lightprune.cli.options import ADDRESSES, SUBCOMMANDS, OptionError, class_name
from lightprune.core.checks import check_choice
from lightprune.core.jsonio import show
from lightprune.core.strict_yaml import parse_yaml

__all__ = ["run_recipe", "recipe_command"]

#: options that print and exit instead of running (the parser's ``--help`` and ``--print_config``)
_EXITING = ("help", "h", "print_config")
#: the command a recipe's callbacks imply: calibration statistics -> calibrate; a fit's score or search -> fit
_IMPLIED = {"ExpertStats": "calibrate", "RouterDelta": "fit", "WidthSearch": "fit"}


def _load(config: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    if not isinstance(config, (str, os.PathLike)):
        raise TypeError(f"a recipe is a config file's path or its content as a mapping, got a {type(config).__name__}")
    text = str(config)
    if "\n" in text or text.lstrip().startswith(("{", "[")) or len(text) > 4096:
        shown = repr(text) if len(text) <= 60 else f"{text[:57]!r}..."
        raise FileNotFoundError(f"recipe {shown} is no file's name but text: a recipe is a config file's "
                                "path, or its content as a mapping (yaml.safe_load the text first)")
    path = Path(config)
    if not path.is_file():
        raise FileNotFoundError(f"recipe {text!r} does not exist (a recipe is a config file's path, or its "
                                "content as a mapping)")
    content = parse_yaml(path.read_text(), f"recipe {str(config)!r}") or {}
    if not isinstance(content, dict):
        raise ValueError(f"recipe {str(config)!r} is not a mapping of options")
    return content


def recipe_command(config: str | os.PathLike | Mapping[str, Any]) -> str:
    """The command a recipe is run with: ``calibrate`` with ExpertStats (statistics from forward passes), ``fit``
    with RouterDelta or WidthSearch (they score a fit), else ``export`` (weights only). Callbacks implying two
    commands are an error asking for one."""
    callbacks = ((_load(config).get("trainer") or {}).get("callbacks")) or []
    names = [class_name(c.get("class_path") if isinstance(c, Mapping) else c) for c in callbacks]
    implied = sorted({_IMPLIED[n] for n in names if n in _IMPLIED})
    if len(implied) > 1:
        raise ValueError(f"the recipe's callbacks imply the commands {implied}; give command= one of them")
    return implied[0] if implied else "export"


def _flattened(overrides: Mapping[Any, Any]) -> dict[Any, Any]:
    """``overrides`` with a callback's options given as a mapping under its address (``{"prune": {"ratio": 0.25}}``,
    there being no ``--prune`` option) spelled out as its options (``"prune.ratio": 0.25``); other values as given."""
    flat: dict[Any, Any] = {}
    for key, value in overrides.items():
        if key in ADDRESSES and isinstance(value, Mapping):
            for name, item in value.items():
                if not isinstance(name, str) or not name:
                    raise ValueError(f"overrides[{key!r}]: the keys are {key}'s option names (for example "
                                     f"'ratio'), got {name!r}")
                flat[f"{key}.{name}"] = item
        else:
            flat[key] = value
    return flat


def _option_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def run_recipe(config: str | os.PathLike | Mapping[str, Any], command: str | None = None,
               overrides: Mapping[str, Any] | None = None) -> Path:
    """Run ``config`` (a config file, or its content as a mapping) as ``lightprune COMMAND --config CONFIG --KEY
    VALUE ...`` would, in this process, and return the run directory (``trainer.default_root_dir``: plan.json,
    report.json, the checkpoint in ``model/``, ...). ``command``: default `recipe_command`. ``overrides``:
    ``{"prune.ratio": 0.25, "trainer.max_steps": 10}``, values as Python objects (lists, None, bools) or strings.
    A bad option, a bad config and anything the parser refuses is an `OptionError`
    (a ValueError) with the line the command prints, never ``SystemExit``; a failing job raises what the command
    would report. ``help`` and ``print_config`` print and exit on the command line: refused as overrides."""
    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError(f"overrides is a mapping of option names to values ({{'prune.ratio': 0.25}}), got a "
                        f"{type(overrides).__name__}: {show(overrides, 60)}")
    overrides = _flattened(overrides or {})
    command = recipe_command(config) if command is None else command
    check_choice("command", command, SUBCOMMANDS)
    content = _load(config)
    source = json.dumps(content) if isinstance(config, Mapping) else str(config)
    argv = [command, "--config", source]
    for key, value in overrides.items():
        if not isinstance(key, str) or not key or key.startswith("-"):
            raise ValueError(f"overrides keys are option names without dashes (for example 'prune.ratio'), "
                             f"got {key!r}")
        if key in _EXITING:
            raise OptionError(f"overrides: {key!r} prints and exits (`lightprune {command} --{key}` on the command "
                              "line); it runs nothing")
        argv += [f"--{key}", _option_value(value)]
    check_command_line(argv)
    trainer = content.get("trainer")
    callbacks = trainer.get("callbacks") if isinstance(trainer, Mapping) else None
    if command in ("export", "calibrate") and not callbacks and \
            not any(isinstance(key, str) and key.startswith("trainer.callbacks") for key in overrides):
        raise OptionError(f"the recipe has no callbacks (trainer.callbacks): nothing would be pruned or written by "
                          f"`{command}`; list them (ExpertPruning and Export, for example: see "
                          "configs/aimer_tiny.yaml)")
    from lightprune.cli.app import cli_main

    saved, sys.argv = sys.argv, sys.argv[:1]  # a notebook's own arguments are not the recipe's
    try:
        cli = cli_main(argv, exit_on_error=False)
    finally:
        sys.argv = saved
    return Path(cli.trainer.default_root_dir)
