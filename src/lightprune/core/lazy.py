"""Package attributes imported from their submodules on first use (PEP 562), so that importing a light module of a
package (``lightprune.experts.plan``) does not import the package's heavy ones (torch, the calibration pass)."""

from __future__ import annotations

import importlib
from typing import Any, Callable

__all__ = ["lazy_attributes", "lazy_package"]


def lazy_attributes(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose attribute ``name`` is ``names[name]``'s (a submodule)."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__


def lazy_package(package: str, names: dict[str, str]) -> list[str]:
    """Install `lazy_attributes`' ``__getattr__`` and ``__dir__`` in ``package`` (called from its
    ``__init__``: ``__all__ = lazy_package(__name__, _NAMES)``) and return its ``__all__``, the names sorted."""
    namespace = importlib.import_module(package).__dict__
    namespace["__getattr__"], namespace["__dir__"] = lazy_attributes(package, names)
    return sorted(names)
