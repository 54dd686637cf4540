"""llama.cpp's Hugging Face to GGUF converter: where it is (`converter_dir`, `find_converter`), what it
accepts, read from its source (`converter_outtypes`, `converter_pre_tokenizers`), and its module
imported with the gguf-py it was written with (`converter_module`)."""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from lightprune.core.errors import register_error
from lightprune.core.jsonio import show

__all__ = ["LLAMA_CPP_VERSION", "CONVERTER", "FETCH", "OWN_GGUF", "GGUFConversionError", "converter_dir",
           "find_converter", "converter_outtypes", "converter_pre_tokenizers", "converter_module", "choice",
           "first_line"]

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


@register_error
class GGUFConversionError(RuntimeError):
    """llama.cpp's converter failed on an export that passed lightprune's checks (an architecture it does not
    convert, a tokenizer it does not recognise): the message is one line, ``__cause__`` the converter's error."""



def converter_dir(root: str | os.PathLike | None = None) -> Path:
    """Where the converter is: ``$LLAMA_CPP_DIR``, else the folder ``scripts/fetch_llama_cpp.py`` fills under
    ``root`` (``$LIGHTPRUNE_CACHE``, ``~/.cache/lightprune``)."""
    if os.environ.get("LLAMA_CPP_DIR") and root is None:
        return Path(os.environ["LLAMA_CPP_DIR"]).expanduser()
    base = Path(root or os.environ.get("LIGHTPRUNE_CACHE") or Path.home() / ".cache" / "lightprune").expanduser()
    return base / "llama.cpp" / f"llama-cpp-python-{LLAMA_CPP_VERSION}"


def find_converter(llama_cpp: str | os.PathLike | None = None) -> Path:
    """The absolute folder holding `CONVERTER`: ``llama_cpp``, else `converter_dir`; a
    FileNotFoundError saying how to fetch it when it is not there, or when the folder lacks the gguf-py package
    beside it (`OWN_GGUF`): the converter would then import whatever ``gguf`` is installed, of another version,
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


def choice(what: str, value: Any, allowed: tuple[str, ...], where: str, also: tuple[str, ...] = ()) -> str:
    """``value`` when it is one of ``allowed`` or ``also``; else a ValueError naming it, with a "did you mean" for
    a close one (or the list)."""
    if isinstance(value, str) and (value in allowed or value in also):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {show(value)}")
    close = difflib.get_close_matches(value.lower(), [*also, *allowed], n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(map(repr, close))}?" if close else f"the choices: {', '.join([*also, *allowed])}"
    raise ValueError(f"{what} {value!r} is not one {where}; {hint}")




# ---------------------------------------------------------------------------------------------- its import
#: {converter folder: its own gguf-py's modules}, out of ``sys.modules`` between conversions
_OWN_GGUF: dict[str, dict[str, ModuleType]] = {}


def _is_gguf(name: str) -> bool:
    return name == "gguf" or name.startswith("gguf.")


@contextlib.contextmanager
def converter_module(folder: str | os.PathLike) -> Iterator[ModuleType]:
    """llama.cpp's converter module from ``folder`` (`CONVERTER`); inside the block ``gguf`` is the gguf-py
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
                                  f"{first_line(err)}") from err
    finally:
        sys.path[:] = [entry for entry in sys.path if entry not in entries]



def first_line(err: BaseException | str) -> str:
    """The first non-blank line of ``err``'s message (its type's name when it has none)."""
    return next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
