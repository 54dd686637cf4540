"""The files a job reads, checked by the console script's first pass (torch-free, before Lightning is imported).

The model's ``checkpoint`` and the data module's files (:class:`~lightprune.data.TextJsonlDataModule` and
:class:`~lightprune.data.ImageTextJsonlDataModule`: the ``calibration`` / ``train`` / ``val`` / ``test`` JSONL
files, the ``tokenizer`` / ``processor`` folder) are followed through the config files and the ``--model...`` /
``--data...`` options in command-line order, as jsonargparse applies them (the last value given wins; the same
class given again keeps the arguments set before it, another class is followed from scratch). A value that cannot exist is refused with the message the
class itself would give once Lightning had loaded: a JSONL file that is not a file, a tokenizer folder that is
not a folder, a checkpoint that can only be a local folder (:func:`local_path`) and is not one. What is not
followed (a ``--model`` given as a file, a nested option) is left to the classes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["JobInputs", "local_path"]

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
