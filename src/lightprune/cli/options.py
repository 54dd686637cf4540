"""Stable addresses for the callbacks' options, and the checks the command line runs before it loads Lightning.

``--prune.ratio 0.3`` sets ExpertPruning's ``ratio`` whatever the order of the job's callbacks (jsonargparse's own
``--trainer.callbacks.init_args.ratio`` sets it on whichever callback is listed last). One address per callback of
lightprune (`ADDRESSES`); the value is read as YAML, as jsonargparse reads a value (``0.3``, ``null``,
``[all, text]``, ``true``); ``--evaluate.data.init_args.preset micro`` sets an option of the class given as
Evaluate's ``data``. `split_addressed` takes these options out of the command line;
``LightpruneCLI`` sets them on the one callback of that class once the config is parsed (none or two: an error).
The addresses, the arguments and their checks are the callbacks' own option specs
(`lightprune.callbacks.options`); `addressed_help` lists them in each subcommand's ``--help``.
The checks the command line runs on these options and on the rest of it before Lightning is imported are
`lightprune.cli.command_line_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from lightprune.callbacks.options import OPTIONS
from lightprune.cli.inputs import literal_problem, place
from lightprune.cli.names import did_you_mean
from lightprune.core.parse_limits import DuplicateKeyError, ParseLimitError
from lightprune.core.yaml_literals import YamlScalar, parse_value, yaml_scalars

__all__ = ["ADDRESSES", "ARGUMENTS", "SUBCOMMANDS", "OptionError", "Addressed", "split_addressed", "yaml_value",
           "check_callback_options", "class_name", "missing_callback", "addressed_help"]

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
    its options (`lightprune.callbacks.options.OPTIONS`, as ``lightprune --help`` lists them)."""
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


def yaml_value(text: str, option: str, path: tuple[Any, ...] = (), owner: str | None = None) -> Any:
    """``text`` as jsonargparse reads a command-line value (`parse_value`:
    ``020`` is 20); a mapping naming a key twice, or text past the YAML limits, is an `OptionError` naming
    ``option``; text that is not YAML is kept as it is. ``path``: where the value goes in a config; a literal YAML
    1.1 reads otherwise than written (`literal_problem`) is refused in a list or
    mapping (read as YAML by the parser too) and, for an addressed option of the callback ``owner`` (read here,
    whatever its type), in any value."""
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
    """What `literal_problem` says of the first literal of a command-line value that
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


def class_name(class_path: Any) -> str | None:
    """The class a ``class_path`` names (its last dotted part), or None when it is not a string."""
    return class_path.rsplit(".", 1)[-1] if isinstance(class_path, str) else None


def _check_option_name(callback: str, name: str, where: str) -> None:
    if name not in ARGUMENTS[callback]:
        raise OptionError(f"{where}: {callback} has no option {name!r}{did_you_mean(name, ARGUMENTS[callback])}; its "
                          f"options: {', '.join(ARGUMENTS[callback])}")


def split_addressed(argv: Iterable[str]) -> tuple[list[str], list[Addressed]]:
    """``argv`` without its ``--<address>.<argument>`` options, and those options, in order. An unknown argument
    of a known address, or an address option without a value, is an `OptionError`."""
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
        found.append(Addressed(head, callback, argument, yaml_value(text, head, tuple(argument.split(".")),
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
