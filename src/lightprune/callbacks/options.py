"""Each lightprune callback's options, stated once and torch-free: `OPTIONS`.

A `CallbackOptions` names a callback, the address of its options on the command line (``--prune.ratio 0.3``
sets ExpertPruning's ``ratio`` whatever the order of the job's callbacks), the line ``lightprune --help`` shows for
it, and every argument of its constructor with the check that refuses a bad value. The constructor checks its
values through its spec (`CallbackOptions.check`) and `uses_options` makes sure, when the class is
defined, that the constructor takes exactly the spec's arguments; the command line runs the same checks on a job's
options before it loads torch or Lightning (`lightprune.cli.options`), so a typo gets the callback's own
message in a fraction of a second. Checks that read a registry a project can extend (criteria, calibration
statistics) are marked ``registered``: the command line skips them when the job names project modules.

Torch-free: it imports the argument checks, the choices and the torch-free registries only.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from lightprune.core.checks import (
    check_atol,
    check_choice,
    check_each,
    check_interval,
    check_non_negative_int,
    check_positive_int,
    check_ratio,
)
from lightprune.core.choices import (
    ALLOCATIONS,
    NORMALIZATIONS,
    QUANTIZE_FORMATS,
    RETENTION_METRICS,
    SENSITIVITY_SCORES,
    SUBSETS,
)
from lightprune.experts.criteria.registry import CRITERIA, available_statistics

__all__ = ["CallbackOptions", "OPTIONS", "uses_options", "check_criterion_name"]

Check = Callable[[Any], Any]
C = TypeVar("C", bound=type)


def check_criterion_name(value: Any) -> Any:
    """A criterion given by name must be registered (a dotted import path, a class, an instance or a ``class_path``
    mapping is left to the registry when the callback resolves it)."""
    if isinstance(value, str) and "." not in value and value not in CRITERIA:
        raise CRITERIA.unknown(value)
    return value


def _optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


@dataclass(frozen=True)
class CallbackOptions:
    """One callback's options (see the module docstring).

    ``checks`` maps every constructor argument, in order, to its check (None: nothing to check alone; the
    constructor may still check it against the others); a check returns the value as the callback keeps it and
    raises ``ValueError`` naming the argument, the bad value and what is accepted.
    """

    name: str
    address: str
    summary: str
    checks: Mapping[str, Check | None]
    registered: frozenset[str] = field(default_factory=frozenset)

    @property
    def arguments(self) -> tuple[str, ...]:
        return tuple(self.checks)

    def check(self, argument: str, value: Any) -> Any:
        """``value`` of ``argument`` as the callback keeps it (its check's result), or the check's error."""
        if argument not in self.checks:
            raise KeyError(f"{self.name} has no option {argument!r}; its options: {', '.join(self.arguments)}")
        check = self.checks[argument]
        return value if check is None else check(value)


def uses_options(spec: CallbackOptions) -> Callable[[C], C]:
    """Class decorator: ``cls.OPTIONS = spec``, refused (``TypeError``) unless ``cls.__init__`` takes exactly the
    spec's arguments in the spec's order."""

    def decorator(cls: C) -> C:
        taken = tuple(p for p in inspect.signature(cls.__init__).parameters if p != "self")
        if taken != spec.arguments:
            raise TypeError(f"{cls.__name__}.__init__ takes {list(taken)}, its option spec lists "
                            f"{list(spec.arguments)}: change both (lightprune.callbacks.options)")
        cls.OPTIONS = spec
        return cls

    return decorator


OPTIONS: dict[str, CallbackOptions] = {spec.name: spec for spec in (
    CallbackOptions(
        "ExpertStats", "stats", "calibration statistics of every expert (calibrate)",
        {"subsets": lambda v: check_each("subsets", v, SUBSETS),
         "criteria": _optional(lambda v: check_each("criteria", v, available_statistics())),
         "low_attn_quantile": lambda v: check_interval("low_attn_quantile", v, 0, 0.5, "(]"), "output_dir": None,
         "save_every_n_batches": lambda v: check_non_negative_int("save_every_n_batches", v), "resume": None},
        registered=frozenset({"criteria"})),
    CallbackOptions(
        "RouterDelta", "router_delta", "router sensitivity: how far fine-tuning moved each router row",
        {"score": lambda v: check_choice("score", v, (*SENSITIVITY_SCORES, "auto")),
         "holdout_batches": lambda v: check_positive_int("holdout_batches", v)}),
    CallbackOptions(
        "ExpertPruning", "prune", "score with a criterion and select the experts to keep (plan.json)",
        {"criterion": check_criterion_name, "ratio": _optional(check_ratio),
         "allocation": lambda v: check_choice("allocation", v, ALLOCATIONS),
         "normalize": lambda v: check_choice("normalize", v, NORMALIZATIONS), "seed": None, "output_dir": None,
         "subset": lambda v: check_choice("subset", v, SUBSETS),
         "alpha": _optional(lambda v: check_interval("alpha", v, 0, 1)),
         "n_per_layer": lambda v: check_non_negative_int("n_per_layer", v, allow_none=True)},
        registered=frozenset({"criterion"})),
    CallbackOptions(
        "Export", "export", "prune, save, reload and verify the checkpoint",
        {"output_dir": None, "checkpoint_dir": None, "plan_path": None, "overwrite": None, "atol": check_atol,
         "summary": None, "quantize": lambda v: check_choice("quantize", v, QUANTIZE_FORMATS)}),
    CallbackOptions(
        "WidthSearch", "width_search", "MWOP: staged search over attention paths and FFN channels",
        {"grid": None, "stages": None, "min_retention": None, "max_candidates": None, "expand_above": None,
         "recovery_epochs": lambda v: check_positive_int("recovery_epochs", v),
         "metric": lambda v: check_choice("metric", v, RETENTION_METRICS), "last_layer_first": None,
         "flops_profile": None, "align": lambda v: check_positive_int("align", v), "output_dir": None,
         "progress": None, "criterion": None}),
    CallbackOptions(
        "WidthExport", "width_export", "MWOP: export the width-pruned model with its sparse kernels",
        {"output_dir": None, "checkpoint_dir": None, "plan_path": None, "overwrite": None, "atol": check_atol,
         "align": lambda v: check_positive_int("align", v)}),
    CallbackOptions(
        "Evaluate", "evaluate", "perplexity / task accuracy before and after",
        {"split": lambda v: check_choice("split", v, ("test", "val")),
         "metric": lambda v: check_choice("metric", v, RETENTION_METRICS), "when": None,
         "max_batches": lambda v: check_positive_int("max_batches", v, allow_none=True), "lm_eval_tasks": None,
         "lm_eval_batch_size": lambda v: check_positive_int("lm_eval_batch_size", v), "lm_eval_limit": None,
         "data": None, "output_dir": None, "progress": None}),
    CallbackOptions("ReportPage", "report", "report.md of the run", {"output_dir": None}),
)}
