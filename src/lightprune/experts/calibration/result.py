"""CalibrationStats: every calibration criterion for every token subset, from one observed pass.

``raw(name, subset)`` is the paper's value, ``score(name, subset)`` the importance (higher = keep); both are
[`ExpertScores`][...scores.ExpertScores] ``{layer index: tensor[E_l]}``. The importance is the value, or its
negation on the subsets the criterion of that name prunes the large values of first (its ``negated``: Delta-H on
``vision_low_attn``). Each value, its formula and its paper: the criterion's own module under
`lightprune.experts.criteria` (`CRITERIA`: the built-in ones, in report order).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from lightprune.core.choices import SUBSETS
from lightprune.experts.criteria.registry import CALIBRATION_CRITERIA, CRITERIA as _REGISTERED
from lightprune.experts.scores import ExpertScores
from lightprune.models.layer import RoutingLimits

__all__ = ["CalibrationStats", "CRITERIA", "SUBSETS", "negated"]

CRITERIA = CALIBRATION_CRITERIA


def negated(name: str, subset: str) -> bool:
    """Whether the importance of value ``name`` over ``subset`` is its negation (the registered criterion of that
    name says so in its ``negated``; a value no criterion is named after: never)."""
    return name in _REGISTERED and subset in getattr(_REGISTERED.get(name), "negated", ())


class CalibrationStats:
    """Raw per-layer values ``{(criterion, subset): {layer: tensor[E_l]}}`` with the layers' limits.

    ``samples[subset]`` counts the samples that had at least one token of the subset and
    ``tokens[subset]`` the tokens (padding excluded) the statistics were taken over.
    """

    def __init__(self, values: Mapping[tuple[str, str], Mapping[int, torch.Tensor]],
                 limits: Mapping[int, RoutingLimits], samples: Mapping[str, int] | None = None,
                 tokens: Mapping[str, int] | None = None, metadata: Mapping[str, Any] | None = None,
                 merging: Mapping[str, Mapping[int, torch.Tensor]] | None = None):
        self._values = {key: {int(l): v.detach().double().cpu() for l, v in per_layer.items()}
                        for key, per_layer in values.items()}
        self.limits = dict(limits)
        self.samples = dict(samples or {})
        self.tokens = dict(tokens or {})
        self.metadata = dict(metadata or {})
        self._merging = {name: {int(l): v.detach().double().cpu() for l, v in per_layer.items()}
                         for name, per_layer in (merging or {}).items()}

    @property
    def criteria(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for name, _ in self._values))

    @property
    def subsets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(subset for _, subset in self._values))

    def has(self, name: str, subset: str = "all") -> bool:
        """Whether ``name`` was collected over ``subset``."""
        return (name, subset) in self._values

    def _get(self, name: str, subset: str) -> dict[int, torch.Tensor]:
        if (name, subset) not in self._values:
            have = sorted(self._values)
            raise KeyError(f"no statistics for criterion {name!r} on subset {subset!r}; collected: {have}")
        return self._values[(name, subset)]

    def merging_statistic(self, name: str) -> dict[int, torch.Tensor]:
        """A merging statistic's per-token mean by layer (``expert_outputs`` [E, H], ``router_logits`` [E, E]
        Gram matrix); an error saying how to collect it when the pass did not."""
        if name not in self._merging:
            raise KeyError(f"no merging statistic {name!r} in these calibration statistics (collected: "
                           f"{sorted(self._merging) or 'none'}): collect it with criteria including {name!r} "
                           f"(lp.collect_expert_stats(..., criteria=[..., {name!r}]) or ExpertStats(criteria=...))")
        return self._merging[name]

    def raw(self, name: str, subset: str = "all") -> ExpertScores:
        """The paper's value of ``name`` over ``subset`` tokens."""
        values = self._get(name, subset)
        return ExpertScores(values, self.limits, criterion=name)

    def score(self, name: str, subset: str = "all") -> ExpertScores:
        """Importance (higher = keep) of ``name`` over ``subset`` tokens."""
        raw = self._get(name, subset)
        sign = -1.0 if negated(name, subset) else 1.0
        return ExpertScores({l: sign * v for l, v in raw.items()}, self.limits, criterion=name, raw=raw)

    def to_json(self) -> dict[str, Any]:
        """``{criterion: {subset: {"importance": {layer: [...]}, "raw": {...}}}}`` plus counts, for scores.json."""
        out: dict[str, Any] = {}
        for name, subset in self._values:
            out.setdefault(name, {})[subset] = self.score(name, subset).to_json()
        return {"criteria": out, "samples": self.samples, "tokens": self.tokens, "metadata": self.metadata}
