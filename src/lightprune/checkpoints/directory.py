"""A checkpoint directory: config.json, its safetensors weight files and shard index, checked before anything
loads: [`check_checkpoint`][].

Which files are the model's weights is one rule, the one transformers' loader follows, for every path that reads
a checkpoint: ``model.safetensors``, or the files the shard index (``model.safetensors.index.json``) names (a
leading ``./`` allowed). Where that is ambiguous the checkpoint is refused, naming the files: ``model.safetensors``
beside a shard index (transformers loads the one, a loader that follows the index the other), or beside shards
named like the model's (``model-00001-of-00002.safetensors``) without an index (a loader that reads every
``.safetensors`` file of such a folder reads them too). transformers' pickle weights beside the safetensors ones
(``pytorch_model.bin``, read instead only with ``use_safetensors=False``) are named in a warning
(`warn_pickle_weights`). Any other file (an adapter's ``adapter_model.safetensors``, an optimizer state, a
stray copy, a shard the index does not name) is not part of the checkpoint and is never read.

Refused, with the path in the message: no directory (a file, a dangling symlink or a symlink loop said as such, a
name that is not UTF-8), no (or unreadable) config.json or one that names a key twice, a weights name, config.json
or the index that is a directory, a dangling symlink or a symlink loop, no weights (pickle ``.bin`` / ``.pt`` files
are never loaded; shards named ``model-00001-of-00003`` without their index), a shard index that is not
``{"weight_map": {tensor: file}, "metadata": {...}}`` (transformers' loader reads both), names a missing file or
one outside the folder, or disagrees with the shards' headers (a tensor it lists that its shard lacks, or a tensor
of a shard it does not list), and a safetensors file whose header disagrees with its bytes
(`header.read_header`). config.json, the index and the headers nested
deeper than `MAX_DEPTH` are refused before they are parsed. A file that cannot be
read (permission denied) is one line naming it (`input_error`). A file an export copies along (the tokenizer,
processor and chat-template files, ``generation_config.json``: `copied_files`) that is a directory, a broken
symlink or a special file is refused too, naming it: the export would lack it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from lightprune.checkpoints.header import read_header
from lightprune.core.errors import listed_text
from lightprune.core.jsonio import parse_json, show
from lightprune.core.parse_limits import DuplicateKeyError
from lightprune.core.paths import check_path_text, file_problem
from lightprune.core.sources import not_a_directory

__all__ = ["SAFE_INDEX", "SAFE_WEIGHTS", "TOKENIZER_FILES", "CHAT_TEMPLATES_DIR", "GENERATION_FILE", "weight_files",
           "read_index", "index_metadata", "read_config", "check_checkpoint", "checkpoint_directory", "copied_files",
           "disk_entries", "input_error", "readable_inputs", "shard_name", "warn_pickle_weights"]

SAFE_INDEX = "model.safetensors.index.json"
SAFE_WEIGHTS = "model.safetensors"
#: the tokenizer / processor / chat-template files an export copies from its source checkpoint, when present
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "chat_template.jinja", "chat_template.json",
                   "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
#: transformers' folder of extra named chat templates (``<name>.jinja``), copied along with them
CHAT_TEMPLATES_DIR = "additional_chat_templates"
#: the generation settings an export copies from its source when ``save_pretrained`` wrote none
GENERATION_FILE = "generation_config.json"
_SHARD_NAME = re.compile(r".*-\d+-of-\d+\.safetensors$")
#: the names transformers gives the shards of a model's safetensors weights
_MODEL_SHARD = re.compile(r"^model-\d+-of-\d+\.safetensors$")
#: transformers' pickle weights, which it reads instead of the safetensors ones with ``use_safetensors=False``
_PICKLE_WEIGHTS = re.compile(r"^pytorch_model(?:-\d+-of-\d+)?\.bin(?:\.index\.json)?$")
#: errno values of a file that is there but cannot be read
_UNREADABLE = {errno.EACCES: "make it readable (chmod), or run as a user who may read it",
               errno.EPERM: "make it readable (chmod), or run as a user who may read it",
               errno.EISDIR: "it is a directory: restore the file",
               errno.ELOOP: "it is a symlink loop: point the link at the file"}


def input_error(exc: BaseException, after: str = "") -> OSError | None:
    """``exc`` restated in one line naming the file it could not read (a permission denied, a directory or a symlink
    loop where a file was to be read: `_UNREADABLE`), of the same class and errno, chained by the caller;
    ``after``: what else to say (what was written). None for any other exception."""
    code, filename = getattr(exc, "errno", None), getattr(exc, "filename", None)
    if not isinstance(exc, OSError) or code not in _UNREADABLE or filename is None:
        return None
    error = type(exc)(f"cannot read {os.fsdecode(filename)!r}: {os.strerror(code).lower()}; {_UNREADABLE[code]}"
                      + (f"; {after}" if after else ""))
    error.errno = code  # no filename: str() stays the message
    return error


@contextmanager
def readable_inputs() -> Iterator[None]:
    """Restate an input that cannot be read, raised in the block, in one line (`input_error`)."""
    try:
        yield
    except OSError as exc:
        error = input_error(exc)
        if error is None:
            raise
        raise error from exc


def _check_entry(file: Path, what: str) -> None:
    """Refuse a name ``file`` that is there but cannot be read as a file (`file_problem`),
    naming it."""
    problem = file_problem(file)
    if problem is not None:
        cls, why = problem
        raise cls(f"checkpoint directory {str(file.parent)!r}: {what} {file.name} {why}; restore the file (or "
                  "re-save the checkpoint)")


def copied_files(path: str | os.PathLike) -> list[str]:
    """The names (relative to ``path``) of the files an export copies from the checkpoint directory ``path``:
    `TOKENIZER_FILES`, `GENERATION_FILE` and the ``.jinja`` templates of `CHAT_TEMPLATES_DIR`
    that are there. A name that is there but is no regular file (a directory, a dangling symlink or a loop, a
    special file: `file_problem`) is refused, naming it: the export would lack it."""
    path = Path(path)
    names = [*TOKENIZER_FILES, GENERATION_FILE]
    extra = path / CHAT_TEMPLATES_DIR
    if extra.is_dir():
        names += sorted(f"{CHAT_TEMPLATES_DIR}/{p.name}" for p in extra.iterdir() if p.name.endswith(".jinja"))
    found = []
    for name in names:
        problem = file_problem(path / name)
        if problem is not None:
            cls, why = problem
            raise cls(f"checkpoint directory {str(path)!r}: its {name} {why}; an export copies it along (the "
                      "tokenizer, processor and chat-template files, generation_config.json) and would lack it; "
                      "restore the file (or remove the name)")
        if (path / name).is_file():
            found.append(name)
    return found


def _read_json_file(file: Path, what: str) -> Any:
    try:
        return parse_json(file.read_text(encoding="utf-8"), f"{what} {str(file)!r}")
    except DuplicateKeyError as err:
        raise ValueError(str(err)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{what} {str(file)!r} is not valid JSON: {err}") from None


def read_config(path: str | os.PathLike) -> dict[str, Any]:
    """config.json of a checkpoint directory as a dict (``ValueError`` naming it when it is not a JSON object,
    or names a key twice)."""
    file = Path(path) / "config.json"
    _check_entry(file, "its")
    if not file.is_file():
        raise FileNotFoundError(f"checkpoint directory {str(Path(path))!r} has no config.json")
    config = _read_json_file(file, "config.json")
    if not isinstance(config, dict):
        raise ValueError(f"config.json {str(file)!r} is not a JSON object")
    return config


def shard_name(value: str) -> str:
    """A shard index's file name without leading ``./`` (transformers joins it to the folder as it is)."""
    while value.startswith("./"):
        value = value[2:]
    return value


def read_index(path: str | os.PathLike) -> dict[str, str] | None:
    """The shard index's ``weight_map`` ({tensor: file name}, a leading ``./`` dropped) of a checkpoint directory,
    None without an index; ``ValueError`` naming the index when it is malformed, FileNotFoundError when it names a
    missing file."""
    path = Path(path)
    index = path / SAFE_INDEX
    _check_entry(index, "its shard index")
    if not index.is_file():
        return None
    data = _read_json_file(index, "shard index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or \
            not all(isinstance(v, str) and v for v in weight_map.values()):
        raise ValueError(f"shard index {str(index)!r} is not valid: it needs a non-empty \"weight_map\" object "
                         "{tensor name: shard file name}")
    names = set(weight_map.values())  # a few shards named by thousands of tensors: each checked once
    outside = sorted(v for v in names if Path(shard_name(v)).name != shard_name(v) or not v.endswith(".safetensors")
                     or shard_name(v) in ("", ".", ".."))
    if outside:
        raise ValueError(f"shard index {str(index)!r} names {outside}: shards are .safetensors files in the "
                         "checkpoint directory")
    weight_map = {key: shard_name(value) for key, value in weight_map.items()}
    names = set(weight_map.values())
    for name in sorted(names):
        _check_entry(path / name, "the shard")
    missing = sorted(v for v in names if not (path / v).is_file())
    if missing:
        raise FileNotFoundError(f"checkpoint {str(path)!r}: shard index names missing files {missing}")
    # transformers' loader (get_checkpoint_shard_files) reads index["metadata"] and adds its own keys to it
    if "metadata" not in data:
        raise ValueError(f"shard index {str(index)!r} has no \"metadata\": transformers' loader reads it, so it "
                         "cannot load the folder as it is; add \"metadata\": {} to the index")
    if not isinstance(data["metadata"], dict):
        raise ValueError(f"shard index {str(index)!r} has \"metadata\": {show(data['metadata'])}, not a JSON "
                         "object: transformers' loader adds its own keys to it, so it cannot load the folder as it "
                         "is; make it an object (\"metadata\": {} if there is nothing to say)")
    return weight_map


def index_metadata(path: str | os.PathLike) -> dict[str, Any] | None:
    """The shard index's ``"metadata"`` object (None without an index); the index checked by `read_index`."""
    if read_index(path) is None:
        return None
    return _read_json_file(Path(path) / SAFE_INDEX, "shard index")["metadata"]


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The model's ``.safetensors`` files of a checkpoint directory (see the module docstring); FileNotFoundError
    naming what the directory holds when it has none, ``ValueError`` when which files are the model is ambiguous
    (``model.safetensors`` beside a shard index, or beside shards named like the model's, without an index)."""
    path = Path(path)
    _check_entry(path / SAFE_WEIGHTS, "its weights file")
    weight_map = read_index(path)
    single = (path / SAFE_WEIGHTS).is_file()
    if weight_map is not None and single:
        shards = sorted(set(weight_map.values()))
        raise ValueError(f"checkpoint directory {str(path)!r} holds both {SAFE_WEIGHTS} and {SAFE_INDEX} with its "
                         f"shards ({listed_text(shards)}): transformers loads {SAFE_WEIGHTS}, a loader that follows the "
                         "index its shards, and nothing says they are the same model; remove (or move away) one of "
                         f"the two: {SAFE_WEIGHTS}, or the index and its shards")
    if weight_map is not None:  # shards the index does not name are read by no loader
        return sorted(path / name for name in set(weight_map.values()))
    if not single:
        _no_weights(path)
    stray = sorted(p.name for p in path.iterdir() if _MODEL_SHARD.match(p.name))
    if stray:
        raise ValueError(f"checkpoint directory {str(path)!r} holds shard files ({listed_text(stray)}) beside "
                         f"{SAFE_WEIGHTS}, without an index: leftovers of another save? transformers loads "
                         f"{SAFE_WEIGHTS}, a loader that reads every .safetensors file of a folder without an index "
                         "would read them too; remove (or move away) the files that are not the model's")
    return [path / SAFE_WEIGHTS]


def _no_weights(path: Path) -> NoReturn:
    """Raise the FileNotFoundError of a checkpoint directory without ``model.safetensors`` or a shard index."""
    others = sorted(p.name for p in path.glob("*.safetensors"))
    shards = [name for name in others if _SHARD_NAME.match(name)]
    if shards:
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} holds shards ({listed_text(shards)}) but no "
                                f"{SAFE_INDEX}: without its index nothing says which tensors it holds; restore the "
                                "index (or re-save the checkpoint)")
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
    found = [f"found {others}, not a model's weights file" if others else "",
             f"found {pickles}; lightprune loads safetensors only" if pickles else ""]
    hint = "; ".join(part for part in found if part)
    raise FileNotFoundError(f"checkpoint directory {str(path)!r} has no .safetensors weights (no {SAFE_WEIGHTS}, "
                            f"no {SAFE_INDEX})" + (f" ({hint})" if hint else ""))


def warn_pickle_weights(path: str | os.PathLike) -> None:
    """Name, in a warning, transformers' pickle weights (``pytorch_model.bin``, its shards and index) beside a
    checkpoint's safetensors weights: every lightprune path, and transformers by default, reads the safetensors
    files; transformers reads the pickles instead with ``use_safetensors=False``."""
    path = Path(path)
    pickles = sorted(p.name for p in path.iterdir() if _PICKLE_WEIGHTS.match(p.name))
    if pickles:
        warnings.warn(f"checkpoint {str(path)!r} holds {listed_text(pickles)} beside its safetensors weights: lightprune "
                      "(and transformers, unless use_safetensors=False) reads the safetensors files and ignores them; "
                      "delete them if they are not the same model", UserWarning, stacklevel=3)


def disk_entries(path: str | os.PathLike, metadata: dict[str, dict[str, str]] | None = None,
                 ) -> dict[str, tuple[Path, dict[str, Any]]]:
    """``{name: (file, header entry)}`` of the checkpoint's weight files, headers checked against their bytes and
    against the shard index; ``ValueError`` for a tensor stored twice. ``metadata``: filled with each file's
    ``__metadata__`` ({file name: {key: value}}) when given."""
    path = Path(path)
    weight_map = read_index(path)
    entries: dict[str, tuple[Path, dict[str, Any]]] = {}
    for file in weight_files(path):
        header = read_header(file)
        if metadata is not None:
            metadata[file.name] = dict(header.get("__metadata__") or {})
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if name in entries:
                raise ValueError(f"checkpoint {str(path)!r}: tensor {name!r} is stored twice "
                                 f"({entries[name][0].name} and {file.name})")
            entries[name] = (file, info)
    if weight_map is not None:
        unlisted = sorted(f"{name} in {file.name}" for name, (file, _) in entries.items() if name not in weight_map)
        elsewhere = sorted(f"{name} in {file.name}, listed in {weight_map[name]}" for name, (file, _) in entries.items()
                           if name in weight_map and weight_map[name] != file.name)
        absent = sorted(f"{name} in {file}" for name, file in weight_map.items() if name not in entries)
        parts = ([f"lists {len(absent)} tensor(s) no shard holds ({listed_text(absent)})"] if absent else []) + \
            ([f"lists {len(elsewhere)} tensor(s) under another shard ({listed_text(elsewhere)})"] if elsewhere else []) + \
            ([f"does not list {len(unlisted)} tensor(s) the shards hold ({listed_text(unlisted)})"] if unlisted else [])
        if parts:
            raise ValueError(f"shard index {str(path / SAFE_INDEX)!r} {' and '.join(parts)}: the index and the "
                             "shards disagree; restore the files (or re-save the checkpoint)")
    return entries


def checkpoint_directory(path: str | os.PathLike) -> Path:
    """``path`` as a ``Path``, once it is an existing directory whose name is UTF-8 (FileNotFoundError /
    NotADirectoryError / ValueError naming it: a file's folder, a dangling symlink or a loop said as such)."""
    check_path_text(path, "checkpoint directory")
    path = Path(path)
    problem = not_a_directory(path, "checkpoint directory")
    if problem is not None:
        raise problem
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} does not exist")
    return path


def check_checkpoint(path: str | os.PathLike) -> Path:
    """Validate a checkpoint directory's files before loading (see the module docstring); returns it as a
    ``Path``."""
    path = checkpoint_directory(path)
    with readable_inputs():
        read_config(path)
        disk_entries(path)
        copied_files(path)
    return path
