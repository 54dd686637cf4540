"""Families declared as table rows: a family whose transformers router is another family's computation (its forward,
line for line, and the same rule for which layers are sparse) and that differs from it only in settings (model type,
expert-count key, multimodal flag, vision token keys, language-model type, attribute names, ...) is one row,
``base family + settings``, not a class body::

    Glm4vMoeFamily = family_row(__name__, DeepseekV3Family, "glm4v_moe", "GLM-4.5V / 4.6V ...",
                                multimodal=True, vision_token_keys=("image_token_id", "video_token_id"))

The row is a subclass of ``base`` (so ``isinstance`` and the method resolution order are those of a class body), named
after the model type (``glm4v_moe`` -> ``Glm4vMoeFamily``) unless ``name`` says otherwise. A setting overrides a data
attribute ``base`` already has; a family that needs a method of its own is a class.
"""

from __future__ import annotations

from typing import Any

from lightprune.models.base import MoEFamily

__all__ = ["family_row", "row_name"]


def row_name(model_type: str) -> str:
    """The class name a row gets from its model type: each ``_``-separated part capitalised, then ``Family``."""
    return "".join(part.capitalize() for part in model_type.split("_")) + "Family"


def _is_setting(base: type, key: str) -> bool:
    """Whether ``key`` names a data attribute of ``base`` (not a method, property or dunder): what a row may set."""
    if key.startswith("__") or key == "model_types":
        return False
    for klass in base.__mro__:
        if key in vars(klass):
            value = vars(klass)[key]
            return not (callable(value) or isinstance(value, (property, staticmethod, classmethod)))
    return False


def family_row(module: str, base: type[MoEFamily], model_type: str, doc: str, *, name: str | None = None,
               **settings: Any) -> type[MoEFamily]:
    """The family of ``model_type`` that routes exactly as ``base`` with ``settings`` (class attributes of ``base``)
    replaced; defined in ``module`` (the caller's ``__name__``), documented by ``doc``, named ``name`` or
    `row_name` of the model type. It is not registered (``register_family`` does that)."""
    if not (isinstance(base, type) and issubclass(base, MoEFamily)):
        raise TypeError(f"family_row: base must be a MoEFamily subclass, got {base!r}")
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"family_row: model_type must be a non-empty string, got {model_type!r}")
    if not isinstance(doc, str) or not doc.strip():
        raise ValueError(f"family_row {model_type!r}: say in doc which router it shares with {base.__name__}, "
                         f"got {doc!r}")
    name = row_name(model_type) if name is None else name
    if not name.isidentifier() or not name.endswith("Family"):
        raise ValueError(f"family_row {model_type!r}: name must be an identifier ending in 'Family', got {name!r}")
    unknown = [key for key in settings if not _is_setting(base, key)]
    if unknown:
        raise TypeError(f"family_row {model_type!r}: {', '.join(map(repr, unknown))} not a setting of "
                        f"{base.__name__} (a data attribute it has; a method needs a class)")
    return type(name, (base,), {"__module__": module, "__doc__": doc, "__qualname__": name,
                                "model_types": (model_type,), **settings})
