"""The files a job reads, checked by the console script's first pass (torch-free, before Lightning is imported).

The model's ``checkpoint`` and the data module's files (`TextJsonlDataModule` and
`ImageTextJsonlDataModule`: the ``calibration`` / ``train`` / ``val`` / ``test`` JSONL
files, the ``tokenizer`` / ``processor`` folder) are followed through the config files and the ``--model...`` /
``--data...`` options in command-line order, as jsonargparse applies them (the last value given wins; the same
class given again keeps the arguments set before it, another class is followed from scratch). A value that cannot
exist is refused with the message the class itself would give once Lightning had loaded: a JSONL file that is not a
file, a tokenizer folder that is not a folder, a checkpoint that can only be a local folder (`local_path`) and
is not one. What is not followed (a ``--model`` given as a file, a nested option) is left to the classes.

The config files themselves (`load_config`) and the run directory (`root_dir_problem`) are checked too:
a ``--config`` that is no file (with the closest file's name), a directory, a file that is not UTF-8, not YAML,
YAML the safe loader cannot build, empty or not a mapping, a literal that YAML 1.1 (jsonargparse's reader) reads
otherwise than YAML 1.2 or JSON (``020`` is 16, ``1:30`` is 90, ``yes`` is true where the option is no true/false
option: `literal_problem`), an empty item in a list of classes (``trainer.callbacks``), and a
``trainer.default_root_dir`` that is a file or under one (``~`` is the home folder in both, as the parser and
Lightning read it; a URL run directory, ``s3://...``, is left to Lightning). Every path followed is checked to be
UTF-8 text (`JobInputs.paths`, `lightprune.core.paths.check_path_text`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from lightprune.cli.names import bool_option, closest
from lightprune.core.parse_limits import DuplicateKeyError, ParseLimitError
from lightprune.core.paths import broken_link
from lightprune.core.strict_yaml import parse_yaml
from lightprune.core.yaml_literals import YamlScalar, yaml_1_1_reading, yaml_scalars

__all__ = ["CLASS_LISTS", "JobInputs", "dotted", "empty_item_problem", "literal_problem", "load_config",
           "local_path", "name_too_long", "place", "root_dir_problem", "unknown_home", "variable_in"]

#: a value this pass did not follow
_UNSEEN = object()
#: lightprune's JSONL data modules: their file arguments and the folder argument each loads its tokenizer from
_DATA_MODULES = {"TextJsonlDataModule": "tokenizer", "ImageTextJsonlDataModule": "processor"}
_SPLITS = ("calibration", "train", "val", "test")


def local_path(text: str) -> bool:
    """Whether a checkpoint name can only be a local path: absolute, ``./``, ``../``, ``~``, or two or more
    folders deep. A hub id (``org/name``, a bare name) and a source name (``testbed:text-small``) are not."""
    if _source_name(text):
        return False
    return Path(text).is_absolute() or text.startswith(("./", "../", "~")) or text.strip("/").count("/") >= 2


def _source_name(text: str) -> bool:
    """``testbed:text-small`` and other checkpoint-source names (a scheme before the first ``/``)."""
    return ":" in text.split("/", 1)[0]


class JobInputs:
    """The class and the top-level arguments given so far to ``model`` and to ``data``."""

    def __init__(self) -> None:
        self.classes: dict[str, Any] = {"model": None, "data": None}
        self.args: dict[str, dict[str, Any]] = {"model": {}, "data": {}}

    def _set_class(self, key: str, class_path: Any) -> None:
        if class_path != self.classes[key]:
            self.args[key] = {}  # what the parser keeps across a change of class is its own business
        self.classes[key] = class_path

    def see_option(self, option: str, value: Any) -> None:
        """One ``--model...`` / ``--data...`` option of the command line."""
        key, _, rest = option.removeprefix("--").partition(".")
        if key not in self.args:
            return
        if not rest:  # --data CLASS (or a config file): a class given by name is followed, a file is not
            known = isinstance(value, str) and not value.endswith((".yaml", ".yml", ".json"))
            self._set_class(key, value if known else _UNSEEN)
            return
        if rest == "class_path":
            self._set_class(key, value)
            return
        name = rest.removeprefix("init_args.")
        if "." in name:  # a nested option: this argument is no longer followed
            self.args[key][name.split(".", 1)[0]] = _UNSEEN
        else:
            self.args[key][name] = value

    def see_config(self, config: dict[str, Any]) -> None:
        """A config file's ``model`` and ``data`` entries."""
        for key in self.args:
            if key not in config:
                continue
            entry = config[key]
            if isinstance(entry, str):
                self.see_option(f"--{key}", entry)
                continue
            if not isinstance(entry, dict):
                self._set_class(key, _UNSEEN)
                continue
            if "class_path" in entry:
                self._set_class(key, entry["class_path"])
            init_args = entry.get("init_args", {} if "class_path" in entry else entry)
            if isinstance(init_args, dict):
                self.args[key].update(init_args)
            else:
                self._set_class(key, _UNSEEN)

    def paths(self) -> list[tuple[str, str, str]]:
        """(option, what, path) for each path given that the model and the data read (the checkpoint, the JSONL
        files, the tokenizer / processor folder)."""
        found = []
        checkpoint = self.args["model"].get("checkpoint")
        if isinstance(checkpoint, str):
            found.append(("--model.init_args.checkpoint", "checkpoint directory", checkpoint))
        data = self.classes["data"]
        name = data.rsplit(".", 1)[-1] if isinstance(data, str) and data.startswith("lightprune.") else None
        if name in _DATA_MODULES:
            for argument in (*_SPLITS, _DATA_MODULES[name]):
                path = self.args["data"].get(argument)
                what = f"{argument} JSONL file" if argument in _SPLITS else f"{argument} directory"
                if isinstance(path, str):
                    found.append((f"--data.init_args.{argument}", what, path))
        return found

    def problems(self) -> list[tuple[str, str]]:
        """(option, message) for each value given that cannot exist, in the classes' own words."""
        found = []
        checkpoint = self.args["model"].get("checkpoint")
        if isinstance(checkpoint, str) and local_path(checkpoint) and not Path(checkpoint).expanduser().exists():
            found.append(("--model.init_args.checkpoint", f"checkpoint directory {checkpoint!r} does not exist"))
        data = self.classes["data"]
        name = data.rsplit(".", 1)[-1] if isinstance(data, str) and data.startswith("lightprune.") else None
        if name not in _DATA_MODULES:
            return found
        args = self.args["data"]
        for split in _SPLITS:
            path = args.get(split)
            if isinstance(path, str) and not Path(path).expanduser().is_file():
                found.append((f"--data.init_args.{split}", f"{split} JSONL file {path!r} does not exist"))
        folder_arg = _DATA_MODULES[name]
        folder = args.get(folder_arg)
        if isinstance(folder, str) and not _source_name(folder) and not Path(folder).expanduser().is_dir():
            problem = (f"{folder_arg} directory {folder!r} does not exist (lightprune loads {folder_arg}s from local "
                       "directories only; nothing is downloaded)")
            found.append((f"--data.init_args.{folder_arg}", problem))
        return found


_RECIPES = "configs/ holds the recipes"


def _no_file(text: str, option: str) -> str:
    """The error for a ``--config`` that names no file: with the closest file of its folder (``~`` expanded), or the
    missing folder."""
    folder = Path(os.path.expanduser(text)).parent
    if not folder.is_dir():
        return f"{option} {text!r}: no such file (no folder {str(folder)!r}; {_RECIPES})"
    close = closest(Path(text).name, [entry.name for entry in folder.iterdir() if entry.is_file()])
    hint = f"did you mean {str(folder / close)!r}?" if close else _RECIPES
    return f"{option} {text!r}: no such file ({hint})"


def _not_yaml(err: Exception, where: str) -> str:
    mark = getattr(err, "problem_mark", None)
    at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{where} is not YAML: {getattr(err, 'problem', None) or err}{at}"


_PLAIN = "a config holds plain values (text, numbers, true/false, null, lists and mappings)"


def _not_buildable(err: Exception, where: str, source: str) -> str:
    """The line for YAML that parses but that PyYAML's safe loader (and so jsonargparse's) cannot build: a tag it
    does not know (``!!python/object``, ``!percent``), a list or mapping as a key, a second document, a character
    YAML does not allow, an explicitly tagged value that is not of its tag."""
    import yaml

    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    line = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else None
    problem = str(getattr(err, "problem", None) or "")
    if isinstance(err, yaml.reader.ReaderError):
        line = f"line {source.count(chr(10), 0, err.position) + 1}"
        return f"{where} is not YAML: unacceptable character #x{err.character:04x} at {line} ({err.reason})"
    if problem.startswith("could not determine a constructor for the tag"):
        tag = problem.rsplit(" ", 1)[-1].strip("'").replace("tag:yaml.org,2002:", "!!")
        return f"{where}: the tag {tag!r} at {line} is not one YAML's safe loader builds; {_PLAIN}"
    if "unhashable key" in problem or "unacceptable key" in problem:
        return f"{where}: the key at {line} is a list or a mapping; a config's keys are option names"
    if problem == "but found another document":
        return f"{where} holds more than one YAML document (the second starts at {line}); a config is one document"
    if isinstance(err, yaml.YAMLError):
        context = getattr(err, "context", None)
        return f"{where} is not YAML lightprune reads: {f'{context}: ' if context else ''}{problem or err}" + \
            (f" ({line})" if line else "")
    return f"{where}: a value YAML cannot build: {err}; {_PLAIN}"


def _read(path: Path, where: str) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        line = err.object.count(b"\n", 0, err.start) + 1
        column = err.start - err.object.rfind(b"\n", 0, err.start)
        raise ValueError(f"{where} is not UTF-8 text (byte {err.object[err.start]:#04x} at line {line}, column "
                         f"{column})") from None
    except OSError as err:
        raise ValueError(f"{where} cannot be read: {err.strerror or err}") from None


def load_config(text: str, option: str) -> tuple[str, dict[str, Any]]:
    """(where, content) of a ``--config`` value: a file's mapping of options (where: its name as given; ``~`` is the
    home folder, as the parser reads it) or the mapping given inline (where: ``option``). A value that cannot be a
    config is a ``ValueError`` in one line naming it, and so are a key named twice, YAML past
    the limits (`parse_yaml`) and YAML that the safe loader cannot build (a tag
    such as ``!!python/object``, a list as a key, two documents: the line and the problem)."""
    import yaml

    if not text.strip():
        raise ValueError(f"{option} needs a value: a YAML config file ({_RECIPES})")
    path = Path(os.path.expanduser(text))
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except (OSError, ValueError):  # a config's content given inline (too long, or not a name)
        is_dir = is_file = False
    if is_dir:
        files = sorted(str(p) for p in path.glob("*.yaml"))[:2]
        raise ValueError(f"{option} {text!r} is a folder; give a config file" +
                         (f" (for example {', '.join(files)})" if files else ""))
    one_name = not is_file and "\n" not in text and not text.lstrip().startswith(("{", "["))  # a file's name
    if one_name and os.path.exists(path):  # a device, a pipe: the parser reads regular files only
        raise ValueError(f"{option} {text!r} is not a regular file; give a config file")
    key, where = (text, f"config file {text!r}") if is_file else (option, option)
    source = _read(path, where) if is_file else text
    try:
        content = parse_yaml(source, where)
    except (yaml.scanner.ScannerError, yaml.parser.ParserError) as err:
        raise ValueError(_no_file(text, option) if one_name else _not_yaml(err, where)) from None
    except (DuplicateKeyError, ParseLimitError):
        raise
    except (yaml.YAMLError, ValueError) as err:  # parsed, but not buildable: jsonargparse's loader fails there too
        raise ValueError(_not_buildable(err, where, source)) from None  # (dates are text in both: never here)
    if isinstance(content, dict):
        problem = _scalars_problem(source, where, content)
        if problem:
            raise ValueError(problem)
        return key, content
    if one_name:
        raise ValueError(_no_file(text, option))
    if content is None:
        raise ValueError(f"{where} is empty{' (comments only)' if source.strip() else ''}; a config is a mapping of "
                         f"options (trainer:, model:, data:, ...; {_RECIPES})")
    kind = "a list" if isinstance(content, list) else f"a scalar ({str(content)[:40]!r})"
    raise ValueError(f"{where} is not a mapping of options: its top level is {kind}")


#: the lists of classes (config paths) in which an empty item (null) is refused
CLASS_LISTS = (("trainer", "callbacks"), ("trainer", "logger"), ("trainer", "plugins"))


def dotted(path: tuple[Any, ...]) -> str:
    """A key path as a config's reader writes it: ``trainer.callbacks[1].init_args.ratio``."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path).lstrip(".")


def literal_problem(scalar: YamlScalar, config: Any) -> str | None:
    """What YAML 1.1 reads a plain scalar of ``config`` as, not what YAML 1.2 or JSON would, and what to write
    (`yaml_1_1_reading`), or None; ``yes``/``no``/``on``/``off`` are taken as
    true/false where the option is a true/false option or one of a class outside lightprune."""
    reading = yaml_1_1_reading(scalar.text, scalar.value) if scalar.plain else None
    if reading is None:
        return None
    kind, said = reading
    if kind == "bool" and not scalar.key and bool_option(scalar.path, config) is not False:
        return None
    return said


def place(path: tuple[Any, ...], key: bool) -> str:
    """Where a scalar is, for a message: ``model.init_args.tiny_overrides`` or ``a key of ...``."""
    return f"a key of {dotted(path) or 'the top level'}" if key else dotted(path)


def empty_item_problem(path: tuple[Any, ...], text: str) -> str:
    """The end of the line refusing an empty item (null) at ``path`` of a list of classes; ``text``: as written."""
    list_path, index = path[:-1], path[-1]
    written = "a '-' with nothing after it" if not text else text
    example = "- class_path: lightprune.callbacks.Export" if list_path[-1] == "callbacks" else \
        "- class_path: package.module.Class"
    return (f"item {index + 1} of {dotted(list_path)} is empty ({written}); write a class there ({example}) or "
            "remove the item")


def _scalars_problem(source: str, where: str, content: dict[str, Any]) -> str | None:
    """The first literal read otherwise than written (`literal_problem`) or empty item of a list of classes in
    a config's ``source``, as one line naming ``where`` and the line."""
    for scalar in yaml_scalars(source, where):
        if scalar.value is None and not scalar.key and len(scalar.path) == 3 and scalar.path[:2] in CLASS_LISTS:
            return f"{where}, line {scalar.line}: {empty_item_problem(scalar.path, scalar.text)}"
        problem = literal_problem(scalar, content)
        if problem:
            return f"{where}, line {scalar.line}: {place(scalar.path, scalar.key)}: {problem}"
    return None


def unknown_home(path: str) -> str | None:
    """Why ``~user/...`` names no folder (no such user on this machine, or no home folder for ``~``), else None: the
    parser keeps such a name as it is and Lightning's ``Path.expanduser`` fails on it."""
    if not path.startswith("~"):
        return None
    head = path.split("/", 1)[0]
    if os.path.expanduser(head) != head:
        return None
    if head == "~":
        return f"{path!r}: '~' names no home folder here (HOME is not set); write the folder out"
    return (f"{path!r}: there is no user {head[1:]!r} on this machine, so {head!r} names no home folder; write the "
            "folder out")


#: the longest name of one file or folder, and of a whole path, most file systems take (Linux: NAME_MAX, PATH_MAX)
_NAME_MAX, _PATH_MAX = 255, 4096


def name_too_long(path: Path) -> str | None:
    """Why ``path`` cannot be created because of its length (a name over 255 bytes, a path over 4096), else None."""
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > _NAME_MAX:
            return (f"the name {part[:24] + '...'!r} is {size} bytes long, longer than a file system takes "
                    f"({_NAME_MAX}); give a shorter name")
    size = len(os.fsencode(str(path)))
    if size > _PATH_MAX:
        return f"the path is {size} bytes long, longer than a file system takes ({_PATH_MAX}); give a shorter one"
    return None


_VARIABLE = re.compile(r"\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def variable_in(path: str) -> str | None:
    """The first environment variable written in ``path`` (``$HOME``, ``${RUNS}``), or None: nothing expands it."""
    match = _VARIABLE.search(path)
    return match.group(0) if match else None


def root_dir_problem(root: str) -> str | None:
    """Why ``root`` (``trainer.default_root_dir``, ``~`` expanded as Lightning expands it) cannot be the run's
    directory: it is a file, a file stands where one of its parents would be created, it (or the folder it would
    be created in) cannot be written, it or a folder above it is a dangling symlink or a symlink loop, a name in it
    is too long, or ``~user`` names no user; None otherwise, and for a URL (``s3://bucket/run``: not a local
    path)."""
    if "://" in root:
        return None
    unknown = unknown_home(root)
    if unknown:
        return unknown
    path = Path(os.path.expanduser(root))
    long_name = name_too_long(path)
    if long_name:
        return f"{root!r} cannot be created: {long_name}"
    link = broken_link(path)
    if link is not None:
        kind, target = link
        if kind == "loop":
            return f"{root!r} is a symlink loop (-> {target!r}); remove the link or give another folder"
        return (f"{root!r} is a dangling symlink (its target {target!r} does not exist); create the target folder, "
                "remove the link, or give another folder")
    try:
        if path.exists() and not path.is_dir():
            return f"{root!r} is a file, not a folder; give a folder (an existing one or one to create)"
        for above in path.parents:
            link = broken_link(above)
            if link is not None:
                kind = "a symlink loop" if link[0] == "loop" else "a dangling symlink"
                return (f"{root!r} cannot be created: {str(above)!r} is {kind} (-> {link[1]!r}); give a folder "
                        "elsewhere")
        parent = next((p for p in path.parents if p.exists()), None)
    except OSError as err:
        return f"{root!r} cannot be used: {(err.strerror or str(err)).lower()}; give a folder elsewhere"
    except ValueError:
        return None
    if parent is not None and not parent.is_dir():
        return f"{root!r} cannot be created: {str(parent)!r} is a file; give a folder elsewhere"
    writable = path if path.is_dir() else parent
    if writable is not None and not os.access(writable, os.W_OK | os.X_OK):  # a read-only mount too, even for root
        return (f"{root!r} cannot be written: {str(writable)!r} is read-only for this user (or on a read-only file "
                "system); give a folder elsewhere")
    return None
