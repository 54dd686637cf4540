"""The model-family registry: ``config.model_type`` -> the [`MoEFamily`][..base.MoEFamily] that knows it,
on the project's one registry class (`lightprune.core.registry.Registry`, any non-empty model type).

Built-in families register when `lightprune.models` is imported; a project adds its own with the same
call (docs/extending/family.md)::

    @lp.register_family
    class MyMoeFamily(MoEFamily):
        model_types = ("my_moe",)
        ...

Registering a model type twice is an error unless it is the same class again (also after a module reload:
same module and qualified name); a family's model types register all or none. Model types whose structure cannot
be pruned exactly yet are listed in [`REFUSED`][] with the reason, and [`get_family`][] says it instead of
"unsupported"; registering a refused type lifts its refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from torch import nn

from lightprune.core.registry import Registry
from lightprune.models.base import MoEFamily

__all__ = ["FAMILIES", "REFUSED", "register_family", "unregister_family", "refuse_family", "get_family",
           "supported_model_types", "family_table", "ADD_A_FAMILY"]

#: where a user reads how to add a family
ADD_A_FAMILY = "see lightprune's documentation, docs/extending/family.md (lp.register_family)"


def _check_family(model_type: str, cls: Any) -> None:
    if not (isinstance(cls, type) and issubclass(cls, MoEFamily)):
        raise TypeError(f"register_family takes MoEFamily subclasses, got {cls!r}")


_REGISTRY: Registry[type[MoEFamily]] = Registry("model_type", check=_check_family, pattern=None,
                                                hint=f"; to add one, {ADD_A_FAMILY}",
                                                clash="unregister_family({name!r}) first")


#: model type -> family class (read-only: register_family / unregister_family change it)
FAMILIES: Mapping[str, type[MoEFamily]] = _REGISTRY.view()
#: model type -> why lightprune cannot prune it exactly yet
REFUSED: dict[str, str] = {}

F = TypeVar("F", bound=type)


def register_family(cls: F) -> F:
    """Class decorator: make ``cls`` the family of every model type in ``cls.model_types``."""
    _check_family("", cls)
    if not cls.model_types or not all(isinstance(t, str) and t for t in cls.model_types):
        raise ValueError(f"{cls.__name__}.model_types must name at least one config.model_type, "
                         f"got {cls.model_types!r}")
    _REGISTRY.register_all(tuple(cls.model_types), cls)  # every type checked before any registers
    for model_type in cls.model_types:
        REFUSED.pop(model_type, None)
    return cls


def unregister_family(model_type: str) -> type[MoEFamily]:
    """Remove ``model_type`` from the registry and return its class (for tests and notebooks)."""
    if model_type not in _REGISTRY:
        raise KeyError(f"no family for model_type {model_type!r}; registered: {supported_model_types()}")
    return _REGISTRY.unregister(model_type)


def refuse_family(model_type: str, reason: str) -> None:
    """Record that ``model_type`` cannot be pruned exactly yet, and why (the error says it)."""
    REFUSED[model_type] = reason


def supported_model_types() -> list[str]:
    return _REGISTRY.names()


def get_family(model: nn.Module) -> MoEFamily:
    """The family of ``model``; a refused or unknown ``model_type`` is an error that says why and what to do."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type in REFUSED:
        raise ValueError(f"lightprune cannot prune model_type {model_type!r} exactly yet: {REFUSED[model_type]}")
    if model_type not in FAMILIES:
        raise ValueError(f"unsupported model_type {model_type!r}; lightprune supports: "
                         f"{', '.join(supported_model_types())}; to add one, {ADD_A_FAMILY}")
    return FAMILIES[model_type](model)


def family_table() -> str:
    """Markdown: every registered model type with its family class and routing, then the refused ones and why."""
    rows = ["| model type | family | routing | shared experts (when present) | multimodal |", "|---|---|---|---|---|"]
    for model_type, cls in FAMILIES.items():
        shared = ", ".join(f"`{a}`" for a in cls.shared_attrs) or "-"
        rows.append(f"| `{model_type}` | `{cls.__name__}` | {cls.routing} | {shared} | "
                    f"{'yes' if cls.multimodal else 'no'} |")
    if REFUSED:
        rows += ["", "| refused model type | why |", "|---|---|"]
        rows += [f"| `{t}` | {REFUSED[t]} |" for t in sorted(REFUSED)]
    return "\n".join(rows) + "\n"
