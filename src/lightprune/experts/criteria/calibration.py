"""Criteria that need data, in the same registry as the weight criteria (``needs_data = True``).

- Calibration criteria (``frequency``, ``seer``, ``ean``, ``reap``: AIMER ("AIMER: Calibration-Free Task-Agnostic
  MoE Pruning", arXiv 2603.18492), appendix B; ``routing_kl``, ``delta_h``, ``delta_h_promoted``: MAEP
  ("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language Models", arXiv 2611.05927), section 3
  and Eqs. 8 and 2) read one token subset of the run's :class:`~lightprune.experts.calibration.CalibrationStats`
  (one observed pass yields them all); ``maep`` combines Delta-H on text and low-attention vision tokens with its
  closed-form alpha (MAEP section 5.3, :func:`lightprune.experts.maep.maep_scores`).
- Fit criteria: ``router_delta`` (router sensitivity ("Router Sensitivity Under Lightweight Fine-Tuning Identifies
  Prunable Experts in Mixture-of-Experts Models", arXiv 2608.07890), sections 3.2-3.4) is the scores an adapter fit
  produced in the run (the RouterDelta callback measures them at the end of ``lightprune fit``).

Every criterion answers :meth:`Criterion.score_in_run`, given what the run holds; these raise an error
that names what is missing (calibration statistics, or the fit's scores), never a silent fallback.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from torch import nn

from lightprune.core.checks import check_interval
from lightprune.experts.calibration.registry import STATISTICS
from lightprune.experts.calibration.result import SUBSETS, CalibrationStats
from lightprune.experts.criteria.base import Criterion
from lightprune.experts.criteria.registry import register_criterion
from lightprune.experts.maep import maep_scores
from lightprune.experts.scores import ExpertScores

__all__ = ["CalibrationCriterion", "Frequency", "Seer", "Ean", "Reap", "RoutingKl", "DeltaH", "DeltaHPromoted",
           "FitCriterion", "MAEP", "RouterDeltaCriterion", "CALIBRATION_CLASSES"]


class CalibrationCriterion(Criterion):
    """Importance from calibration statistics: ``stats.score(statistic, subset)``, the value of the registered
    calibration statistic the class names (:mod:`lightprune.experts.calibration.registry`).

    Subclasses set :attr:`statistic` (checked when the class is defined: a statistic registered before it).
    """

    needs_data: ClassVar[bool] = True
    #: the calibration value this criterion reads ("": none; MAEP combines several)
    statistic: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.statistic and cls.statistic not in STATISTICS:
            raise ValueError(f"{cls.__name__}.statistic = {cls.statistic!r} is not a registered calibration "
                             f"statistic; known: {STATISTICS.names()}")

    def __init__(self, subset: str = "all"):
        if subset not in SUBSETS:
            raise ValueError(f"subset must be one of {list(SUBSETS)}, got {subset!r}")
        self.subset = subset

    def score_stats(self, stats: CalibrationStats) -> ExpertScores:
        return stats.score(self.statistic or self.name, self.subset)

    def score_in_run(self, model: nn.Module, calibration: CalibrationStats | None = None,
                     fitted: Mapping[str, ExpertScores] | None = None) -> ExpertScores:
        if calibration is None:
            raise ValueError(f"criterion {self.name!r} needs calibration statistics: add an ExpertStats callback "
                             "and run `lightprune calibrate` with calibration data")
        return self.score_stats(calibration)


@register_criterion("frequency")
class Frequency(CalibrationCriterion):
    """n_j: the subset's tokens routed to expert j."""

    statistic = "frequency"


@register_criterion("seer")
class Seer(CalibrationCriterion):
    """SEER: sum of the routing weight g_j(t) over the subset's tokens routed to j."""

    statistic = "seer"


@register_criterion("ean")
class Ean(CalibrationCriterion):
    """EAN: sum of the output norm ||f_j(t)|| over the subset's tokens routed to j."""

    statistic = "ean"


@register_criterion("reap")
class Reap(CalibrationCriterion):
    """REAP: (1 / n_j) sum g_j(t) ||f_j(t)|| over the subset's tokens routed to j, the mean router-weighted output
    norm (0 when n_j = 0)."""

    statistic = "reap"


@register_criterion("routing_kl")
class RoutingKl(CalibrationCriterion):
    """Routing KL (MAEP eq. 8): the mean over the subset's tokens of KL(p || p with j removed), eps 1e-12."""

    statistic = "routing_kl"


@register_criterion("delta_h")
class DeltaH(CalibrationCriterion):
    """Delta-H (MAEP eq. 2): the mean over samples of each sample's mean ||H - H^(-j)||^2 over its subset tokens."""

    statistic = "delta_h"


@register_criterion("delta_h_promoted")
class DeltaHPromoted(CalibrationCriterion):
    """Delta-H with the promoted experts' outputs included in H^(-j) (collected when asked for)."""

    statistic = "delta_h_promoted"


#: the registered class of each built-in calibration statistic value, by name
CALIBRATION_CLASSES: dict[str, type[CalibrationCriterion]] = {
    cls.statistic: cls for cls in (Frequency, Seer, Ean, Reap, RoutingKl, DeltaH, DeltaHPromoted)}


@register_criterion("maep")
class MAEP(CalibrationCriterion):
    """MAEP: s = (1 - alpha) z~_text - alpha z~_low of Delta-H; ``alpha=None`` takes the closed form."""

    def __init__(self, alpha: float | None = None, subset: str = "all"):
        super().__init__(subset)
        self.alpha = None if alpha is None else check_interval("alpha", alpha, 0, 1)

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
    """Router sensitivity of an adapter fit (router sensitivity Eqs. 4, 3 and 5): weight, signed weight or logit
    delta."""

    producer: ClassVar[str] = "RouterDelta"
