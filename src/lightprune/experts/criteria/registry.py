"""The criterion registry: one name -> one :class:`~lightprune.experts.criteria.base.Criterion` class.

Built-in criteria are declared here by name and module (imported on first use: the command line checks a name
without torch) and register themselves with the decorator when their module loads; project-local criteria
(``callbacks/`` of a project, a notebook) register with the same decorator and are then usable by name everywhere
(``lp.score_weights``, configs)::

    @lp.register_criterion("my_norm")
    class MyNorm(lp.criteria.Criterion):
        def score_layer(self, layer):
            return layer.router_linear.weight.abs().sum(dim=1)

Names are lower-case snake case (``[a-z][a-z0-9_]*``). Registering a name twice is an error unless it is the same
class again (also after a module reload: same module and qualified name), which replaces the entry.
:func:`get_criterion` also accepts a class, an instance or a dotted import path ``"package.module.ClassName"`` (what
a config's ``class_path`` holds).

Torch-free: this module imports only the registry class (the criteria's base class when one registers).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, TypeVar

from lightprune.core.registry import Registry

__all__ = ["CRITERIA", "register_criterion", "unregister_criterion", "get_criterion", "get_criterion_class",
           "available_criteria"]

_HINT = " (or a dotted import path 'package.module.ClassName')"


def _base() -> type:
    from lightprune.experts.criteria.base import Criterion

    return Criterion


def _check(name: str, cls: Any) -> None:
    if not (isinstance(cls, type) and issubclass(cls, _base())):
        raise TypeError(f"@register_criterion({name!r}) decorates Criterion subclasses, got {cls!r}")


#: criterion name -> class
CRITERIA: Registry[type] = Registry("criterion", check=_check, hint=_HINT)

_PACKAGE = "lightprune.experts.criteria"
for _name, _where in (
        ("aimer", "aimer:AIMER"), ("magnitude", "magnitude:Magnitude"), ("router_norm", "router_norm:RouterNorm"),
        ("random", "random:RandomCriterion"), ("frequency", "calibration:Frequency"), ("seer", "calibration:Seer"),
        ("ean", "calibration:Ean"), ("reap", "calibration:Reap"), ("routing_kl", "calibration:RoutingKl"),
        ("delta_h", "calibration:DeltaH"), ("delta_h_promoted", "calibration:DeltaHPromoted"),
        ("maep", "calibration:MAEP"), ("router_delta", "calibration:RouterDeltaCriterion"),
        ("hc_smoe", "merge_methods:HCSMoE"), ("m_smoe", "merge_methods:MSMoE")):
    CRITERIA.declare(_name, f"{_PACKAGE}.{_where}")

C = TypeVar("C", bound=type)


def register_criterion(name: str) -> Callable[[C], C]:
    """Class decorator: register a :class:`Criterion` subclass under ``name`` and set ``cls.name``."""
    register = CRITERIA.decorator(name)

    def decorator(cls: C) -> C:
        register(cls)
        cls.name = name
        return cls

    return decorator


def unregister_criterion(name: str) -> type:
    """Remove ``name`` from the registry and return its class (for tests and notebooks)."""
    return CRITERIA.unregister(name)


def available_criteria(needs_data: bool | None = None) -> list[str]:
    """Sorted registered names; ``needs_data=False`` lists the weight-only ones, True the calibration ones (these
    two import the built-in criteria)."""
    if needs_data is None:
        return CRITERIA.names()
    return [name for name, cls in CRITERIA.items() if cls.needs_data == needs_data]


def _import_path(path: str) -> type:
    module_name, _, attr = path.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import criterion {path!r}: {err}") from err
    if not (isinstance(obj, type) and issubclass(obj, _base())):
        raise TypeError(f"{path!r} is {obj!r}, not a Criterion subclass")
    return obj


def get_criterion_class(criterion: str | type) -> type:
    """The class for a registered name, a dotted import path or a class."""
    if isinstance(criterion, type):
        if not issubclass(criterion, _base()):
            raise TypeError(f"{criterion!r} is not a Criterion subclass")
        return criterion
    if not isinstance(criterion, str):
        raise TypeError(f"criterion must be a name, a Criterion subclass or instance, got {criterion!r}")
    if criterion in CRITERIA or "." not in criterion:
        return CRITERIA.get(criterion)
    return _import_path(criterion)


def get_criterion(criterion: Any, **kwargs: Any) -> Any:
    """An instance of ``criterion`` (a name, a dotted path, a class or an instance, returned as is) built with
    ``kwargs``.

    Unknown names are an error listing :func:`available_criteria`; arguments the constructor does not take are an
    error listing the ones it does.
    """
    if isinstance(criterion, _base()):
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
