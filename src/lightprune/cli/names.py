"""The command line's names known without Lightning: the subcommands, each one's options, the trainer's options.

`TRAINER_OPTIONS` is ``lightning.pytorch.Trainer.__init__``'s parameters, `METHOD_OPTIONS` the
parameters of each subcommand's trainer method that LightningCLI adds as options, and `PRECISIONS` the values
``Trainer(precision=...)`` takes, written out here so that the first pass
(`lightprune.cli.command_line_checks.check_command_line`) can refuse ``--trainer.max_step``, ``--confg`` or
``--trainer.precision 17-true`` without importing Lightning; ``tests/unit/cli/test_cli_names.py`` checks them against
the signatures and LightningCLI's parser. What sits under ``--model.`` and ``--data.`` depends on the class given and
is left to the parser. Every problem is one line, with the closest name when one is close (`did_you_mean`).
Torch-free.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable

__all__ = ["TRAINER_OPTIONS", "METHOD_OPTIONS", "MAIN_OPTIONS", "PRECISIONS", "BOOL_OPTIONS", "closest",
           "did_you_mean", "find_subcommand", "subcommand", "argv_problem", "config_keys_problem", "precision_problem", "wants_help",
           "prints_config", "bool_option"]

#: ``lightning.pytorch.Trainer.__init__``'s parameters, in order (``--trainer.NAME``; test_cli_names checks them)
TRAINER_OPTIONS: tuple[str, ...] = (
    "accelerator", "strategy", "devices", "num_nodes", "precision", "logger", "callbacks", "fast_dev_run",
    "max_epochs", "min_epochs", "max_steps", "min_steps", "max_time", "limit_train_batches", "limit_val_batches",
    "limit_test_batches", "limit_predict_batches", "overfit_batches", "val_check_interval", "check_val_every_n_epoch",
    "num_sanity_val_steps", "log_every_n_steps", "enable_checkpointing", "enable_progress_bar", "enable_model_summary",
    "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm", "deterministic", "benchmark",
    "inference_mode", "use_distributed_sampler", "profiler", "detect_anomaly", "barebones", "plugins",
    "sync_batchnorm", "reload_dataloaders_every_n_epochs", "default_root_dir", "enable_autolog_hparams",
    "model_registry",
)
#: each subcommand's options from its trainer method (``--ckpt_path``): the parameters LightningCLI does not skip
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "fit": ("ckpt_path", "weights_only"),
    "validate": ("ckpt_path", "verbose", "weights_only"),
    "test": ("ckpt_path", "verbose", "weights_only"),
    "predict": ("return_predictions", "ckpt_path", "weights_only"),
    "calibrate": ("ckpt_path",),
    "export": (),
}
#: what ``Trainer(precision=...)`` takes (``_PRECISION_INPUT`` of ``lightning.fabric.plugins.precision.precision``;
#: test_cli_names checks them): the names, their short aliases and the integers
PRECISIONS: tuple[Any, ...] = (
    "transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true", "bf16-mixed", "32-true",
    "64-true", "64", "32", "16", "bf16", 64, 32, 16,
)
#: the options that take true/false (their type holds ``bool``; test_cli_names checks them against the signatures):
#: "Trainer"'s, the subcommands' methods' ("methods": a config's top level) and lightprune's classes', by class name
BOOL_OPTIONS: dict[str, frozenset[str]] = {name: frozenset(options) for name, options in {
    "Trainer": ("logger", "fast_dev_run", "enable_checkpointing", "enable_progress_bar", "enable_model_summary",
                "deterministic", "benchmark", "inference_mode", "use_distributed_sampler", "detect_anomaly",
                "barebones", "sync_batchnorm", "enable_autolog_hparams"),
    "methods": ("weights_only", "verbose", "return_predictions"),
    "MoECausalLM": ("trust_remote_code", "load_in_4bit", "sequential"),
    "ExpertStats": ("resume",), "RouterDelta": (), "ExpertPruning": (),
    "Export": ("overwrite", "summary"), "WidthSearch": ("last_layer_first", "progress"), "WidthExport": ("overwrite",),
    "Evaluate": ("progress",), "ReportPage": (),
    "TextJsonlDataModule": ("mask_prompt", "add_eos", "progress"),
    "ImageTextJsonlDataModule": ("mask_prompt", "add_eos", "progress"),
    "DefaultCorpusDataModule": ("mask_prompt", "add_eos"), "ShapesQADataModule": ("mask_prompt", "progress"),
    "TestbedVQADataModule": ("mask_prompt", "progress"), "SyntheticTokens": (),
    "JsonlDataModule": ("mask_prompt", "progress"), "GeneratedQADataModule": ("mask_prompt", "progress"),
}.items()}
#: the options every subcommand has besides its method's, and what a config file's top level may name
_GROUPS = ("seed_everything", "trainer", "model", "data")
_CONFIG = ("--config", "-c")
_HELP = ("--help", "-h")
#: the options before the subcommand
MAIN_OPTIONS = ("--config", "--print_config", "--help")
#: config keys jsonargparse takes besides the options (a nested config file, an editor's JSON schema)
_CONFIG_KEYS = ("config", "$schema")


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``name`` (difflib, whatever the case), None when none is close."""
    folded = {k.lower(): k for k in reversed(list(known))}
    close = difflib.get_close_matches(name.lower(), list(folded), n=1, cutoff=0.75)
    return folded[close[0]] if close else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'X'?)`` for the known name closest to ``name``, or ``""`` when none is close."""
    close = closest(name, known)
    return f" (did you mean {close!r}?)" if close else ""


def wants_help(argv: list[str]) -> bool:
    """Whether the command line asks for help (the parser prints it, whatever else is given)."""
    return any(arg in _HELP for arg in argv)


def prints_config(argv: list[str]) -> bool:
    """Whether the command line asks for ``--print_config`` (nothing is built or written)."""
    return any(arg.split("=", 1)[0] == "--print_config" for arg in argv)


def _takes_value(head: str) -> bool:
    return head not in (*_HELP, "--print_config")


def find_subcommand(argv: list[str]) -> int | None:
    """The index of the subcommand in ``argv`` (the first argument that is not an option or an option's value)."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            return i
        i += 2 if "=" not in arg and _takes_value(arg) else 1
    return None


def subcommand(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (`find_subcommand`; ``--verbose`` is the ``lightprune`` command's own
    flag), or None."""
    args = [arg for arg in argv if arg != "--verbose"]
    at = find_subcommand(args)
    return None if at is None else args[at]


def _subcommand_options(command: str) -> list[str]:
    return [*MAIN_OPTIONS[:2], *("--" + name for name in (*_GROUPS, *METHOD_OPTIONS.get(command, ())))] + \
        [f"--trainer.{name}" for name in TRAINER_OPTIONS]


def _known(head: str, command: str) -> bool:
    """Whether ``head`` (``--name``, without ``=value``) is an option of ``command``'s parser."""
    if head in (*_HELP, *_CONFIG):
        return True
    name = head[2:] if head.startswith("--") else ""
    group, dot, rest = name.partition(".")
    if not dot:
        return head in MAIN_OPTIONS or name in (*_GROUPS, *METHOD_OPTIONS.get(command, ()))
    if group in ("model", "data"):  # the class given decides: left to the parser
        return True
    return group == "trainer" and rest.split(".", 1)[0].rstrip("+") in TRAINER_OPTIONS


def _unknown(head: str, known: list[str], where: str, advice: str) -> str:
    return f"{where} has no option {head!r}{did_you_mean(head, known)}; {advice}"


def argv_problem(argv: list[str], subcommands: Iterable[str], others: Iterable[str] = ()) -> str | None:
    """The first thing of ``argv`` (a ``lightprune`` command line, the callbacks' addressed options taken out) that
    no parser takes, as one line: an unknown subcommand, an option that none of the parsers has, ``--config`` without
    a value, an argument after the subcommand that is not an option; None when there is none. ``others``: the
    subcommands that are not LightningCLI's (their own parsers check them)."""
    subcommands, others = list(subcommands), list(others)
    at = find_subcommand(argv)
    i = 0
    while i < (len(argv) if at is None else at):  # the options before the subcommand
        head, eq, _ = argv[i].partition("=")
        if head not in (*_HELP, *_CONFIG, "--print_config"):
            later = f"; a subcommand's options go after it (lightprune SUBCOMMAND {head} ...)" \
                if any(_known(head, c) for c in subcommands) else ""
            return _unknown(head, list(MAIN_OPTIONS), "lightprune",
                            f"before the subcommand it takes {', '.join(MAIN_OPTIONS)}{later}")
        if head in _CONFIG and not eq:
            if i + 1 == len(argv):
                return f"{head} needs a value: a YAML config file (configs/ holds the recipes)"
            i += 1
        i += 1
    if at is None:
        return None
    command = argv[at]
    if command in others:
        return None
    if command not in subcommands:
        every = [*subcommands, *others]
        return (f"{command!r} is not a subcommand of lightprune{did_you_mean(command, every)}; the subcommands: "
                f"{', '.join(every)}")
    known = _subcommand_options(command)
    i = at + 1
    while i < len(argv):
        arg = argv[i]
        head, eq, _ = arg.partition("=")
        if not arg.startswith("-"):
            config = " (a config file is given as --config FILE)" if arg.endswith((".yaml", ".yml", ".json")) else ""
            return f"`lightprune {command}` takes options only, not {arg!r}{config}"
        if not _known(head, command):
            return _unknown(head, known, f"`lightprune {command}`", f"`lightprune {command} --help` lists them")
        if not eq and _takes_value(head):
            if i + 1 == len(argv) or (argv[i + 1].startswith("--") and _known(argv[i + 1].split("=")[0], command)):
                what = ": a YAML config file (configs/ holds the recipes)" if head in _CONFIG else ""
                return f"{head} needs a value{what}"
            i += 1
        i += 1
    return None


def precision_problem(value: Any) -> str | None:
    """Why ``value`` cannot be ``trainer.precision`` (with the closest of `PRECISIONS` and the list), or None."""
    if value is None or (value in PRECISIONS and not isinstance(value, (bool, float))):
        return None
    names = [p for p in PRECISIONS if isinstance(p, str) and not p.isdigit()]
    hint = did_you_mean(value, names) if isinstance(value, str) else ""
    return f"precision {value!r} is not one Lightning takes{hint}; it takes {', '.join(names)} (or 64, 32, 16)"


def config_keys_problem(content: dict[str, Any], command: str, where: str) -> str | None:
    """A key of a config file's top level, or of its ``trainer`` mapping, that ``command`` has no option for."""
    top = (*_GROUPS, *METHOD_OPTIONS.get(command, ()), *_CONFIG_KEYS)
    for key in content:
        if key not in top:
            return (f"{where}: {key!r} is not an option of `lightprune {command}`{did_you_mean(str(key), top)}; "
                    f"its top-level keys: {', '.join(k for k in top if k not in _CONFIG_KEYS)}")
    trainer = content.get("trainer")
    for key in trainer if isinstance(trainer, dict) else ():
        if key not in TRAINER_OPTIONS:
            return (f"{where}: trainer.{key} is not an option of the trainer{did_you_mean(str(key), TRAINER_OPTIONS)}"
                    f"; `lightprune {command} --help` lists them")
    return None


def bool_option(path: tuple[Any, ...], config: Any) -> bool | None:
    """Whether the value at ``path`` of a ``config`` mapping is an option that takes true/false: True or False where
    `BOOL_OPTIONS` tells (a config's top level, ``trainer``, an argument of lightprune's classes, a value inside
    an option's value: no option), None where it cannot (an argument of a class outside lightprune)."""
    if not path or not isinstance(path[-1], str):
        return False
    owner, name = path[:-1], path[-1]
    if not owner:
        return name in BOOL_OPTIONS["methods"]
    if owner == ("trainer",):
        return name in BOOL_OPTIONS["Trainer"]
    if owner[-1] != "init_args":  # inside an option's value (a mapping such as tiny_overrides), or no class entry
        return False
    entry: Any = config
    for part in owner[:-1]:
        try:
            entry = entry[part]
        except (KeyError, IndexError, TypeError):
            return None
    class_path = entry.get("class_path") if isinstance(entry, dict) else None
    if class_path is None and owner[:-1] == ("model",):
        class_path = "MoECausalLM"  # the command's model class, unless another is given
    cls = class_path.rsplit(".", 1)[-1] if isinstance(class_path, str) else None
    lightprune = isinstance(class_path, str) and (class_path.startswith("lightprune.") or "." not in class_path)
    return name in BOOL_OPTIONS[cls] if lightprune and cls in BOOL_OPTIONS else None
