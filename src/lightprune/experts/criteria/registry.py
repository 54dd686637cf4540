"""The criterion registry: one name -> one :class:`~lightprune.experts.criteria.base.Criterion` class.

Built-in criteria register themselves on import of :mod:`lightprune.experts.criteria`; project-local
criteria (``callbacks/`` of a project, a notebook) register with the same decorator and are
then usable by name everywhere (``lp.score_weights``, configs)::

    @lp.register_criterion("my_norm")
    class MyNorm(lp.criteria.Criterion):
        def score_layer(self, layer):
            return layer.router_linear.weight.abs().sum(dim=1)

Names are lower-case snake case (``[a-z][a-z0-9_]*``). Registering a name twice is an error
unless it is the same class again (also after a module reload: same module and qualified
name), which replaces the entry. :func:`get_criterion` also accepts a class, an instance or a
dotted import path ``"package.module.ClassName"`` (what a config's ``class_path`` holds).
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any, Callable, TypeVar

from lightprune.experts.criteria.base import Criterion

__all__ = ["register_criterion", "unregister_criterion", "get_criterion", "get_criterion_class",
           "available_criteria"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_REGISTRY: dict[str, type[Criterion]] = {}

C = TypeVar("C", bound=type)


def _same_class(a: type, b: type) -> bool:
    return a is b or (a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__)


def register_criterion(name: str) -> Callable[[C], C]:
    """Class decorator: register a :class:`Criterion` subclass under ``name`` and set ``cls.name``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"criterion name must be lower-case snake case matching {_NAME.pattern!r}, got {name!r}")

    def decorator(cls: C) -> C:
        if not (isinstance(cls, type) and issubclass(cls, Criterion)):
            raise TypeError(f"@register_criterion({name!r}) decorates Criterion subclasses, got {cls!r}")
        existing = _REGISTRY.get(name)
        if existing is not None and not _same_class(existing, cls):
            raise ValueError(f"criterion name {name!r} is already registered to "
                             f"{existing.__module__}.{existing.__qualname__}; choose another name "
                             f"or unregister_criterion({name!r}) first")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def unregister_criterion(name: str) -> type[Criterion]:
    """Remove ``name`` from the registry and return its class (for tests and notebooks)."""
    try:
        return _REGISTRY.pop(name)
    except KeyError:
        raise KeyError(f"no criterion named {name!r}; registered: {', '.join(available_criteria())}") from None


def available_criteria(needs_data: bool | None = None) -> list[str]:
    """Sorted registered names; ``needs_data=False`` lists the weight-only ones, True the calibration ones."""
    return sorted(n for n, cls in _REGISTRY.items() if needs_data is None or cls.needs_data == needs_data)


def _import_path(path: str) -> type[Criterion]:
    module_name, _, attr = path.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import criterion {path!r}: {err}") from err
    if not (isinstance(obj, type) and issubclass(obj, Criterion)):
        raise TypeError(f"{path!r} is {obj!r}, not a Criterion subclass")
    return obj


def get_criterion_class(criterion: str | type[Criterion]) -> type[Criterion]:
    """The class for a registered name, a dotted import path or a class."""
    if isinstance(criterion, type):
        if not issubclass(criterion, Criterion):
            raise TypeError(f"{criterion!r} is not a Criterion subclass")
        return criterion
    if not isinstance(criterion, str):
        raise TypeError(f"criterion must be a name, a Criterion subclass or instance, got {criterion!r}")
    if criterion in _REGISTRY:
        return _REGISTRY[criterion]
    if "." in criterion:
        return _import_path(criterion)
    raise ValueError(f"unknown criterion {criterion!r}; available: {', '.join(available_criteria())} "
                     "(or a dotted import path 'package.module.ClassName')")


def get_criterion(criterion: str | type[Criterion] | Criterion, **kwargs: Any) -> Criterion:
    """An instance of ``criterion`` built with ``kwargs`` (an instance is returned as is).

    Unknown names are an error listing :func:`available_criteria`; arguments the constructor
    does not take are an error listing the ones it does.
    """
    if isinstance(criterion, Criterion):
        if kwargs:
            raise ValueError(f"got arguments {sorted(kwargs)} for an already built criterion {criterion!r}")
        return criterion
    cls = get_criterion_class(criterion)
    signature = inspect.signature(cls)
    try:
        signature.bind(**kwargs)
    except TypeError as err:
        allowed = [p for p in signature.parameters if p not in ("args", "kwargs")]
        raise TypeError(f"criterion {cls.name or cls.__name__!r}: {err}; its arguments are: "
                        f"{', '.join(allowed) if allowed else '(none)'}") from None
    return cls(**kwargs)
