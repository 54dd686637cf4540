"""The calibration statistics behind one registry: a value's name -> the :class:`~.statistic.Statistic` that sums it.

One observed pass collects every value asked for (``collect_expert_stats(..., criteria=[...])``); each value is
summed by the statistic registered under its name, one instance per statistic and MoE layer however many of its
values are asked for. The built-in values are declared here (imported on first use, so the command line checks
names without torch), in the order a pass reports them (the criteria: AIMER ("AIMER: Calibration-Free
Task-Agnostic MoE Pruning", arXiv 2603.18492), appendix B; MAEP ("Modality-Aware Expert Pruning for MoE-Based
Multimodal Large Language Models", arXiv 2611.05927), Eqs. 8 and 2):

| value | statistic | collected |
|---|---|---|
| frequency, seer, ean, reap | :mod:`.token_sums` | by default |
| routing_kl | :mod:`.routing_kl` | by default |
| delta_h | :mod:`.delta_h` | by default |
| delta_h_promoted | :mod:`.delta_h` | when asked (it runs the promoted experts) |
| expert_outputs, router_logits | :mod:`.merge_sums` (HC-SMoE, M-SMoE) | when asked |

A project adds a value with a :class:`~.statistic.Statistic` subclass decorated with :func:`register_statistic`
(every name in its ``values``), and a criterion that reads it (``lightprune.experts.criteria.CalibrationCriterion``
with ``statistic = "<value>"``).

Torch-free: this module imports only the registry class.
"""

from __future__ import annotations

from typing import Any, TypeVar

from lightprune.core.registry import Registry

__all__ = ["STATISTICS", "DEFAULT_CRITERIA", "CALIBRATION_CRITERIA", "MERGE_STATISTICS", "register_statistic",
           "statistic_class", "available_statistics"]


def _check(name: str, cls: Any) -> None:
    from lightprune.experts.calibration.statistic import Statistic

    if not (isinstance(cls, type) and issubclass(cls, Statistic)):
        raise TypeError(f"calibration statistic {name!r}: register Statistic subclasses, got {cls!r}")
    if name not in cls.values:
        raise ValueError(f"calibration statistic {name!r}: {cls.__name__} gives {list(cls.values)}, not {name!r}")


#: value name -> the Statistic class that sums it
STATISTICS: Registry[type] = Registry("calibration statistic", check=_check,
                                      hint=" (register one with lightprune.experts.calibration.register_statistic)")

_PACKAGE = "lightprune.experts.calibration"
#: (value, where its statistic lives, collected by default | optional | merging), in report order
_BUILT_IN = (
    ("frequency", "token_sums:TokenSums", "default"),
    ("seer", "token_sums:TokenSums", "default"),
    ("ean", "token_sums:TokenSums", "default"),
    ("reap", "token_sums:TokenSums", "default"),
    ("routing_kl", "routing_kl:RoutingKL", "default"),
    ("delta_h", "delta_h:DeltaH", "default"),
    ("delta_h_promoted", "delta_h:DeltaH", "optional"),
    ("expert_outputs", "merge_sums:MergeSums", "merging"),
    ("router_logits", "merge_sums:MergeSums", "merging"),
)
for _name, _where, _ in _BUILT_IN:
    STATISTICS.declare(_name, f"{_PACKAGE}.{_where}")

#: what a pass collects when no criteria are named: every per-subset value but delta_h_promoted
DEFAULT_CRITERIA: tuple[str, ...] = tuple(name for name, _, kind in _BUILT_IN if kind == "default")
#: the built-in per-expert, per-subset values (the calibration criteria of one pass)
CALIBRATION_CRITERIA: tuple[str, ...] = tuple(name for name, _, kind in _BUILT_IN if kind != "merging")
#: what the pass also collects for the merging methods (HC-SMoE: expert_outputs, M-SMoE: router_logits)
MERGE_STATISTICS: tuple[str, ...] = tuple(name for name, _, kind in _BUILT_IN if kind == "merging")

S = TypeVar("S", bound=type)


def register_statistic(cls: S) -> S:
    """Class decorator: register a :class:`~.statistic.Statistic` subclass under every name of its ``values``."""
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
    """Every registered value name, sorted (imports nothing)."""
    return STATISTICS.names()

