"""GGUF for llama.cpp: an export converted by llama.cpp's own converter, as strictly as lightprune reads and writes
checkpoints: :func:`convert_to_gguf` (the ``lightprune convert-gguf`` command).

    python scripts/fetch_llama_cpp.py                                     # once: the converter, into the cache
    lightprune convert-gguf outputs/quickstart/model outputs/quickstart.gguf

Checked before the converter is imported, in this order, each refusal one line naming the value and what to do:

- the output: not the export nor a path inside it (symlinks resolved), then
  :func:`~lightprune.checkpoints.staging.check_out_file` (a file name whose folder exists, not a directory, an
  existing file only with ``overwrite``); a width-pruned export (its kernels have no GGUF form);
- the converter: ``llama_cpp``, else ``$LLAMA_CPP_DIR``, else lightprune's cache (:func:`converter_dir`, which
  ``scripts/fetch_llama_cpp.py`` fills), with the gguf-py package it imports beside it (:func:`find_converter`);
  ``outtype`` one of its ``--outtype`` choices and ``pre_tokenizer`` a name it writes as ``tokenizer.ggml.pre``, both
  read from its source (:func:`converter_outtypes`, :func:`converter_pre_tokenizers`; a close name gets a "did you
  mean");
- the weight files as the converter sees them (:func:`converter_weight_files`: every ``model*.safetensors`` of a
  folder without a shard index): one that is not the checkpoint's own (a backup, a stray shard) is refused, naming
  it, since the converter would mix its tensors into the GGUF;
- the export, opened as every path opens a checkpoint (:class:`~lightprune.checkpoints.reader.Checkpoint` and the
  :class:`~lightprune.checkpoints.skeleton.Skeleton` on it: the files, the shard index, every header against its
  bytes, config.json against the tensors);
- the experts per layer, counted in the weights and in config.json: llama.cpp stores one count per model
  (``<arch>.expert_count``), so an export whose layers keep different numbers is refused, naming them; its
  ``lightprune_export.json``, when there, must say what the weights hold;
- the tokenizer, whose vocabulary the converter writes into the GGUF (:func:`check_tokenizer`): there, parseable,
  with a vocabulary (and merges for a BPE), one token per id, every id below config.json's ``vocab_size``, loadable
  by transformers as the converter loads it.

The converter then runs in this process on a file staged beside the output
(:func:`~lightprune.checkpoints.staging.staging_file`), renamed over it once complete: a failure (a full disk
included, numpy's short writes too) leaves nothing behind and the output as it was. A write of the staged file that
fails for want of space or permission (ENOSPC, EDQUOT, EFBIG, EACCES, EROFS, EPERM) is staging's one
:class:`~lightprune.checkpoints.staging.OutputDirError` line; whatever else it raises is one
:class:`GGUFConversionError` line naming the export, the converter's step when known and the error (the traceback
under ``--verbose``). Its INFO logging, warnings and progress bar are dropped unless the run is verbose
(``LIGHTPRUNE_VERBOSE=1``, the command's ``--verbose``); the result (:class:`GGUFResult`) names the GGUF, its size
and its tensor count.

The pre-tokenizer: GGUF names it (``tokenizer.ggml.pre``), and the converter recognises a tokenizer by a fingerprint
of how it encodes a fixed text, which only published tokenizers have. A tokenizer lightprune trained (the testbeds',
``train_bpe_tokenizer``'s) is unknown to it and the converter stops ("BPE pre-tokenizer was not recognized").
``pre_tokenizer="auto"`` then names ``gpt-2`` when, and only when, ``tokenizer.json`` declares GPT-2's byte-level
pre-tokenization (:func:`gpt2_byte_level`), which is what llama.cpp's ``gpt-2`` pre-tokenizer does; a name names
that one; ``"none"`` leaves the converter's refusal. A tokenizer the converter knows is never overridden.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import errno
import importlib
import importlib.util
import logging
import os
import re
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from lightprune.checkpoints.directory import SAFE_INDEX, shard_name, checkpoint_directory, read_config, weight_files
from lightprune.checkpoints.reader import Checkpoint
from lightprune.checkpoints.skeleton import EXPERT_INDEX, Skeleton
from lightprune.checkpoints.staging import check_out_file, staging_file
from lightprune.core.checks import check_bool
from lightprune.core.errors import listed_text
from lightprune.core.errors import register_error
from lightprune.core.jsonio import layer_items, read_json, show
from lightprune.core.notices import verbose
from lightprune.export.result import EXPERT_FORMAT, MANIFEST_FILE, WIDTH_FORMAT
from lightprune.export.width_format import WIDTH_PLAN_FILE

__all__ = ["LLAMA_CPP_VERSION", "CONVERTER", "GGUFConversionError", "GGUFResult", "converter_dir", "find_converter",
           "converter_module", "converter_outtypes", "converter_pre_tokenizers", "gpt2_byte_level",
           "converter_weight_files", "check_tokenizer", "convert_to_gguf"]

#: the llama-cpp-python release whose vendored llama.cpp converter lightprune runs (scripts/fetch_llama_cpp.py)
LLAMA_CPP_VERSION = "0.3.36"
#: llama.cpp's Hugging Face to GGUF converter, in the folder :func:`find_converter` finds
CONVERTER = "convert_hf_to_gguf.py"
#: how the converter is fetched into lightprune's cache
FETCH = "python scripts/fetch_llama_cpp.py"
#: the gguf-py package a converter folder holds, which the converter imports (not the ``gguf`` installed here)
OWN_GGUF = Path("gguf-py") / "gguf" / "__init__.py"
#: the converter's own switch to import the installed ``gguf`` instead of its folder's gguf-py
_NO_LOCAL_GGUF = "NO_LOCAL_GGUF"
#: the converter's loggers (its own, gguf-py's and its metadata reader's)
_LOGGERS = ("hf-to-gguf", "gguf", "metadata")
_UNIFORM_HINT = ("Prune with a uniform allocation (ExpertPruning(..., allocation='uniform'), lp.select_experts(..., "
                 "allocation='uniform')) for llama.cpp, or serve this export with transformers")


@register_error
class GGUFConversionError(RuntimeError):
    """llama.cpp's converter failed on an export that passed lightprune's checks (an architecture it does not
    convert, a tokenizer it does not recognise): the message is one line, ``__cause__`` the converter's error."""


@dataclass(frozen=True)
class GGUFResult:
    """A GGUF written by :func:`convert_to_gguf`: ``path`` (absolute), ``size`` in bytes, ``tensors`` (the count its
    header holds), ``outtype``, ``pre_tokenizer`` (the ``tokenizer.ggml.pre`` lightprune named because the converter
    did not know the tokenizer; None when the converter named it), ``seconds``. ``os.PathLike``: the path."""

    path: Path
    size: int
    tensors: int
    outtype: str
    pre_tokenizer: str | None
    seconds: float

    def __fspath__(self) -> str:
        return str(self.path)

    def summary(self) -> str:
        """One line: the GGUF's path, size and tensor count (what the command prints)."""
        named = "" if self.pre_tokenizer is None else \
            f"; tokenizer.ggml.pre {self.pre_tokenizer!r} named here, llama.cpp does not know this tokenizer"
        return (f"wrote {self.path} ({self.size:,} bytes, {self.tensors} tensors, outtype {self.outtype}{named}) "
                f"in {self.seconds:.1f} s")


# ---------------------------------------------------------------------------------------------- the converter
def converter_dir(root: str | os.PathLike | None = None) -> Path:
    """Where the converter is: ``$LLAMA_CPP_DIR``, else the folder ``scripts/fetch_llama_cpp.py`` fills under
    ``root`` (``$LIGHTPRUNE_CACHE``, ``~/.cache/lightprune``)."""
    if os.environ.get("LLAMA_CPP_DIR") and root is None:
        return Path(os.environ["LLAMA_CPP_DIR"]).expanduser()
    base = Path(root or os.environ.get("LIGHTPRUNE_CACHE") or Path.home() / ".cache" / "lightprune").expanduser()
    return base / "llama.cpp" / f"llama-cpp-python-{LLAMA_CPP_VERSION}"


def find_converter(llama_cpp: str | os.PathLike | None = None) -> Path:
    """The absolute folder holding :data:`CONVERTER`: ``llama_cpp``, else :func:`converter_dir`; a
    FileNotFoundError saying how to fetch it when it is not there, or when the folder lacks the gguf-py package
    beside it (:data:`OWN_GGUF`): the converter would then import whatever ``gguf`` is installed, of another version,
    and fail on a name it lacks ("AttributeError: DFLASH while reading config.json"). With the converter's own
    ``NO_LOCAL_GGUF`` set, the installed ``gguf`` is what was asked for and the folder needs none."""
    if llama_cpp is not None:
        folder, origin = Path(llama_cpp), "the folder named"
    elif os.environ.get("LLAMA_CPP_DIR"):
        folder, origin = converter_dir(), "$LLAMA_CPP_DIR"
    else:
        folder, origin = converter_dir(), "lightprune's cache"
    folder = folder.expanduser().absolute()
    how = (f"with `{FETCH}` in a lightprune checkout, or name a llama.cpp tree with --llama-cpp DIR (llama_cpp=DIR) "
           "or $LLAMA_CPP_DIR")
    if not (folder / CONVERTER).is_file():
        raise FileNotFoundError(f"no llama.cpp converter ({CONVERTER}) in {str(folder)!r} ({origin}); fetch it {how}")
    own = folder / OWN_GGUF
    if not own.is_file() and _NO_LOCAL_GGUF not in os.environ:
        raise FileNotFoundError(f"llama.cpp's converter in {str(folder)!r} ({origin}) lacks the gguf-py package it "
                                f"was written with ({str(own)!r} is not there), so it would import the gguf "
                                f"installed in this Python, of another version; fetch a whole converter {how}")
    return folder


def _source(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read llama.cpp's converter source {str(file)!r}: {err}") from None


def _sources(folder: Path) -> list[Path]:
    """The converter's Python files: the script, and its ``conversion`` package in newer llama.cpp trees."""
    return [folder / CONVERTER, *sorted((folder / "conversion").glob("*.py"))]


def converter_outtypes(folder: str | os.PathLike) -> tuple[str, ...]:
    """The choices of the converter's ``--outtype``, read from its source (``ValueError`` when it has none)."""
    script = Path(folder) / CONVERTER
    try:
        tree = ast.parse(_source(script), str(script))
    except SyntaxError as err:
        raise ValueError(f"cannot parse llama.cpp's converter {str(script)!r}: {err}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args and \
                isinstance(node.args[0], ast.Constant) and node.args[0].value == "--outtype":
            for keyword in node.keywords:
                if keyword.arg == "choices":
                    with contextlib.suppress(ValueError):
                        choices = ast.literal_eval(keyword.value)
                        if choices and all(isinstance(c, str) for c in choices):
                            return tuple(choices)
    raise ValueError(f"cannot read the outtypes llama.cpp's converter {str(script)!r} accepts (its --outtype has no "
                     "literal choices): a converter this lightprune does not read; fetch the pinned one with "
                     f"`{FETCH}`")


_NAMED = re.compile(r"""\bres\s*=\s*(["'])([^"'\n]+)\1""")
_WRITTEN = re.compile(r"""\badd_tokenizer_pre\(\s*(["'])([^"'\n]+)\1\s*\)""")


def _function_bodies(text: str, name: str) -> Iterator[str]:
    """The bodies of the functions ``name`` defined in ``text`` (the lines indented under each ``def``)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith(f"def {name}("):
            indent, body = len(line) - len(stripped), []
            for follow in lines[i + 1:]:
                if follow.strip() and len(follow) - len(follow.lstrip()) <= indent:
                    break
                body.append(follow)
            yield "\n".join(body)


def converter_pre_tokenizers(folder: str | os.PathLike) -> tuple[str, ...]:
    """The pre-tokenizer names the converter writes as ``tokenizer.ggml.pre``, read from its source: the names its
    ``get_vocab_base_pre`` gives the fingerprints it knows, and those it writes as they are
    (``add_tokenizer_pre("default")``); sorted. ``ValueError`` when it has none."""
    names: set[str] = set()
    for file in _sources(Path(folder)):
        text = _source(file)
        names.update(match.group(2) for match in _WRITTEN.finditer(text))
        for body in _function_bodies(text, "get_vocab_base_pre"):
            names.update(match.group(2) for match in _NAMED.finditer(body))
    if not names:
        raise ValueError(f"cannot read the pre-tokenizer names of llama.cpp's converter in {str(folder)!r} (no "
                         f"get_vocab_base_pre): a converter this lightprune does not read; fetch the pinned one with "
                         f"`{FETCH}`")
    return tuple(sorted(names))


def _choice(what: str, value: Any, allowed: tuple[str, ...], where: str, also: tuple[str, ...] = ()) -> str:
    """``value`` when it is one of ``allowed`` or ``also``; else a ValueError naming it, with a "did you mean" for
    a close one (or the list)."""
    if isinstance(value, str) and (value in allowed or value in also):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {show(value)}")
    close = difflib.get_close_matches(value.lower(), [*also, *allowed], n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(map(repr, close))}?" if close else f"the choices: {', '.join([*also, *allowed])}"
    raise ValueError(f"{what} {value!r} is not one {where}; {hint}")


def gpt2_byte_level(tokenizer_json: str | os.PathLike) -> bool:
    """True when ``tokenizer.json`` declares GPT-2's pre-tokenization: a byte-level BPE, a ``ByteLevel``
    pre-tokenizer with its regex and without a prefix space, and no normaliser."""
    spec = read_json(tokenizer_json, "tokenizer")
    if not isinstance(spec, dict):
        raise ValueError(f"tokenizer file {str(tokenizer_json)!r} is not a JSON object")
    pre, model = spec.get("pre_tokenizer") or {}, spec.get("model") or {}
    return (spec.get("normalizer") is None and isinstance(model, dict) and model.get("type") == "BPE"
            and isinstance(pre, dict) and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) is True
            and not pre.get("add_prefix_space"))


# ---------------------------------------------------------------------------------------------- the export
def _check_placement(export: Path, outfile: str | os.PathLike) -> None:
    """Refuse an output that is the export, holds it or lies inside it (symlinks resolved), and an output file name
    (as given: the staged file's name is built from it) holding a brace."""
    src, out = export.resolve(), Path(outfile).expanduser().absolute().resolve()
    if out == src or out in src.parents or src in out.parents:
        where = "is" if out == src else "holds" if out in src.parents else "is inside"
        raise ValueError(f"refusing to write the GGUF to {os.fspath(outfile)!r}: it {where} the export {str(src)!r}, "
                         "whose files it would replace or mix with; choose a path outside the export")
    name = Path(outfile).expanduser().absolute().name  # a link's own name: the GGUF replaces the link
    if "{" in name or "}" in name:
        raise ValueError(f"output file name {name!r} holds '{{' or '}}', which llama.cpp's converter fills in "
                         "as a template; name the file as it should be written")


def _stored_experts(skeleton: Skeleton, prefix: str) -> set[int]:
    """The expert counts the checkpoint's tensors under the experts module ``prefix`` store: the expert indices
    of per-expert tensors, the first dimension of fused ones (one count when they agree)."""
    checkpoint, ids, counts = skeleton.checkpoint, set(), set()
    for target, keys in skeleton.sources.items():
        if not target.startswith(prefix):
            continue
        head = target[len(prefix):].split(".", 1)[0]
        if head.isdigit():  # an nn.ModuleList of experts
            ids.add(int(head))
            continue
        pieces = skeleton.merged_pieces(target)
        if pieces is not None:
            ids.update(index for by_expert in pieces.values() for index in by_expert)
            continue
        for key in keys:
            match = EXPERT_INDEX.search(key)
            if match is not None:
                ids.add(int(match.group(1)))
            elif checkpoint.shape(key):
                counts.add(checkpoint.shape(key)[0])
    return counts | ({len(ids)} if ids else set())


def expert_counts(skeleton: Skeleton) -> dict[int, int]:
    """{MoE layer: routed experts} of a checkpoint, counted in its weights and checked against config.json
    (``ValueError`` naming the layers where they differ); {} for a model of no family lightprune knows."""
    from lightprune.models import find_moe_layers, get_family

    try:
        get_family(skeleton.model)
        layers = find_moe_layers(skeleton.model)
    except ValueError:
        return {}
    names = {id(module): name for name, module in skeleton.model.named_modules()}
    counts, differ = {}, []
    for layer in layers:
        stored = _stored_experts(skeleton, names[id(layer.experts)] + ".")
        counts[layer.index] = next(iter(stored)) if len(stored) == 1 else layer.num_experts
        if stored and stored != {layer.num_experts}:
            differ.append(f"layer {layer.index}: {layer.num_experts} in config.json, {sorted(stored)} in the weights")
    if differ:
        raise ValueError(f"checkpoint {str(skeleton.checkpoint.path)!r}: config.json and the weights disagree on the "
                         f"experts per layer ({listed_text(differ)}); re-export it or restore the files")
    return counts


def _check_manifest(export: Path, counts: dict[int, int]) -> None:
    """``lightprune_export.json``, when there, must say what the weights hold (a width export is refused)."""
    file = export / MANIFEST_FILE
    if not os.path.lexists(file):
        return
    record = read_json(file, "export manifest")
    fix = "restore it, or delete it to convert the weights as they are"
    if not isinstance(record, dict):
        raise ValueError(f"export manifest file {str(file)!r} is not a JSON object; {fix}")
    if record.get("format") == WIDTH_FORMAT:
        _refuse_width(export)
    if record.get("format") != EXPERT_FORMAT:
        raise ValueError(f"export manifest file {str(file)!r} has format {show(record.get('format'))}, not "
                         f"{EXPERT_FORMAT!r}; {fix}")
    said = {layer: n for _, layer, n in layer_items(record.get("experts_per_layer"), f"{file}'s experts_per_layer",
                                                    "{layer: routed experts}")}
    uniform = record.get("uniform")
    if said != counts or uniform is not (len(set(counts.values())) <= 1):
        raise ValueError(f"export manifest file {str(file)!r} says experts per layer {said} (uniform: {show(uniform)})"
                         f", the weights and config.json hold {counts}: the manifest was edited or belongs to "
                         f"another export; {fix}")


def _refuse_width(export: Path) -> None:
    raise ValueError(f"export {str(export)!r} is width-pruned ({WIDTH_PLAN_FILE}): it computes with lightprune's "
                     "path-sparse kernels (lp.load_pruned), which GGUF cannot express; convert an expert-pruned export")


def _checked_export(export: Path) -> dict[int, int]:
    """Open ``export`` as every path opens a checkpoint; its experts per layer, refused unless uniform."""
    with Checkpoint(export) as checkpoint:
        counts = expert_counts(Skeleton(checkpoint))
    if len(set(counts.values())) > 1:
        raise ValueError(f"export {str(export)!r} keeps different numbers of experts per layer ({counts}); GGUF "
                         f"stores one expert count for the whole model, so llama.cpp cannot load it. {_UNIFORM_HINT}")
    _check_manifest(export, counts)
    return counts


# ---------------------------------------------------------------------------------------------- its weight files
#: (prefix, suffix, index) of the weight files the converter reads (its ``ModelBase.index_tensors``), safetensors
#: first: pickles only in a folder without either
_CONVERTER_PARTS = (("model", ".safetensors", SAFE_INDEX), ("pytorch_model", ".bin", "pytorch_model.bin.index.json"))


def converter_weight_files(export: str | os.PathLike) -> list[str]:
    """The names of the weight files llama.cpp's converter reads in ``export``, as its ``index_tensors`` picks them:
    the files ``model.safetensors.index.json`` names when it is there (a leading ``./`` dropped, as
    :func:`~lightprune.checkpoints.directory.read_index` drops it: the converter joins the name to the folder), else
    every entry ``model*.safetensors``; in a folder without either, the same of ``pytorch_model.bin.index.json`` and
    ``pytorch_model*.bin``. Sorted."""
    export = Path(export)
    names = os.listdir(export)
    for prefix, suffix, index in _CONVERTER_PARTS:
        parts = sorted(name for name in names if name.startswith(prefix) and name.endswith(suffix))
        if (export / index).is_file():
            record = read_json(export / index, "shard index")
            weight_map = record.get("weight_map") if isinstance(record, dict) else None
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise ValueError(f"shard index file {str(export / index)!r} has no \"weight_map\" object {{tensor "
                                 "name: file name}, which llama.cpp's converter reads; restore it")
            return sorted({shard_name(value) for value in weight_map.values()})
        if parts:
            return parts
    return []


def _check_weight_files(export: Path) -> None:
    """Refuse a file the converter would read that is not one of the checkpoint's weight files (a backup, a stray
    shard): it would convert its tensors too."""
    own = sorted(path.name for path in weight_files(export))
    stray = [name for name in converter_weight_files(export) if name not in own]
    if stray:
        raise ValueError(f"export {str(export)!r} holds {listed_text(stray)} beside its weights ({listed_text(own)}): "
                         f"llama.cpp's converter reads every model*.safetensors of a folder without {SAFE_INDEX} "
                         "and would convert those tensors too (a KeyError, or another file's weights in the GGUF); "
                         "move them out of the export")


# ---------------------------------------------------------------------------------------------- the tokenizer
#: the files a vocabulary is read from: transformers' (tokenizer.json; vocab.json with merges.txt), sentencepiece's
_VOCABULARIES = ("tokenizer.json", "tokenizer.model", "vocab.json")
#: the tokenizer's JSON files that the converter (or transformers, for it) parses when they are there
_TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "added_tokens.json", "special_tokens_map.json",
                   "chat_template.json", "vocab.json")
#: config.json's special token ids, which the converter writes into the GGUF
_SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
_RESTORE = "restore it from the model the export was pruned from (tokenizer.save_pretrained(EXPORT))"


def _token_id(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _check_ids(file: Path, pairs: list[tuple[Any, Any]], vocab_size: int | None, where: str) -> None:
    """``pairs`` of (token, id) read from ``file`` (``where``: the field): ids that are integers from 0, one token per
    id, every id below ``vocab_size``."""
    seen: dict[int, Any] = {}
    for token, value in pairs:
        index = _token_id(value)
        if index is None or not isinstance(token, str):
            raise ValueError(f"tokenizer file {str(file)!r}: {where} gives {show(token)} the id {show(value)}, not a "
                             f"token (a string) with an id (an integer from 0); {_RESTORE}")
        if seen.setdefault(index, token) != token:
            raise ValueError(f"tokenizer file {str(file)!r}: {where} gives the id {index} to two tokens "
                             f"({show(seen[index])} and {show(token)}), and a GGUF's vocabulary holds one token per "
                             f"id (the converter would keep one, silently); {_RESTORE}")
    past = sorted(index for index in seen if vocab_size is not None and index >= vocab_size)
    if past:
        raise ValueError(f"tokenizer file {str(file)!r}: {where} has {len(past)} token(s) at ids {vocab_size} and "
                         f"above (the last: {show(seen[past[-1]])} at {past[-1]}), past config.json's vocab_size "
                         f"{vocab_size}, the model's embedding rows: it is another model's tokenizer; save the "
                         "tokenizer of the model the export was pruned from into it")


def _sentencepiece_pieces(data: bytes) -> int:
    """How many pieces a sentencepiece model holds (the entries of its ``ModelProto``'s field 1); ValueError when the
    bytes are not a protobuf message."""

    def varint(at: int) -> tuple[int, int]:
        value = 0
        for shift in range(0, 64, 7):
            if at >= len(data):
                break
            byte = data[at]
            value, at = value | (byte & 0x7F) << shift, at + 1
            if byte < 0x80:
                return value, at
        raise ValueError("a truncated varint")

    at = count = 0
    while at < len(data):
        key, at = varint(at)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, at = varint(at)
        elif wire == 2:
            size, at = varint(at)
            at += size
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
        if field == 0 or at > len(data):
            raise ValueError("a field past the end")
        count += field == 1 and wire == 2
    return count


def _json_object(file: Path) -> dict[str, Any]:
    try:
        record = read_json(file, "tokenizer")
    except ValueError as err:
        raise ValueError(f"{err}; {_RESTORE}") from err
    if not isinstance(record, dict):
        raise ValueError(f"tokenizer file {str(file)!r} is not a JSON object; {_RESTORE}")
    return record


def _check_tokenizer_json(file: Path, spec: dict[str, Any], vocab_size: int | None) -> None:
    """tokenizer.json: a model with a vocabulary (a BPE's with merges), its added tokens, its ids."""
    model = spec.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if not vocab or not isinstance(vocab, (dict, list)):
        raise ValueError(f"tokenizer file {str(file)!r} has no vocabulary (its model.vocab is missing or empty), "
                         f"which llama.cpp's converter writes into the GGUF; {_RESTORE}")
    if isinstance(vocab, dict):
        pairs = list(vocab.items())
    else:  # a Unigram's [piece, score] list: the id is the position
        pairs = [(entry[0] if isinstance(entry, list) and entry else entry, i) for i, entry in enumerate(vocab)]
    _check_ids(file, pairs, vocab_size, "model.vocab")
    if model.get("type") == "BPE" and not model.get("merges") and not (file.parent / "merges.txt").is_file():
        raise ValueError(f"tokenizer file {str(file)!r} is a BPE without merges (its model.merges is empty, and "
                         f"there is no merges.txt): a GGUF of it would not tokenize; {_RESTORE}")
    added = spec.get("added_tokens")
    if not isinstance(added, list) or not all(isinstance(entry, dict) for entry in added):
        raise ValueError(f"tokenizer file {str(file)!r} has no added_tokens list (of {{\"id\": ..., \"content\": "
                         f"...}}), which transformers needs to read it; {_RESTORE}")
    added_pairs = [(entry.get("content"), entry.get("id")) for entry in added]
    _check_ids(file, added_pairs, vocab_size, "added_tokens")
    known = set(pairs)  # an added token that is the vocabulary's own entry (a special token): once
    _check_ids(file, pairs + [pair for pair in added_pairs if pair not in known], vocab_size,
               "model.vocab with added_tokens")


def check_tokenizer(export: str | os.PathLike) -> None:
    """Refuse, in one line naming the file, a tokenizer llama.cpp's converter would fail on or convert wrongly: none
    (no tokenizer.json, tokenizer.model or vocab.json), a JSON file that does not parse, no vocabulary, a BPE without
    merges, an id given to two tokens, an id (the vocabulary's, an added token's, config.json's special ones) at or
    past config.json's ``vocab_size``, a sentencepiece model without the sentencepiece package, a tokenizer.json that
    transformers' AutoTokenizer (which the converter reads it with) does not load."""
    export = Path(export)
    config = read_config(export)
    merged = {**config, **config["text_config"]} if isinstance(config.get("text_config"), dict) else config
    vocab_size = _token_id(merged.get("vocab_size")) or None
    if not any((export / name).is_file() for name in _VOCABULARIES):
        raise ValueError(f"export {str(export)!r} has no tokenizer (no {', '.join(_VOCABULARIES)}), whose vocabulary "
                         "llama.cpp's converter writes into the GGUF; save the tokenizer of the model it was pruned "
                         "from into it (tokenizer.save_pretrained(EXPORT), or lp.export_pruned(..., "
                         "processor=tokenizer))")
    specs = {name: _json_object(export / name) for name in _TOKENIZER_JSON if (export / name).is_file()}
    if "tokenizer.json" in specs:
        _check_tokenizer_json(export / "tokenizer.json", specs["tokenizer.json"], vocab_size)
    if "vocab.json" in specs:
        _check_ids(export / "vocab.json", list(specs["vocab.json"].items()), vocab_size, "the vocabulary")
    if "added_tokens.json" in specs:
        _check_ids(export / "added_tokens.json", list(specs["added_tokens.json"].items()), vocab_size,
                   "the added tokens")
    decoder = specs.get("tokenizer_config.json", {}).get("added_tokens_decoder") or {}
    file = export / "tokenizer_config.json"
    if not isinstance(decoder, dict) or not all(isinstance(entry, dict) for entry in decoder.values()):
        raise ValueError(f"tokenizer file {str(file)!r}: added_tokens_decoder is not {{id: {{\"content\": ...}}}}; "
                         f"{_RESTORE}")
    _check_ids(file, [(entry.get("content"), int(key) if key.isdigit() else key) for key, entry in decoder.items()],
               vocab_size, "added_tokens_decoder")
    for key in _SPECIAL_IDS:
        values = merged.get(key) if isinstance(merged.get(key), list) else [merged.get(key)]
        past = [value for value in values if vocab_size is not None and _token_id(value) is not None and
                value >= vocab_size]
        if past:
            raise ValueError(f"config.json {str(export / 'config.json')!r} has {key} {past[0]}, past its vocab_size "
                             f"{vocab_size}: the GGUF would name a token the model does not have; correct it")
    if (export / "tokenizer.model").is_file():
        _check_sentencepiece(export / "tokenizer.model", vocab_size, only=not specs.keys() & {"tokenizer.json",
                                                                                             "vocab.json"})
    if "tokenizer.json" in specs or "vocab.json" in specs:
        _check_loads(export, vocab_size)


def _check_sentencepiece(file: Path, vocab_size: int | None, only: bool) -> None:
    """tokenizer.model: a sentencepiece model of at most ``vocab_size`` pieces; the package that reads it, when it is
    the export's ``only`` vocabulary."""
    try:
        pieces = _sentencepiece_pieces(file.read_bytes())
    except (OSError, ValueError) as err:
        raise ValueError(f"tokenizer file {str(file)!r} is not a sentencepiece model ({err}); {_RESTORE}") from None
    if not pieces:
        raise ValueError(f"tokenizer file {str(file)!r} holds no pieces: a sentencepiece model without a vocabulary; "
                         f"{_RESTORE}")
    if vocab_size is not None and pieces > vocab_size:
        raise ValueError(f"tokenizer file {str(file)!r} holds {pieces} pieces, more than config.json's vocab_size "
                         f"{vocab_size}, the model's embedding rows (the converter would drop the ones past it): it "
                         "is another model's tokenizer; save the tokenizer of the model the export was pruned from "
                         "into it")
    if only and importlib.util.find_spec("sentencepiece") is None:
        raise ValueError(f"the tokenizer of export {str(file.parent)!r} is a sentencepiece model (tokenizer.model), "
                         "which llama.cpp's converter reads with the sentencepiece package, not installed here; "
                         "install it (pip install -e '.[deploy]', which brings it), or save the tokenizer's tokenizer.json "
                         "into the export")


def _check_loads(export: Path, vocab_size: int | None) -> None:
    """The tokenizer as the converter reads it (``AutoTokenizer.from_pretrained``), and its ids below ``vocab_size``
    (the converter's ``assert``)."""
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        if not verbose():
            warnings.simplefilter("ignore")
        try:
            tokenizer = AutoTokenizer.from_pretrained(export)
            vocab = tokenizer.get_vocab()
        except Exception as err:  # noqa: BLE001 - whatever transformers says, in one line
            raise ValueError(f"the tokenizer of export {str(export)!r} does not load with transformers' AutoTokenizer, "
                             f"which llama.cpp's converter reads it with: {_described(err)}; {_RESTORE}") from err
    last = max(vocab.items(), key=lambda item: item[1], default=None)
    if last is not None and vocab_size is not None and last[1] >= vocab_size:
        raise ValueError(f"the tokenizer of export {str(export)!r} has the token {show(last[0])} at id {last[1]}, past "
                         f"config.json's vocab_size {vocab_size}, the model's embedding rows: it is another model's "
                         "tokenizer; save the tokenizer of the model the export was pruned from into it")


# ---------------------------------------------------------------------------------------------- the run
#: {converter folder: its own gguf-py's modules}, out of ``sys.modules`` between conversions
_OWN_GGUF: dict[str, dict[str, ModuleType]] = {}


def _is_gguf(name: str) -> bool:
    return name == "gguf" or name.startswith("gguf.")


@contextlib.contextmanager
def converter_module(folder: str | os.PathLike) -> Iterator[ModuleType]:
    """llama.cpp's converter module from ``folder`` (:data:`CONVERTER`); inside the block ``gguf`` is the gguf-py
    it was written with (its folder's ``gguf-py``) whatever gguf this process imported, which comes back after it."""
    key = str(Path(folder).resolve())
    process = {name: module for name, module in sys.modules.items() if _is_gguf(name)}
    for name in process:
        del sys.modules[name]
    sys.modules.update(_OWN_GGUF.get(key, {}))
    try:
        yield _load_converter(Path(key))
    finally:
        _OWN_GGUF[key] = {name: module for name, module in sys.modules.items() if _is_gguf(name)}
        for name in _OWN_GGUF[key]:
            del sys.modules[name]
        sys.modules.update(process)


def _load_converter(folder: Path) -> ModuleType:
    """The converter module from ``folder``, imported with ``folder`` first on ``sys.path`` (taken off again with
    the ``gguf-py`` the converter puts there: its packages are imported by then); one of another folder is dropped
    first."""
    script = folder / CONVERTER
    loaded = sys.modules.get("convert_hf_to_gguf")
    if loaded is not None and Path(getattr(loaded, "__file__", None) or "").resolve() != script.resolve():
        for name in [n for n in sys.modules if n in ("convert_hf_to_gguf", "conversion") or
                     n.startswith("conversion.")]:
            del sys.modules[name]
    entries = [str(folder), str(folder / "gguf-py")]
    sys.path.insert(0, entries[0])
    try:
        return importlib.import_module("convert_hf_to_gguf")
    except Exception as err:  # noqa: BLE001 - a missing dependency of the converter: one line
        raise GGUFConversionError(f"cannot import llama.cpp's converter from {entries[0]!r}: {type(err).__name__}: "
                                  f"{_first_line(err)}") from err
    finally:
        sys.path[:] = [entry for entry in sys.path if entry not in entries]


def _first_line(err: BaseException | str) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)


def _described(err: BaseException) -> str:
    """``Type: the first line of its message``; for an error without a message (a bare ``assert``), the source line
    that raised it."""
    if str(err).strip():
        return f"{type(err).__name__}: {_first_line(err)}"
    frames = traceback.extract_tb(err.__traceback__)
    if frames and frames[-1].line:
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}"
        return f"{type(err).__name__}: {frames[-1].line.strip()} ({where})"
    return type(err).__name__


#: the converter's steps, by the function that runs each (the outermost of them in a traceback names the step)
_STEPS = {"load_hparams": "reading config.json", "get_model_architecture": "reading config.json",
          "get_model_class": "reading config.json", "index_tensors": "reading the weights",
          "set_vocab": "reading the tokenizer", "set_gguf_parameters": "reading config.json",
          "prepare_tensors": "converting the tensors", "write_header_to_file": "writing the GGUF",
          "write_kv_data_to_file": "writing the GGUF", "write_ti_data_to_file": "writing the GGUF",
          "write_tensors_to_file": "writing the GGUF"}
#: numpy's ``tofile`` on a full disk: an OSError without an errno
_SHORT_WRITE = re.compile(r"^\d+ requested and \d+ written$")


def _step(err: BaseException) -> str | None:
    """The converter's step ``err`` came from (``reading the tokenizer (set_vocab)``), None when not known."""
    for frame, _ in traceback.walk_tb(err.__traceback__):
        name = frame.f_code.co_name
        step = _STEPS.get(name) or ("reading the tokenizer" if name.startswith("_set_vocab") else None)
        if step is not None:
            return f"{step} ({name})"
    return None


class _WriteError(OSError):
    """The converter's failure to write the staged GGUF, with the errno it had (a short write's found by
    :func:`_write_errno`) and the staged file as its filename. :func:`staging_file` restates a full disk or quota
    (ENOSPC, EDQUOT), a file over the size limit (EFBIG) and an unwritable staged file (EACCES, EROFS, EPERM) as its
    one :class:`OutputDirError` line; any other errno, or none, reaches :func:`convert_to_gguf`, which raises a
    :class:`GGUFConversionError` naming the output."""


def _write_errno(err: OSError, staged: Path) -> int | None:
    """The errno of a failed write to ``staged``: ``err``'s own, else (numpy's short write says none) the one a
    write of one more block gets now (ENOSPC on a full disk, EDQUOT over a quota)."""
    if err.errno is not None:
        return err.errno
    try:
        with open(staged, "ab") as handle:
            handle.write(bytes(1 << 16))
    except OSError as probe:
        return probe.errno
    return None


def _writing(err: OSError, staged: Path, step: str | None) -> bool:
    """Whether ``err`` is the converter's failure to write the staged GGUF, not to read a file (the export's weights
    are read while the GGUF is written)."""
    if err.filename is not None:
        return Path(os.fsdecode(err.filename)).name == staged.name
    return (err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or (step or "").startswith("writing the GGUF")
            or (err.errno is None and _SHORT_WRITE.match(str(err)) is not None))


class _Errors(logging.Handler):
    """Keeps the messages of the converter's ERROR records (what it logs before ``sys.exit(1)``)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().strip())


@contextlib.contextmanager
def _converter_output(quiet: bool, errors: _Errors) -> Iterator[None]:
    """The converter's logging and warnings: its ERROR records kept in ``errors``; when ``quiet``, nothing of it
    shown. The root logger's handlers and level (``logging.basicConfig`` in its ``main``) come back after it."""
    root = logging.getLogger()
    saved_root = root.level, list(root.handlers)
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    saved = [(logger.propagate, list(logger.handlers)) for logger in loggers]
    for logger in loggers:
        logger.addHandler(errors)
        logger.propagate = logger.propagate and not quiet
    try:
        with warnings.catch_warnings():
            if quiet:
                warnings.simplefilter("ignore")
            yield
    finally:
        for logger, (propagate, handlers) in zip(loggers, saved, strict=True):
            logger.propagate, logger.handlers[:] = propagate, handlers
        root.setLevel(saved_root[0])
        root.handlers[:] = saved_root[1]


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """``owner.name`` is ``value`` inside the block; as it was after it (an inherited method: inherited again)."""
    own = name in vars(owner)
    before = vars(owner).get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if own:
            setattr(owner, name, before)
        else:
            delattr(owner, name)


def _text_model(converter: ModuleType) -> type:
    """The converter's class that names the pre-tokenizer (in ``conversion.base`` in newer llama.cpp trees, in the
    converter's own module in older ones)."""
    try:
        from conversion.base import TextModel
    except ImportError:
        TextModel = getattr(converter, "TextModel", None)
    if TextModel is None or not hasattr(TextModel, "get_vocab_base_pre"):
        raise GGUFConversionError("this llama.cpp converter has no TextModel.get_vocab_base_pre to name the "
                                  "pre-tokenizer with; use pre_tokenizer='none' or fetch the pinned one with "
                                  f"`{FETCH}`")
    return TextModel


def _run(converter: ModuleType, export: Path, staged: Path, outtype: str, pre_tokenizer: str) -> str | None:
    """The converter's ``main`` on ``export``, writing ``staged``; returns the pre-tokenizer named here (None: the
    converter named it). Its failures are a :class:`GGUFConversionError` (an OSError, a full disk, stays one)."""
    named: list[str] = []
    errors, quiet = _Errors(), not verbose()
    with contextlib.ExitStack() as stack:
        if pre_tokenizer != "none":
            TextModel = _text_model(converter)
            recognise = TextModel.get_vocab_base_pre

            def get_vocab_base_pre(self, tokenizer):
                log = logging.getLogger("hf-to-gguf")
                level = log.level
                log.setLevel(logging.ERROR)  # its banner about an unknown fingerprint: the result says it
                try:
                    return recognise(self, tokenizer)
                except NotImplementedError:  # the converter's "not recognized": name it as asked
                    named.append(pre_tokenizer)
                    return pre_tokenizer
                finally:
                    log.setLevel(level)

            stack.enter_context(_patched(TextModel, "get_vocab_base_pre", get_vocab_base_pre))
        writer = getattr(getattr(converter, "gguf", None), "GGUFWriter", None)
        if quiet and writer is not None and hasattr(writer, "write_tensors_to_file"):
            write = writer.write_tensors_to_file

            def write_tensors_to_file(self, *, progress: bool = False) -> None:
                return write(self, progress=False)  # its progress bar

            stack.enter_context(_patched(writer, "write_tensors_to_file", write_tensors_to_file))
        # the converter fills "{ftype}"-style fields of the file name as a template: the staged name holds no brace
        # (_check_placement refuses them in the output's name, which the staged name is built from)
        stack.enter_context(_patched(sys, "argv", [CONVERTER, str(export), "--outfile", str(staged), "--outtype",
                                                   outtype]))
        stack.enter_context(_converter_output(quiet, errors))
        if quiet:  # its main's logging.basicConfig(level=INFO) would print every INFO record of the process
            stack.enter_context(_patched(logging, "basicConfig", lambda *args, **kwargs: None))
        try:
            converter.main()
        except SystemExit as err:
            if err.code not in (0, None):
                said = errors.messages[-1] if errors.messages else f"exit status {err.code}"
                raise GGUFConversionError(f"llama.cpp's converter refused {str(export)!r}: {_first_line(said)}") \
                    from None
        except Exception as err:  # noqa: BLE001 - the converter's own failure, restated in one line
            step = _step(err)
            if isinstance(err, OSError) and _writing(err, staged, step):
                code = _write_errno(err, staged)
                raise _WriteError(code, _first_line(err) if code is None else os.strerror(code), str(staged)) \
                    from err
            hint = ""
            if "pre-tokenizer was not recognized" in str(err):
                hint = "; name the tokenizer's pre-tokenizer with --pre-tokenizer NAME (pre_tokenizer=NAME)"
            elif isinstance(err, ModuleNotFoundError) and err.name == "sentencepiece":
                hint = "; install it (pip install -e '.[deploy]', which brings it)"
            elif isinstance(err, ModuleNotFoundError) and err.name:
                hint = f"; install it (pip install {err.name})"
            during = f" while {step}" if step else ""
            raise GGUFConversionError(f"llama.cpp's converter failed on {str(export)!r}{during}: {_described(err)}"
                                      f"{hint}") from err
    return named[0] if named else None


def _tensor_count(file: Path, export: Path) -> int:
    """The tensor count in a GGUF file's header (magic ``GGUF``, version, tensor count)."""
    with open(file, "rb") as handle:
        head = handle.read(16)
    if len(head) < 16 or head[:4] != b"GGUF":
        raise GGUFConversionError(f"llama.cpp's converter wrote no GGUF for {str(export)!r} ({len(head)} bytes "
                                  f"starting {head[:4]!r})")
    return int.from_bytes(head[8:16], "little")


def convert_to_gguf(export_dir: str | os.PathLike, outfile: str | os.PathLike, *, outtype: str = "f32",
                    pre_tokenizer: str = "auto", llama_cpp: str | os.PathLike | None = None, overwrite: bool = False,
                    remedy: str = "pass overwrite=True to replace it") -> GGUFResult:
    """Convert the uniform export at ``export_dir`` to the GGUF file ``outfile`` with llama.cpp's converter (see
    the module docstring for what is checked first, and in which order).

    Args:
        export_dir: the export's folder (config.json, safetensors weights, tokenizer).
        outfile: the GGUF file to write; its folder must exist; never inside ``export_dir``.
        outtype: the converter's ``--outtype`` (``f32``, ``f16``, ``bf16``, ``q8_0``, ...: its own list).
        pre_tokenizer: ``auto``, ``none`` or a llama.cpp pre-tokenizer name (module docstring).
        llama_cpp: the folder holding ``convert_hf_to_gguf.py`` (default: ``$LLAMA_CPP_DIR``, else the fetched one).
        overwrite: replace an existing ``outfile`` once the new one is complete; ``True`` or ``False`` (anything
            else, ``"no"`` included, is refused: :func:`~lightprune.core.checks.check_bool`).
        remedy: the end of the error for an existing ``outfile`` (how the caller's user replaces it).

    Returns the :class:`GGUFResult`. Every refusal is one line (ValueError, FileExistsError, FileNotFoundError,
    IsADirectoryError, ...). A failed write of the staged GGUF that is a full disk or quota (ENOSPC, EDQUOT), a file
    over the size limit (EFBIG) or an unwritable file or folder (EACCES, EROFS, EPERM) is an
    :class:`~lightprune.checkpoints.staging.OutputDirError`; whatever else the converter raises (another write error
    included) a :class:`GGUFConversionError` (its error as ``__cause__``).
    """
    start = time.perf_counter()
    overwrite = check_bool(overwrite, "overwrite")  # "no" is a truthy string: never read as a truth value
    export = checkpoint_directory(Path(export_dir).expanduser()).absolute()
    _check_placement(export, outfile)
    out = check_out_file(outfile, overwrite, remedy)
    if os.path.lexists(export / WIDTH_PLAN_FILE):
        _refuse_width(export)
    folder = find_converter(llama_cpp)
    where = f"of the --outtype choices of llama.cpp's converter in {str(folder)!r}"
    outtype = _choice("outtype", outtype, converter_outtypes(folder), where)
    where = f"llama.cpp knows (the names its converter in {str(folder)!r} writes as tokenizer.ggml.pre)"
    if pre_tokenizer not in ("auto", "none"):
        pre_tokenizer = _choice("pre-tokenizer", pre_tokenizer, converter_pre_tokenizers(folder), where,
                                also=("auto", "none"))
    _check_weight_files(export)
    _checked_export(export)
    check_tokenizer(export)
    if pre_tokenizer == "auto":
        tokenizer_json = export / "tokenizer.json"
        pre_tokenizer = "gpt-2" if tokenizer_json.is_file() and gpt2_byte_level(tokenizer_json) else "none"
        if pre_tokenizer != "none":
            _choice("pre-tokenizer (auto)", pre_tokenizer, converter_pre_tokenizers(folder), where)
    kept = "is as it was" if os.path.lexists(out) else "was not created"
    try:
        with converter_module(folder) as converter, staging_file(out, overwrite, remedy) as staged:
            named = _run(converter, export, staged, outtype, pre_tokenizer)
            tensors = _tensor_count(staged, export)
    except _WriteError as err:  # a write failure staging_file does not restate (not a full disk)
        said = _described(err.__cause__ or err)
        if err.errno is not None and os.strerror(err.errno) not in said:
            said += f" ({os.strerror(err.errno).lower()})"
        raise GGUFConversionError(f"llama.cpp's converter could not write the GGUF {str(out)!r}: {said}; nothing "
                                  f"was written, {str(out)!r} {kept}") from err.__cause__
    return GGUFResult(path=out, size=out.stat().st_size, tensors=tensors, outtype=outtype, pre_tokenizer=named,
                      seconds=time.perf_counter() - start)
