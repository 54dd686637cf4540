"""Stable addresses for the callbacks' options, and the checks the command line runs before it loads Lightning.

``--prune.ratio 0.3`` sets ExpertPruning's ``ratio`` whatever the order of the job's callbacks (jsonargparse's own
``--trainer.callbacks.init_args.ratio`` sets it on whichever callback is listed last). One address per callback of
lightprune (:data:`ADDRESSES`); the value is read as YAML, as jsonargparse reads a value (``0.3``, ``null``,
``[all, text]``, ``true``); ``--evaluate.data.init_args.preset micro`` sets an option of the class given as
Evaluate's ``data``. :func:`split_addressed` takes these options out of the command line;
``LightpruneCLI`` sets them on the one callback of that class once the config is parsed (none or two: an error).
The addresses, the arguments and their checks are the callbacks' own option specs
(:mod:`lightprune.callbacks.options`); :func:`addressed_help` lists them in each subcommand's ``--help``.

:func:`check_command_line` reads the command line and the config files it names (YAML only: no torch, no
Lightning) and checks the options lightprune's callbacks would refuse at construction: an unknown option name,
a criterion that is not registered, a ratio outside [0, 1), a choice outside its list. The checks are the ones the
callbacks' constructors run (their option specs), so the messages are the callbacks' own and a typo is reported
in a fraction of a second instead of after Lightning's import. Whatever it cannot see (a value
set in a way it does not follow) is left to the callbacks. Before those it refuses what no parser would take
(:mod:`lightprune.cli.names`: a mistyped subcommand or option, a config key that is no option), a ``--config``
that is no config, a run directory that cannot be one (:mod:`lightprune.cli.inputs`) and a ``class_path`` outside
what its slot accepts, before importing it (:mod:`lightprune.cli.slots`), a value YAML 1.1 reads otherwise than
written (``020`` is 16: :func:`lightprune.cli.inputs.literal_problem`), an empty item in a list of classes, and a path
that is not UTF-8 text (:func:`lightprune.core.paths.check_path_text`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from lightprune.callbacks.options import OPTIONS, check_criterion_name
from lightprune.cli.inputs import (JobInputs, empty_item_problem, literal_problem, load_config, place,
                                   root_dir_problem, unknown_home, variable_in)
from lightprune.cli.names import (argv_problem, config_keys_problem, did_you_mean, find_subcommand, precision_problem,
                                  prints_config, wants_help)
from lightprune.cli.slots import class_path_problem, config_slots
from lightprune.core.parse_limits import DuplicateKeyError, ParseLimitError
from lightprune.core.yaml_literals import YamlScalar, parse_value, yaml_scalars
from lightprune.core.paths import check_path_text

__all__ = ["ADDRESSES", "ARGUMENTS", "SUBCOMMANDS", "OptionError", "Addressed", "split_addressed", "check_command_line",
           "check_callback_options", "check_criterion_name", "class_name", "missing_callback", "addressed_help"]

#: subcommand -> what it does
SUBCOMMANDS: dict[str, str] = {
    "fit": "fine-tune (for example LoRA on the routers), then prune and export with the configured callbacks",
    "validate": "one evaluation pass over the validation set",
    "test": "one evaluation pass over the test set (Evaluate, ReportPage)",
    "predict": "run the model's predict step",
    "calibrate": "forward passes over calibration data, no optimizer (ExpertStats: REAP, Delta-H, MAEP, ...)",
    "export": "score, select, prune and export without data or training (weight criteria: AIMER, ...)",
}
#: address -> lightprune callback: ``--<address>.<argument> VALUE``
ADDRESSES: dict[str, str] = {spec.address: name for name, spec in OPTIONS.items()}
#: every callback's constructor arguments (the callbacks' option specs, which their constructors are checked against)
ARGUMENTS: dict[str, tuple[str, ...]] = {name: spec.arguments for name, spec in OPTIONS.items()}


class OptionError(ValueError):
    """A bad option of the command line, before anything is built."""


@dataclass(frozen=True)
class Addressed:
    """``--<address>.<argument> <value>``: ``value`` as YAML read it; ``argument`` may go into a nested class's
    options (``data.init_args.preset``)."""

    option: str
    callback: str
    argument: str
    value: Any


def addressed_help() -> str:
    """The section of each subcommand's ``--help`` that lists the addresses: each one's callback, what it does and
    its options (:data:`lightprune.callbacks.options.OPTIONS`, as ``lightprune --help`` lists them)."""
    import textwrap

    lines = ["lightprune's callback options (--ADDRESS.OPTION VALUE, the value read as YAML: set on the job's one",
             "callback of that class, whatever the order of trainer.callbacks; the callback must be in the job, from",
             "the config or --trainer.callbacks+=NAME):"]
    for name, spec in OPTIONS.items():
        lines.append(f"  {'--' + spec.address + '.*':17s} {name}: {spec.summary}")
        lines += textwrap.wrap(", ".join(f"--{spec.address}.{argument}" for argument in spec.arguments), 110,
                               initial_indent="      ", subsequent_indent="      ", break_on_hyphens=False)
    lines.append("  an option of a class given as a callback's option: --evaluate.data.init_args.preset micro")
    return "\n".join(lines)


def _yaml_value(text: str, option: str, path: tuple[Any, ...] = (), owner: str | None = None) -> Any:
    """``text`` as jsonargparse reads a command-line value (:func:`~lightprune.core.yaml_literals.parse_value`: ``020`` is
    20); a mapping naming a key twice, or text past the YAML limits, is an :class:`OptionError` naming ``option``;
    text that is not YAML is kept as it is. ``path``: where the value goes in a config; a literal YAML 1.1 reads
    otherwise than written (:func:`~lightprune.cli.inputs.literal_problem`) is refused in a list or mapping (read as
    YAML by the parser too) and, for an addressed option of the callback ``owner`` (read here, whatever its type),
    in any value."""
    import yaml

    try:
        value = parse_value(text, option)
    except (DuplicateKeyError, ParseLimitError) as err:
        raise OptionError(str(err)) from None
    except yaml.YAMLError:
        return text
    if path and (owner or isinstance(value, (dict, list))):
        problem = _literal_problem(text, value, path, owner)
        if problem:
            raise OptionError(f"{option}: {problem}")
    return value


def _literal_problem(text: str, value: Any, path: tuple[Any, ...], owner: str | None) -> str | None:
    """What :func:`~lightprune.cli.inputs.literal_problem` says of the first literal of a command-line value that
    YAML 1.1 reads otherwise than written (its place inside the value named), or None."""
    if owner:  # an addressed option: as the callback's entry of a config
        config: Any = {"trainer": {"callbacks": [{"class_path": f"lightprune.callbacks.{owner}"}]}}
        base: tuple[Any, ...] = ("trainer", "callbacks", 0, "init_args", *path)
    else:
        config, base = value, path
        for part in reversed(path):
            config = [config] if isinstance(part, int) else {part: config}
    if isinstance(value, (dict, list)):
        scalars = yaml_scalars(text, "value")
    else:
        scalars = [YamlScalar((), False, 1, text.strip(), True, value)]
    for scalar in scalars:
        problem = literal_problem(YamlScalar((*base, *scalar.path), scalar.key, scalar.line, scalar.text,
                                             scalar.plain, scalar.value), config)
        if problem:
            return f"{place(scalar.path, scalar.key)}: {problem}" if scalar.path or scalar.key else problem
    return None


def _option_path(head: str) -> tuple[Any, ...]:
    """Where a ``--trainer...`` / ``--model...`` / ``--data...`` option's value goes in a config."""
    if head == "--trainer.callbacks+":
        return "trainer", "callbacks", 0
    return tuple(head[2:].split("."))


def class_name(class_path: Any) -> str | None:
    """The class a ``class_path`` names (its last dotted part), or None when it is not a string."""
    return class_path.rsplit(".", 1)[-1] if isinstance(class_path, str) else None


def _check_option_name(callback: str, name: str, where: str) -> None:
    if name not in ARGUMENTS[callback]:
        raise OptionError(f"{where}: {callback} has no option {name!r}{did_you_mean(name, ARGUMENTS[callback])}; its "
                          f"options: {', '.join(ARGUMENTS[callback])}")


def split_addressed(argv: Iterable[str]) -> tuple[list[str], list[Addressed]]:
    """``argv`` without its ``--<address>.<argument>`` options, and those options, in order. An unknown argument
    of a known address, or an address option without a value, is an :class:`OptionError`."""
    rest, found = [], []
    argv = list(argv)
    i = 0
    while i < len(argv):
        arg = argv[i]
        head = arg.split("=", 1)[0]
        address, dot, argument = head[2:].partition(".") if head.startswith("--") else ("", "", "")
        if not dot or address not in ADDRESSES:
            rest.append(arg)
            i += 1
            continue
        callback = ADDRESSES[address]
        _check_option_name(callback, argument.split(".")[0], head)
        if "=" in arg:
            text = arg.split("=", 1)[1]
        elif i + 1 < len(argv):
            i += 1
            text = argv[i]
        else:
            raise OptionError(f"{head} needs a value")
        found.append(Addressed(head, callback, argument, _yaml_value(text, head, tuple(argument.split(".")),
                                                                     callback)))
        i += 1
    return rest, found


def missing_callback(item: Addressed) -> str:
    """The error for an addressed option of a callback the job does not have."""
    return (f"{item.option}: the job has no {item.callback} callback (add one: "
            f"--trainer.callbacks+=lightprune.callbacks.{item.callback})")


def check_callback_options(callback: str, options: dict[str, Any], where: str, criteria_known: bool = True) -> None:
    """Check ``options`` of a lightprune ``callback`` (its class name) with the callback's own option spec; ``where``
    prefixes the error (the option or the config file). ``criteria_known``: whether only lightprune's criteria and
    statistics can be registered (no project module is named that could register its own): otherwise the checks
    that read those registries are left to the callback."""
    spec = OPTIONS[callback]
    for argument, value in options.items():
        argument, nested, _ = argument.partition(".")
        _check_option_name(callback, argument, where)
        if nested or (argument in spec.registered and not criteria_known):  # left to the class / the callback
            continue
        try:
            spec.check(argument, value)
        except ValueError as err:
            raise OptionError(f"{where}: {err}") from None


#: the trainer's run directory on the command line (the export callbacks' checkpoint directory is under it)
_ROOT_OPTION = "--trainer.default_root_dir"
_PRECISION_OPTION = "--trainer.precision"
#: the export callbacks whose checkpoint directory is refused here when it holds an earlier run's files
_EXPORTS = ("Export", "WidthExport")


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
                items.append((head, _yaml_value(text, head, _option_path(head))))
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
    """Check a ``lightprune SUBCOMMAND ...`` command line (see the module docstring); an :class:`OptionError` names
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
        _check_config_order(rest[at + 1:] if at is not None else rest)
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


def _key_path(option: str) -> tuple[str, ...]:
    """An option's key in a config, without ``init_args`` (a config may write a class's options either way) and
    without a trailing ``class_path`` or ``+`` (``--model.class_path X``, ``--trainer.callbacks+=X``: the entry)."""
    parts = [part for part in option.removeprefix("--").removesuffix("+").split(".") if part != "init_args"]
    if parts and parts[-1] == "class_path":
        parts.pop()
    return tuple(parts)


def _sets(config: Any, key: tuple[str, ...]) -> bool:
    """Whether a config's mapping sets ``key`` (or a key above it, or the class at it), so that reading the config
    after the option replaces what the option gave."""
    node = config
    for part in key:
        if not isinstance(node, dict):
            return True  # a value above the key: the config replaces the whole
        if "init_args" in node and part not in node and isinstance(node["init_args"], dict):
            node = node["init_args"]
        if part not in node:
            return False
        node = node[part]
    return not (isinstance(node, dict) and "class_path" not in node)  # options added to the class given: kept


def _check_config_order(argv: list[str]) -> None:
    """Refuse an option given before a ``--config`` that sets the same key: jsonargparse applies them in order, so
    the config's value would replace the option's without a word. An option the config does not set is fine."""
    given: list[tuple[str, tuple[str, ...]]] = []
    i = 0
    while i < len(argv):
        head, eq, text = argv[i].partition("=")
        if head in ("--config", "-c"):
            if not eq:
                if i + 1 >= len(argv):
                    return
                i += 1
                text = argv[i]
            try:
                where, content = load_config(text, head)
            except (ValueError, DuplicateKeyError, ParseLimitError):  # refused where the configs are read
                return
            for option, key in given:
                if key and isinstance(content, dict) and _sets(content, key):
                    label = f"--config {text}" if where not in ("--config", "-c") else f"the {head} given inline"
                    raise OptionError(f"{option} is given before {label}, which sets {option[2:].removesuffix('+')} "
                                      "too and would replace it (options and configs are applied in order); give "
                                      f"{head} first, then {option}")
        elif head.startswith("--") and head != "--print_config":
            given.append((head, _key_path(head)))
        i += 1


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
    """Callbacks that conflict (:func:`lightprune.callbacks.roster.check_roster`: two Exports, two ExpertPruning
    writing one folder, a checkpoint directory that is the run's folder), an export callback's checkpoint directory
    that holds an earlier run's files, without ``overwrite``, or its ``plan_path`` that is no file: refused here,
    before Lightning is imported (with the messages the callbacks' ``setup`` and ``preflight`` give). Called only
    where every option that places it was seen (the callbacks list followed as jsonargparse builds it, each config
    file read, no nested option of a callback); an addressed option that does not name one export callback's
    top-level option leaves it to that ``preflight``, so this never refuses a job the parser would take."""
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
