"""The criteria that need data (``needs_data = True``), in the same registry as the weight criteria.

- `CalibrationCriterion` reads one token subset of the run's calibration statistics (one observed pass yields them
  all): its value is what the `Statistic` its module names accumulated, its importance that value, negated on the
  subsets it names in `negated`;
- `FitCriterion` reads the scores a fit produced in the same run (router sensitivity's ``router_delta``).

Every criterion answers [`score_in_run`][..base.Criterion.score_in_run], given what the run holds; these raise an
error that names what is missing (calibration statistics, or the fit's scores), never a silent fallback.

A module of its own, not part of `base`: the registry's check of a registered class imports `base`, and these
classes read the registry's statistics, so together they would form an import cycle.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from torch import nn

from lightprune.core.choices import SUBSETS
from lightprune.experts.criteria.base import Criterion
from lightprune.experts.criteria.registry import STATISTICS
from lightprune.experts.scores import ExpertScores

__all__ = ["CalibrationCriterion", "FitCriterion"]


class CalibrationCriterion(Criterion):
    """Importance from calibration statistics: ``stats.score(statistic, subset)``, the value of the calibration
    statistic the class names (a value of a registered `Statistic`).

    Subclasses set `statistic` (checked when the class is defined: a statistic registered before it) and
    `negated` (the subsets whose large values are pruned first).
    """

    needs_data: ClassVar[bool] = True
    #: the calibration value this criterion reads ("": none; MAEP combines several)
    statistic: ClassVar[str] = ""
    #: the subsets on which importance is the negated value (higher value = prune first)
    negated: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.statistic and cls.statistic not in STATISTICS:
            raise ValueError(f"{cls.__name__}.statistic = {cls.statistic!r} is not a registered calibration "
                             f"statistic; known: {STATISTICS.names()}")

    def __init__(self, subset: str = "all"):
        if subset not in SUBSETS:
            raise ValueError(f"subset must be one of {list(SUBSETS)}, got {subset!r}")
        self.subset = subset

    def score_stats(self, stats: Any) -> ExpertScores:
        """Importance from a [`CalibrationStats`][.....calibration.result.CalibrationStats]."""
        return stats.score(self.statistic or self.name, self.subset)

    def score_in_run(self, model: nn.Module, calibration: Any = None,
                     fitted: Mapping[str, ExpertScores] | None = None) -> ExpertScores:
        if calibration is None:
            raise ValueError(f"criterion {self.name!r} needs calibration statistics: add an ExpertStats callback "
                             "and run `lightprune calibrate` with calibration data")
        return self.score_stats(calibration)


class FitCriterion(Criterion):
    """Scores that a fit in the same run produced (put in the run's ``fitted`` scores under `name`)."""

    needs_data: ClassVar[bool] = True
    #: the callback that produces the scores, for the error message
    producer: ClassVar[str] = ""

    def score_in_run(self, model: nn.Module, calibration: Any = None,
                     fitted: Mapping[str, ExpertScores] | None = None) -> ExpertScores:
        scores = (fitted or {}).get(self.name)
        if scores is None:
            raise ValueError(f"criterion {self.name!r} is measured by the {self.producer} callback during "
                             f"`lightprune fit`: add it to trainer.callbacks (no scores were produced)")
        return scores
