"""Criteria that need data, in the same registry as the weight criteria (``needs_data = True``).

- Calibration criteria (MAEP paper, section 3; METHODS.md "Calibration criteria"): ``frequency``,
  ``seer``, ``ean``, ``reap``, ``routing_kl``, ``delta_h``, ``delta_h_promoted`` read one token subset of
  the run's :class:`~lightprune.experts.calibration.CalibrationStats` (one observed pass yields them all);
  ``maep`` combines Delta-H on text and low-attention vision tokens with its closed-form alpha
  (section 5.3, :func:`lightprune.experts.maep.maep_scores`).
- Fit criteria: ``router_delta`` (paper 003, sections 3.2-3.4) is the scores an adapter fit produced in
  the run (the RouterDelta callback measures them at the end of ``lightprune fit``).

Every criterion answers :meth:`Criterion.score_in_run`, given what the run holds; these raise an error
that names what is missing (calibration statistics, or the fit's scores), never a silent fallback.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from torch import nn

from lightprune.experts.calibration.result import CRITERIA, SUBSETS, CalibrationStats
from lightprune.experts.criteria.base import Criterion
from lightprune.experts.criteria.registry import register_criterion
from lightprune.experts.maep import maep_scores
from lightprune.experts.scores import ExpertScores

__all__ = ["CalibrationCriterion", "FitCriterion", "MAEP", "RouterDeltaCriterion", "CALIBRATION_CLASSES"]


class CalibrationCriterion(Criterion):
    """Importance from calibration statistics: ``stats.score(name, subset)``."""

    needs_data: ClassVar[bool] = True

    def __init__(self, subset: str = "all"):
        if subset not in SUBSETS:
            raise ValueError(f"subset must be one of {list(SUBSETS)}, got {subset!r}")
        self.subset = subset

    def score_stats(self, stats: CalibrationStats) -> ExpertScores:
        return stats.score(self.name, self.subset)

    def score_in_run(self, model: nn.Module, calibration: CalibrationStats | None = None,
                     fitted: Mapping[str, ExpertScores] | None = None) -> ExpertScores:
        if calibration is None:
            raise ValueError(f"criterion {self.name!r} needs calibration statistics: add an ExpertStats callback "
                             "and run `lightprune calibrate` with calibration data")
        return self.score_stats(calibration)


def _calibration_class(name: str) -> type[CalibrationCriterion]:
    cls = type(name.title().replace("_", ""), (CalibrationCriterion,),
               {"__doc__": f"Calibration criterion ``{name}`` on one token subset (see the module docstring).",
                "__module__": __name__})
    return register_criterion(name)(cls)


#: the registered class of each calibration statistic, by name
CALIBRATION_CLASSES: dict[str, type[CalibrationCriterion]] = {name: _calibration_class(name) for name in CRITERIA}


@register_criterion("maep")
class MAEP(CalibrationCriterion):
    """MAEP: s = (1 - alpha) z~_text - alpha z~_low of Delta-H; ``alpha=None`` takes the closed form."""

    def __init__(self, alpha: float | None = None, subset: str = "all"):
        super().__init__(subset)
        self.alpha = alpha

    def score_stats(self, stats: CalibrationStats) -> ExpertScores:
        return maep_scores(stats, alpha=self.alpha)[0]


class FitCriterion(Criterion):
    """Scores that a fit in the same run produced (put in the run's ``fitted`` scores under :attr:`name`)."""

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


@register_criterion("router_delta")
class RouterDeltaCriterion(FitCriterion):
    """Router sensitivity of an adapter fit (paper 003): weight, signed weight or logit delta."""

    producer: ClassVar[str] = "RouterDelta"
