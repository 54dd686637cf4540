"""The criteria, declared in one table: one name -> one [`Criterion`][..base.Criterion] class,
and what the observed calibration pass accumulates for it.

Every built-in criterion is one row of `_BUILT_IN`: its name, the module and class that define it (imported on
first use: the command line checks a name without torch; the module registers the class with the decorator when it
loads) and what the observed pass collects for it: nothing (weight criteria, fits), its own value by default or only
when asked, or a merging statistic. A criterion module that accumulates from the pass names its `Statistic`
subclass ``STATISTIC``; the value names a pass can collect (`STATISTICS`) are read off this table, never declared
a second time. Project-local criteria (``callbacks/`` of a project, a notebook) register with the same decorator
and are then usable by name everywhere
(``lp.score_weights``, configs)::

    @lp.register_criterion("my_norm")
    class MyNorm(lp.Criterion):
        def score_layer(self, layer):
            return layer.router_linear.weight.abs().sum(dim=1)

and a project's statistic with `register_statistic` (every name in its ``values``).

Names are lower-case snake case (``[a-z][a-z0-9_]*``). Registering a name twice is an error unless it is the same
class again (also after a module reload: same module and qualified name), which replaces the entry.
[`get_criterion`][] also accepts a class, an instance or a dotted import path ``"package.module.ClassName"`` (what
a config's ``class_path`` holds).

Torch-free: this module imports only the registry class (the criteria's base class when one registers).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, TypeVar

from lightprune.core.registry import Registry

__all__ = ["CRITERIA", "STATISTICS", "DEFAULT_CRITERIA", "CALIBRATION_CRITERIA", "MERGE_STATISTICS",
           "register_criterion", "unregister_criterion", "get_criterion", "get_criterion_class", "available_criteria",
           "register_statistic", "statistic_class", "available_statistics"]

_HINT = " (or a dotted import path 'package.module.ClassName')"
_PACKAGE = "lightprune.experts.criteria"


def _base() -> type:
    from lightprune.experts.criteria.base import Criterion

    return Criterion


def _check_statistic(name: str, cls: Any) -> None:
    from lightprune.experts.criteria.statistic import Statistic

    if not (isinstance(cls, type) and issubclass(cls, Statistic)):
        raise TypeError(f"calibration statistic {name!r}: register Statistic subclasses, got {cls!r}")
    if name not in cls.values:
        raise ValueError(f"calibration statistic {name!r}: {cls.__name__} gives {list(cls.values)}, not {name!r}")


#: criterion name -> class
CRITERIA: Registry[type] = Registry("criterion", base=_base, hint=_HINT, name_attribute="name",
                                    clash="choose another name or unregister_criterion({name!r}) first")
#: value name a calibration pass collects -> the Statistic class that sums it (the built-in ones read off the table)
STATISTICS: Registry[type] = Registry("calibration statistic", check=_check_statistic,
                                      hint=" (register one with lightprune.experts.criteria.register_statistic)")


class _Declared(NamedTuple):
    """One built-in criterion: ``where`` is ``"module:Class"`` in this package; ``collects`` what the observed pass
    sums for it: ``""`` nothing, ``"default"`` its own value in every pass, ``"optional"`` its own value when asked,
    ``"merging:<value>"`` a merging statistic (one value per layer)."""

    name: str
    where: str
    collects: str = ""


#: every built-in criterion, in the order a calibration pass reports their values
_BUILT_IN = (
    _Declared("aimer", "aimer:AIMER"),
    _Declared("magnitude", "magnitude:Magnitude"),
    _Declared("router_norm", "router_norm:RouterNorm"),
    _Declared("random", "random:RandomCriterion"),
    _Declared("frequency", "token_sums:Frequency", "default"),
    _Declared("seer", "token_sums:Seer", "default"),
    _Declared("ean", "token_sums:Ean", "default"),
    _Declared("reap", "token_sums:Reap", "default"),
    _Declared("routing_kl", "routing_kl:RoutingKl", "default"),
    _Declared("delta_h", "delta_h:DeltaH", "default"),
    _Declared("delta_h_promoted", "delta_h:DeltaHPromoted", "optional"),
    _Declared("maep", "maep:MAEP"),
    _Declared("router_delta", "router_delta:RouterDeltaCriterion"),
    _Declared("hc_smoe", "merge_methods:HCSMoE", "merging:expert_outputs"),
    _Declared("m_smoe", "merge_methods:MSMoE", "merging:router_logits"),
)
for _entry in _BUILT_IN:
    _module = f"{_PACKAGE}.{_entry.where.partition(':')[0]}"
    CRITERIA.declare(_entry.name, f"{_PACKAGE}.{_entry.where}")
    if _entry.collects:  # the value the pass sums for it, by the STATISTIC its module names
        _value = _entry.collects.partition("merging:")[2] or _entry.name
        STATISTICS.declare(_value, f"{_module}:STATISTIC")

#: what a pass collects when no criteria are named: every per-subset value but delta_h_promoted
DEFAULT_CRITERIA: tuple[str, ...] = tuple(e.name for e in _BUILT_IN if e.collects == "default")
#: the built-in per-expert, per-subset values (the calibration criteria of one pass)
CALIBRATION_CRITERIA: tuple[str, ...] = tuple(e.name for e in _BUILT_IN if e.collects in ("default", "optional"))
#: what the pass also collects for the merging methods (HC-SMoE: expert_outputs, M-SMoE: router_logits)
MERGE_STATISTICS: tuple[str, ...] = tuple(e.collects.partition("merging:")[2] for e in _BUILT_IN
                                          if e.collects.startswith("merging:"))

C = TypeVar("C", bound=type)


def register_criterion(name: str) -> Callable[[C], C]:
    """Class decorator: register a [`Criterion`][...base.Criterion] subclass under ``name`` and set ``cls.name``."""
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


S = TypeVar("S", bound=type)


def register_statistic(cls: S) -> S:
    """Class decorator: register a `Statistic` subclass under every
    name of its ``values`` (a project's statistic; a criterion that reads it names it in ``statistic``)."""
    values = getattr(cls, "values", ())
    if not values:
        raise ValueError(f"{getattr(cls, '__name__', cls)!r} names no values: set values = ('my_value', ...)")
    for name in values:
        STATISTICS.register(name, cls)
    return cls


def statistic_class(name: str) -> type:
    """The statistic that sums value ``name`` (an unknown name is a ``ValueError`` listing the known ones)."""
    return STATISTICS.get(name)


def available_statistics() -> list[str]:
    """Every value name a calibration pass can collect, sorted (imports nothing)."""
    return STATISTICS.names()


def get_criterion(criterion: Any, **kwargs: Any) -> Any:
    """An instance of ``criterion`` (a name, a dotted path, a class or an instance, returned as is) built with
    ``kwargs``.

    Unknown names are an error listing [`available_criteria`][]; arguments the constructor does not take are an
    error listing the ones it does.
    """
    return CRITERIA.build(criterion, **kwargs)
