"""The checks the command line runs before it loads Lightning: `check_command_line`.

It reads the command line and the config files it names (YAML only: no torch, no Lightning) and checks the options
lightprune's callbacks would refuse at construction: an unknown option name, a criterion that is not registered, a
ratio outside [0, 1), a choice outside its list. The checks are the ones the callbacks' constructors run (their option
specs), so the messages are the callbacks' own and a typo is reported in a fraction of a second instead of after
Lightning's import. Whatever it cannot see (a value set in a way it does not follow) is left to the callbacks. Before
those it refuses what no parser would take (`lightprune.cli.names`: a mistyped subcommand or option, a config key
that is no option), a ``--config`` that is no config, a run directory that cannot be one
(`lightprune.cli.inputs`) and a ``class_path`` outside what its slot accepts, before importing it
(`lightprune.cli.slots`), a value YAML 1.1 reads otherwise than written (``020`` is 16:
`lightprune.cli.inputs.literal_problem`), an empty item in a list of classes, and a path that is not UTF-8 text
(`lightprune.core.paths.check_path_text`).

The callbacks' addressed options (``--prune.ratio 0.3``) and their option specs are `lightprune.cli.options`.
"""

from __future__ import annotations

from typing import Any, Iterable

from lightprune.callbacks.options import OPTIONS
from lightprune.cli.config_order import config_order_problem
from lightprune.cli.inputs import (
    JobInputs,
    empty_item_problem,
    load_config,
    root_dir_problem,
    unknown_home,
    variable_in,
)
from lightprune.cli.names import (
    argv_problem,
    config_keys_problem,
    find_subcommand,
    precision_problem,
    prints_config,
    wants_help,
)
from lightprune.cli.options import (
    ARGUMENTS,
    SUBCOMMANDS,
    Addressed,
    OptionError,
    check_callback_options,
    class_name,
    missing_callback,
    split_addressed,
    yaml_value,
)
from lightprune.cli.slots import class_path_problem, config_slots
from lightprune.core.paths import check_path_text

__all__ = ["check_command_line"]

#: the trainer's run directory on the command line (the export callbacks' checkpoint directory is under it)
_ROOT_OPTION = "--trainer.default_root_dir"
_PRECISION_OPTION = "--trainer.precision"
#: the export callbacks whose checkpoint directory is refused here when it holds an earlier run's files
_EXPORTS = ("Export", "WidthExport")


def _option_path(head: str) -> tuple[Any, ...]:
    """Where a ``--trainer...`` / ``--model...`` / ``--data...`` option's value goes in a config."""
    if head == "--trainer.callbacks+":
        return "trainer", "callbacks", 0
    return tuple(head[2:].split("."))


def _config_options(argv: list[str]) -> list[tuple[str, Any]]:
    """The ``--config`` files' contents and the ``--trainer.callbacks...``, ``--trainer.default_root_dir``,
    ``--trainer.precision``, ``--model...`` and ``--data...`` options, in command-line order."""
    items: list[tuple[str, Any]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        head, eq, text = arg.partition("=")
        if (head in ("--config", "-c") or head.startswith(("--trainer.callbacks", "--model", "--data"))
                or head in (_ROOT_OPTION, _PRECISION_OPTION)):
            if not eq:
                if i + 1 >= len(argv):
                    break
                i += 1
                text = argv[i]
            if head in ("--config", "-c"):  # a file, or the config's content itself (jsonargparse takes both)
                try:
                    items.append(load_config(text, head))
                except ValueError as err:  # not a config (no file, not a mapping, ...), a key named twice, a bomb:
                    raise OptionError(str(err)) from None  # none reaches jsonargparse
            else:
                items.append((head, yaml_value(text, head, _option_path(head))))
        i += 1
    return items


def _project_modules(argv: list[str], configs: list[Any]) -> bool:
    """Whether the job names a class outside lightprune and Lightning (a module that could register criteria)."""
    paths: list[str] = [a.partition("=")[2] for a in argv if a.startswith("--trainer.callbacks+=")]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "class_path" and isinstance(value, str):
                    paths.append(value)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for config in configs:
        walk(config)
    return any("." in p and not p.startswith(("lightprune.", "lightning.", "pytorch_lightning.")) for p in paths)


def check_command_line(argv: Iterable[str], others: Iterable[str] = ()) -> None:
    """Check a ``lightprune SUBCOMMAND ...`` command line (see the module docstring); an `OptionError` names
    the option or the config file, the bad value and what is accepted. ``others``: subcommands outside LightningCLI
    (named by the check of a mistyped subcommand)."""
    argv = list(argv)
    rest, addressed = split_addressed(argv)
    at = find_subcommand(rest)
    helping = wants_help(rest)  # the parser prints the help, whatever else is given: only the subcommand is checked
    problem = argv_problem(rest[:at + 1] if helping and at is not None else rest, SUBCOMMANDS, others)
    if problem:
        raise OptionError(problem)
    if helping:
        return
    # the subcommand whose options a config's keys are, unless a config is given before it (keyed by subcommand)
    command = None if at is None or any(a.split("=", 1)[0] in ("--config", "-c") for a in rest[:at]) else rest[at]
    items = _config_options(rest[:at] if at is not None else rest)
    if at is not None:  # a config before the subcommand: keyed by subcommand, its section of this one read
        for where, content in items:
            _check_keyed_by_subcommand(where, content, rest[at])
        items = [(where, _section(content, rest[at])) for where, content in items]
    items += _config_options(rest[at:]) if at is not None else []
    if not prints_config(rest):  # printed, the config shows what the run would take: nothing is lost unseen
        problem = config_order_problem(rest[at + 1:] if at is not None else rest)
        if problem:
            raise OptionError(problem)
    criteria_known = not _project_modules(rest, [content for _, content in items])
    # the list jsonargparse would build, each entry with its options so far (None: not followed), the trainer's
    # run directory, and whether everything that places an export's checkpoint directory is seen here
    callbacks: list[dict[str, Any]] | None = []
    root: Any = None
    root_where: str | None = None  # where the run directory was set (None: not set, or a config not read since)
    inputs = JobInputs()  # the files the model and the data read
    placed = True
    for where, content in items:
        if where == _ROOT_OPTION:
            root, root_where = content, where
            continue
        if where == _PRECISION_OPTION:
            _check_precision(where, content)
            continue
        if where.startswith(("--model", "--data")):
            if where.removesuffix(".class_path") in ("--model", "--data"):
                _check_slot(where, content, where[2:].split(".")[0])
            inputs.see_option(where, content)
            continue
        if where in ("--trainer.callbacks+", "--trainer.callbacks"):
            for i, entry in enumerate(content if isinstance(content, list) else [content]):
                if entry is None and isinstance(content, list):
                    raise OptionError(f"{where}: {empty_item_problem(('trainer', 'callbacks', i), 'null')}")
                _check_slot(where, entry, "callback")
        if where == "--trainer.callbacks+":  # one callback appended
            is_class = isinstance(content, str) or (isinstance(content, dict) and "class_path" in content)
            if callbacks is not None and is_class:
                callbacks.append(_entry_copy(content if isinstance(content, dict) else {"class_path": content}))
            else:
                callbacks = None
            continue
        if where.startswith("--trainer.callbacks.init_args."):  # an option of the last callback listed
            key = where[len("--trainer.callbacks.init_args."):]
            name = class_name(callbacks[-1].get("class_path")) if callbacks else None
            if name in ARGUMENTS:
                check_callback_options(name, {key: content}, where, criteria_known)
            if callbacks and "." not in key:
                callbacks[-1]["init_args"][key] = content
            else:
                placed = False
            continue
        if where.startswith("--trainer.callbacks"):  # the list given another way: not followed from here
            callbacks = None
            continue
        if not isinstance(content, dict):  # a config not read here (a subcommand's section that is no mapping): its
            placed, root_where, callbacks = False, None, None  # callbacks unseen
            continue
        label = where if where in ("--config", "-c") else f"config file {where!r}"
        problem = config_keys_problem(content, command, label) if command else None
        if problem:
            raise OptionError(problem)
        for key, value, slot in config_slots(content):
            _check_slot(f"{label}: {key}", value, slot)
        trainer = content.get("trainer") if isinstance(content.get("trainer"), dict) else {}
        if "precision" in trainer:
            _check_precision(f"{label}: trainer.precision", trainer["precision"])
        if "default_root_dir" in trainer:
            root, root_where = trainer["default_root_dir"], f"{label}: trainer.default_root_dir"
        inputs.see_config(content)
        listed = trainer.get("callbacks")
        if isinstance(listed, list):
            entries = [{"class_path": e} if isinstance(e, str) else e for e in listed]
            callbacks = [_entry_copy(e) for e in entries] if all(isinstance(e, dict) for e in entries) else None
            for entry in (e for e in entries if isinstance(e, dict)):
                name = class_name(entry.get("class_path"))
                if name in ARGUMENTS and isinstance(entry.get("init_args"), dict):
                    check_callback_options(name, entry["init_args"], f"{where}: {name}", criteria_known)
        elif listed is not None:
            placed = False
    names = None if callbacks is None else [class_name(entry.get("class_path")) for entry in callbacks]
    for item in addressed:
        check_callback_options(item.callback, {item.argument: item.value}, item.option, criteria_known)
        slot = _ADDRESSED_SLOTS.get((item.callback, item.argument.removesuffix(".class_path")))
        if slot:
            _check_slot(item.option, item.value, slot)
        if names is not None and criteria_known and item.callback not in names:
            raise OptionError(missing_callback(item))
    _check_path_texts(root if root_where else None, root_where, inputs, callbacks, addressed)
    if prints_config(rest):  # nothing is built or written
        return
    problem = root_dir_problem(root) if root_where and isinstance(root, str) else None
    if problem:
        raise OptionError(f"{root_where}: {problem}")
    if placed and callbacks is not None and (root is None or isinstance(root, str)):
        _check_export_dirs(callbacks, root, addressed)
    problems = inputs.problems()
    if problems:
        raise OptionError("; ".join(f"{option}: {problem}" for option, problem in problems))


#: the callbacks' arguments that name a path, and what each is
_PATH_ARGUMENTS = {"output_dir": "output directory", "checkpoint_dir": "checkpoint directory", "plan_path": "plan file"}


def _check_path_texts(root: Any, root_where: str | None, inputs: JobInputs, callbacks: list[dict[str, Any]] | None,
                      addressed: list[Addressed]) -> None:
    """Refuse a path the job would read or write whose name is not UTF-8 text (the run directory, the model's and
    the data's files, the callbacks' output_dir, checkpoint_dir and plan_path), naming the option."""
    found: list[tuple[str, str, Any]] = [(root_where or "", "run directory", root)] if root_where else []
    found += inputs.paths()
    given = {(item.callback, item.argument) for item in addressed}
    for entry in callbacks or []:
        name = class_name(entry.get("class_path"))
        if name in OPTIONS:
            found += [(f"--{OPTIONS[name].address}.{argument}", what, entry["init_args"][argument])
                      for argument, what in _PATH_ARGUMENTS.items()
                      if argument in entry["init_args"] and (name, argument) not in given]
    found += [(item.option, _PATH_ARGUMENTS[item.argument], item.value) for item in addressed
              if item.argument in _PATH_ARGUMENTS]
    for where, what, path in found:
        if isinstance(path, str):
            try:
                check_path_text(path, what)
            except ValueError as err:
                raise OptionError(f"{where}: {err}") from None
            variable = variable_in(path)
            if variable:
                raise OptionError(f"{where}: {what} {path!r} holds the variable {variable}, which lightprune does not "
                                  "expand (no shell reads a config file); write the path out, or give it on the "
                                  "command line, where the shell expands it")
            unknown = unknown_home(path)
            if unknown:
                raise OptionError(f"{where}: {what} {unknown}")


#: (callback, argument) -> the class slot it is (:mod:`lightprune.cli.slots`)
_ADDRESSED_SLOTS = {("ExpertPruning", "criterion"): "criterion", ("Evaluate", "data"): "data"}


def _check_precision(where: str, value: Any) -> None:
    problem = precision_problem(value)
    if problem:
        raise OptionError(f"{where}: {problem}")


#: what a config given before the subcommand may hold at its top besides the subcommands' sections
_KEYED = ("subcommand", "config", "$schema")


def _check_keyed_by_subcommand(where: str, content: Any, command: str) -> None:
    """A config given before the subcommand (``lightprune --config X export``) is read by the main parser, as a
    mapping of subcommand -> options; one holding a subcommand's options is refused, saying where it goes."""
    if not isinstance(content, dict):
        return
    stray = next((key for key in content if key not in (*SUBCOMMANDS, *_KEYED)), None)
    if stray is None:
        return
    label = where if where in ("--config", "-c") else f"config file {where!r}"
    given = "--config" if where in ("--config", "-c") else f"--config {where}"
    raise OptionError(f"{label} is given before the subcommand, where a config maps subcommands to their options "
                      f"({command}: {{...}}), and its key {str(stray)!r} is not a subcommand; give it after the "
                      f"subcommand: lightprune {command} {given} ...")


def _section(content: Any, command: str) -> Any:
    """What a config given before the subcommand (a mapping keyed by subcommand) sets for ``command``: its section,
    an empty mapping where it has none; a section that is no mapping, or a config that is none, as it is (not
    followed here)."""
    if not isinstance(content, dict):
        return content
    section = content.get(command)
    return {} if section is None else section


def _check_slot(where: str, value: Any, slot: str) -> None:
    """A class path given to ``slot`` that cannot be one of its classes: refused before anything is imported."""
    problem = class_path_problem(value, slot)
    if problem:
        raise OptionError(f"{where}: {problem}")


def _check_export_dirs(callbacks: list[dict[str, Any]], root: str | None, addressed: list[Addressed]) -> None:
    """Callbacks that conflict ([`lightprune.callbacks.roster.check_roster`][lightprune.callbacks.roster.check_roster]:
    two Exports, two ExpertPruning writing one folder, a checkpoint directory that is the run's folder), an export
    callback's checkpoint directory that holds an earlier run's files, without ``overwrite``, or its ``plan_path`` that
    is no file: refused here, before Lightning is imported (with the messages the callbacks' ``setup`` and ``preflight``
    give). Called only where every option that places it was seen (the callbacks list followed as jsonargparse builds
    it, each config file read, no nested option of a callback); an addressed option that does not name one export
    callback's top-level option leaves it to that ``preflight``, so this never refuses a job the parser would take."""
    from lightprune.callbacks.export_dirs import check_checkpoint_dir, check_plan_path, checkpoint_dir_of
    from lightprune.callbacks.roster import check_roster

    for item in addressed:
        targets = [e for e in callbacks if class_name(e.get("class_path")) == item.callback]
        if item.callback in _EXPORTS and ("." in item.argument or len(targets) != 1):
            return
        for entry in targets:
            entry["init_args"][item.argument] = item.value
    try:  # callbacks that conflict (two Exports, a checkpoint_dir that is the run's folder): as their setup says it
        check_roster([(class_name(e.get("class_path")), e["init_args"]) for e in callbacks
                      if class_name(e.get("class_path")) in OPTIONS], root)
    except ValueError as err:
        raise OptionError(str(err)) from None
    for entry in callbacks:
        name = class_name(entry.get("class_path"))
        args = entry["init_args"]
        plan_path = args.get("plan_path") if name in _EXPORTS else None
        if isinstance(plan_path, str):  # as the callback's constructor says it (a directory, a missing file)
            try:
                check_plan_path(plan_path)
            except OSError as err:
                raise OptionError(f"{OPTIONS[name].address}.{err}") from None
        if name not in _EXPORTS or args.get("overwrite") not in (None, False):
            continue
        try:
            check_checkpoint_dir(checkpoint_dir_of(args, root), False, OPTIONS[name].address)
        except FileExistsError as err:
            raise OptionError(str(err)) from None
        except ValueError:  # a path the export refuses for another reason: said there
            continue


def _entry_copy(entry: dict[str, Any]) -> dict[str, Any]:
    """A callbacks-list entry with its own ``init_args`` mapping (options set on it change nothing else)."""
    init_args = entry.get("init_args")
    return {**entry, "init_args": dict(init_args) if isinstance(init_args, dict) else {}}
