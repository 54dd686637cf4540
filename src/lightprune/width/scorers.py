"""The width-scorer registry and the built-in scorers of MWOP ("MWOP: Modality-aware Width-wise Operation Pruning
for Efficient MLLMs"): ``taylor``, ``min_rank`` and ``random``.

One name -> one [`WidthScorer`][..WidthScorer] class, in a
`Registry`. Project-local scorers (a project's ``callbacks/``, a notebook)
register with the same decorator and are then usable by name (``WidthSearch(criterion="my_scorer")``)::

    @lp.register_width_scorer("my_scorer")
    class MyScorer(lp.WidthScorer):
        def score_heads(self, layer): ...       # [heads] or [heads, 3]
        def score_channels(self, layer): ...    # [channels] or {"vision": ..., "text": ...}

[`get_width_scorer`][] also takes a class, an instance or a dotted import path ``"package.module.ClassName"``
(what a config's ``class_path`` holds). The built-ins:

- ``taylor`` (`TaylorScorer`, one calibration set): first-order Taylor importance, MWOP section 3 and
  appendix A.1, S_attn(l, h, p) = mean_b |<O_(l,h,p), dL_b/dO_(l,h)>| / |Q_p,b| and
  S_ffn(l, c, mu) = mean_b |sum_{i in mu} h_ic dL_b/dh_ic| ([`taylor_importance`][..taylor_importance]);
- ``min_rank`` (`MinRankScorer`, one calibration set per task category): the "All Tasks" calibration,
  appendix A.4: every category's own Taylor scores, every unit ordered by r(u) = min_c r_c(u) within each ranked
  pool ([`min_rank_scores`][..min_rank_scores]);
- ``random`` (`RandomScorer`, no data): the random baseline, uniform scores from a generator seeded with
  ``seed`` ([`random_scores`][..random_scores]: the same values for the same seed, whichever of
  attention and FFN is asked for).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from lightprune.core.registry import Registry
from lightprune.width.min_rank import min_rank_scores
from lightprune.width.plan import WidthPlan
from lightprune.width.scorer import BATCHES, NO_DATA, PER_TASK, WidthScorer
from lightprune.width.select import random_scores
from lightprune.width.taylor import WidthScores, taylor_importance

__all__ = ["WIDTH_SCORERS", "MinRankScorer", "RandomScorer", "TaylorScorer", "WidthScorer",
           "available_width_scorers", "get_width_scorer", "get_width_scorer_class", "register_width_scorer",
           "unregister_width_scorer"]

S = TypeVar("S", bound=type)


#: name -> WidthScorer class
WIDTH_SCORERS: Registry[type[WidthScorer]] = Registry(
    "width scorer", base=lambda: WidthScorer, name_attribute="name",
    clash="choose another name or unregister_width_scorer({name!r}) first",
    hint="; register one with @register_width_scorer(name) or give a dotted import path 'package.module.ClassName'")


def register_width_scorer(name: str) -> Callable[[S], S]:
    """Class decorator: register a [`WidthScorer`][] subclass under ``name`` (lower-case snake case) and set
    ``cls.name``. A name registered to another class is an error."""
    return WIDTH_SCORERS.decorator(name)


def unregister_width_scorer(name: str) -> type[WidthScorer]:
    """Remove ``name`` from the registry and return its class (for tests and notebooks)."""
    return WIDTH_SCORERS.unregister(name)


def available_width_scorers() -> list[str]:
    """Every registered width scorer's name, sorted."""
    return WIDTH_SCORERS.names()


def get_width_scorer_class(scorer: str | type[WidthScorer]) -> type[WidthScorer]:
    """The class for a registered name, a dotted import path ``"package.module.ClassName"`` or a class."""
    return WIDTH_SCORERS.resolve(scorer)


def get_width_scorer(scorer: str | type[WidthScorer] | WidthScorer, **kwargs: Any) -> WidthScorer:
    """An instance of ``scorer`` built with ``kwargs`` (an instance is returned as is, without ``kwargs``).

    An unknown name is a ``ValueError`` listing [`available_width_scorers`][]; an argument the constructor does
    not take is a ``TypeError`` listing the ones it does.
    """
    return WIDTH_SCORERS.build(scorer, **kwargs)


# ---------------------------------------------------------------------------------------------- built-ins
@register_width_scorer("taylor")
class TaylorScorer(WidthScorer):
    """First-order Taylor importance on one calibration set (MWOP section 3 and appendix A.1)."""

    calibration = BATCHES

    def compute(self, model: nn.Module, batches: Any, *, attention: bool, ffn: bool, plan: WidthPlan | None,
                progress: bool | None) -> WidthScores:
        return taylor_importance(model, batches, attention=attention, ffn=ffn, plan=plan, progress=progress)


@register_width_scorer("min_rank")
class MinRankScorer(WidthScorer):
    """MWOP's "All Tasks" calibration (appendix A.4): each task category's Taylor scores on its own
    calibration set, combined by the minimum rank over the categories."""

    calibration = PER_TASK

    def compute(self, model: nn.Module, batches: Any, *, attention: bool, ffn: bool, plan: WidthPlan | None,
                progress: bool | None) -> WidthScores:
        return min_rank_scores([taylor_importance(model, category, attention=attention, ffn=ffn, plan=plan,
                                                  progress=progress) for category in batches.values()])


@register_width_scorer("random")
class RandomScorer(WidthScorer):
    """Uniform random scores from a generator seeded with ``seed`` (the random baseline of MWOP's tables)."""

    calibration = NO_DATA

    def __init__(self, seed: int = 0):
        self.seed = self._check_int("seed", seed)

    def compute(self, model: nn.Module, batches: Any, *, attention: bool, ffn: bool, plan: WidthPlan | None,
                progress: bool | None) -> WidthScores:
        attn, channels = random_scores(WidthPlan.dense(model), self.seed)  # both drawn: the same values either way
        return WidthScores(attn=attn if attention else {}, ffn=channels if ffn else {}, num_samples=0)
