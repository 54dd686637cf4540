"""What a job's ``class_path`` slots accept, checked before anything is imported.

A ``class_path`` given as the model, the data, a ``trainer.callbacks`` entry, ExpertPruning's criterion or Evaluate's
data is refused by the first pass, before its module is imported, when it cannot be what the slot accepts: a name of
Python's standard library (``os.system``, ``subprocess.Popen``), a module that does not exist, or a name that its
module's source (read, never run) binds only to a function or to a class with no base, or does not bind at all.
Whatever the source does not settle (a class with a base, a name bound at run time) is left to the parser, which
imports it and refuses a class outside the slot without building it. Torch-free.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import sysconfig
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any, Iterator

from lightprune.callbacks.options import OPTIONS
from lightprune.cli.names import did_you_mean

__all__ = ["ACCEPTS", "class_path_of", "class_path_problem", "config_slots"]

#: slot -> what it accepts (the words of the refusal)
ACCEPTS = {
    "model": "a LightningModule (lightprune.finetune.MoECausalLM or a subclass)",
    "data": "a LightningDataModule subclass",
    "callback": "a lightning.pytorch.Callback subclass",
    "criterion": "a registered criterion name or a lightprune Criterion subclass",
}
#: names whose use lets a module bind names its source does not show (core.lazy.lazy_package installs a __getattr__)
_DYNAMIC = frozenset({"__getattr__", "lazy_package", "globals", "vars", "exec", "eval", "setattr", "__dict__",
                      "modules"})
_MISSING = "missing"


def class_path_of(value: Any) -> str | None:
    """The ``class_path`` a slot's value names (a dotted string or a mapping's ``class_path``), else None. A config
    file given for a group (``--model model.yaml``) is not one."""
    path = value.get("class_path") if isinstance(value, dict) else value
    if not isinstance(path, str) or "." not in path or path.endswith((".yaml", ".yml", ".json")):
        return None
    return path


def class_path_problem(value: Any, slot: str) -> str | None:
    """Why ``value`` (a slot's value: a class path or a ``class_path`` mapping) cannot be a class of ``slot`` (a key
    of `ACCEPTS`), as the end of a line; None when only importing it can tell."""
    path = class_path_of(value)
    if path is None:
        return None
    module, _, name = path.rpartition(".")
    if not all(part.isidentifier() for part in path.split(".")):
        reason = "not a dotted import path"
    elif _standard_library(path.split(".", 1)[0]):
        reason = "it names Python's standard library"
    elif module == "lightprune.callbacks":  # its names are imported on first use: its source binds none of them
        reason = None if name in OPTIONS else f"lightprune.callbacks has no {name!r}{did_you_mean(name, OPTIONS)}"
    else:
        reason = _source_problem(module, name)
    return None if reason is None else f"{path!r} is not {ACCEPTS[slot]}: {reason}; it was not loaded"


def config_slots(content: dict[str, Any]) -> Iterator[tuple[str, Any, str]]:
    """(key, value, slot) for each slot of a config mapping: its model and data, each callback, ExpertPruning's
    criterion and Evaluate's data."""
    for key in ("model", "data"):
        if key in content:
            yield key, content[key], key
    trainer = content.get("trainer")
    callbacks = trainer.get("callbacks") if isinstance(trainer, dict) else None
    for entry in callbacks if isinstance(callbacks, list) else [callbacks] if callbacks else []:
        yield "trainer.callbacks", entry, "callback"
        path = class_path_of(entry) or (entry if isinstance(entry, str) else None)
        init_args = entry.get("init_args") if isinstance(entry, dict) else None
        name = path.rsplit(".", 1)[-1] if path else None
        if isinstance(init_args, dict) and name in ("ExpertPruning", "Evaluate"):
            argument, slot = ("criterion", "criterion") if name == "ExpertPruning" else ("data", "data")
            if argument in init_args:
                yield f"{name}.{argument}", init_args[argument], slot


def _standard_library(top: str) -> bool:
    """Whether ``top`` is a module of Python's standard library as ``import`` finds it (not a project module that
    shadows one from the working directory)."""
    if top not in sys.stdlib_module_names:
        return False
    spec = _spec(top)
    origin = getattr(spec, "origin", None)
    if origin in ("built-in", "frozen") or spec is None:
        return True
    folders = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}
    return isinstance(origin, str) and any(Path(origin).is_relative_to(folder) for folder in folders)


def _spec(module: str) -> Any:
    """The module's spec, found as ``import`` would find it (the working directory first, as the command puts it on
    ``sys.path``) without running any module's code; `_MISSING` when its top-level package does not exist,
    None when it cannot be found without importing, or is loaded without a spec (a script's or a notebook's
    ``__main__``)."""
    parts = module.split(".")
    loaded = sys.modules.get(parts[0])
    if loaded is not None:
        spec = getattr(loaded, "__spec__", None)
        if spec is None:  # loaded, but from nowhere import can look: only the parser's import can tell
            return None
    else:
        try:
            spec = PathFinder.find_spec(parts[0], [os.getcwd()]) or importlib.util.find_spec(parts[0])
        except (ImportError, ValueError, AttributeError):
            return None
        if spec is None:
            return _MISSING
    for i in range(1, len(parts)):
        locations = spec.submodule_search_locations
        spec = PathFinder.find_spec(".".join(parts[:i + 1]), list(locations)) if locations else None
        if spec is None:  # an attribute of its parent, maybe: only importing it tells
            return None
    return spec


def _module_level(nodes: Iterator[ast.AST]) -> Iterator[ast.AST]:
    """Every node a module's own code runs, without the bodies of its functions and classes."""
    for node in nodes:
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            yield from _module_level(ast.iter_child_nodes(node))


def _bindings(tree: ast.Module) -> dict[str, list[str]] | None:
    """name -> what the module's code binds it to ("function": without a decorator or a return annotation, "plain
    class": without a base or a decorator; "other", as is a name a function declares ``global``: it may bind it when
    called), or None when the module can bind names its source does not show (``__getattr__``, ``globals()``,
    ``import *``)."""
    if any(getattr(node, "id", getattr(node, "attr", None)) in _DYNAMIC for node in ast.walk(tree)):
        return None
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            for name in node.names:
                found.setdefault(name, []).append("other")
    for node in _module_level(iter(tree.body)):
        if isinstance(node, ast.ClassDef):
            plain = not (node.bases or node.keywords or node.decorator_list)
            found.setdefault(node.name, []).append("plain class" if plain else "other")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):  # one that says it returns a class the
            # slot accepts is taken as that class by the parser
            found.setdefault(node.name, []).append("other" if node.decorator_list or node.returns else "function")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                found.setdefault((alias.asname or alias.name).split(".")[0], []).append("other")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.setdefault(node.id, []).append("other")
    return None if "__getattr__" in found else found


def _source_problem(module: str, name: str) -> str | None:
    """Why ``module.name`` is no class with a base, read from the module's source; None when the source cannot
    tell (or cannot be read)."""
    spec = _spec(module)
    if spec is _MISSING:
        top = module.split(".", 1)[0]
        return f"no module named {top!r}{did_you_mean(top, ('lightprune', 'lightning', 'torch', 'transformers'))}"
    if spec is None or not spec.has_location or not str(spec.origin).endswith(".py"):
        return None
    try:
        bindings = _bindings(ast.parse(Path(spec.origin).read_text(encoding="utf-8")))
    except (OSError, SyntaxError, ValueError):
        return None
    if bindings is None:
        return None
    kinds = bindings.get(name)
    if not kinds:
        locations = spec.submodule_search_locations
        if locations and PathFinder.find_spec(f"{module}.{name}", list(locations)) is not None:
            return f"{module}.{name} is a module"
        return f"module {module!r} has no {name!r}{did_you_mean(name, [n for n in bindings if n[:1] != '_'])}"
    if set(kinds) == {"function"}:
        return f"{module}.{name} is a function"
    if set(kinds) == {"plain class"}:
        return f"class {module}.{name} has no base class"
    return None
