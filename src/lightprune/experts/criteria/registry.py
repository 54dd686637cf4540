"""The criterion registry: one name -> one :class:`~lightprune.experts.criteria.base.Criterion` class.

Built-in criteria are declared here by name and module (imported on first use: the command line checks a name
without torch) and register themselves with the decorator when their module loads; project-local criteria
(``callbacks/`` of a project, a notebook) register with the same decorator and are then usable by name everywhere
(``lp.score_weights``, configs)::

    @lp.register_criterion("my_norm")
    class MyNorm(lp.Criterion):
        def score_layer(self, layer):
            return layer.router_linear.weight.abs().sum(dim=1)

Names are lower-case snake case (``[a-z][a-z0-9_]*``). Registering a name twice is an error unless it is the same
class again (also after a module reload: same module and qualified name), which replaces the entry.
:func:`get_criterion` also accepts a class, an instance or a dotted import path ``"package.module.ClassName"`` (what
a config's ``class_path`` holds).

Torch-free: this module imports only the registry class (the criteria's base class when one registers).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from lightprune.core.registry import Registry

__all__ = ["CRITERIA", "register_criterion", "unregister_criterion", "get_criterion", "get_criterion_class",
           "available_criteria"]

_HINT = " (or a dotted import path 'package.module.ClassName')"


def _base() -> type:
    from lightprune.experts.criteria.base import Criterion

    return Criterion


#: criterion name -> class
CRITERIA: Registry[type] = Registry("criterion", base=_base, hint=_HINT, name_attribute="name",
                                    clash="choose another name or unregister_criterion({name!r}) first")

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
    return CRITERIA.decorator(name)


def unregister_criterion(name: str) -> type:
    """Remove ``name`` from the registry and return its class (for tests and notebooks)."""
    return CRITERIA.unregister(name)


def available_criteria(needs_data: bool | None = None) -> list[str]:
    """Sorted registered names; ``needs_data=False`` lists the weight-only ones, True the calibration ones (these
    two import the built-in criteria)."""
    if needs_data is None:
        return CRITERIA.names()
    return [name for name, cls in CRITERIA.items() if cls.needs_data == needs_data]


def get_criterion_class(criterion: str | type) -> type:
    """The class for a registered name, a dotted import path or a class."""
    return CRITERIA.resolve(criterion)


def get_criterion(criterion: Any, **kwargs: Any) -> Any:
    """An instance of ``criterion`` (a name, a dotted path, a class or an instance, returned as is) built with
    ``kwargs``.

    Unknown names are an error listing :func:`available_criteria`; arguments the constructor does not take are an
    error listing the ones it does.
    """
    return CRITERIA.build(criterion, **kwargs)
