"""The decisions of MWOP's staged search (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient
MLLMs"), Algorithm 1 and appendix D.3), without any training.

Stages in order V2V, T2V, T2T, FFN_V, FFN_T. Per stage u:

1. a training-free sweep gives A_TF(rho) for every ratio rho of the grid (the caller evaluates);
2. DropCandidates: the ratios with A_TF(rho) >= ``min_retention``, at most ``max_candidates`` of them, the
   largest first (the paper leaves the rule to the practitioner; this is ours). If none passes, the
   smallest grid ratio is the only candidate;
3. every candidate is recovered from M0 with its cumulative masks and scored on the full evaluation set
   (the caller trains and evaluates; `StagedSearch.record`);
4. Expand ("the candidate set is expanded according to the observed performance changes"): when every
   queued candidate is tested, the next larger grid ratio is queued if the largest tested one still
   reaches ``expand_above`` (recovery made up for the pruning: try more), and the next smaller one if the
   smallest tested one fell below ``min_retention``;
5. anchor = the tested candidate whose ATR is closest to 100 (ties: the larger ratio); its masks are fixed
   for the later stages.

After the last stage, Algorithm 1 lines 24-29: start from the final anchor and walk every recovered
candidate in search order, switching only to one with a higher ATR and lower FLOPs.

`StagedSearch` holds all of it as plain data (``to_dict`` / ``from_dict``) so that a checkpointed
search resumes exactly where it stopped.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from lightprune.core.checks import check_interval, check_number, check_positive_int, real_number
from lightprune.width.plan import WIDTH_UNITS

__all__ = ["Candidate", "StagedSearch", "DEFAULT_GRID"]

DEFAULT_GRID: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))


@dataclass
class Candidate:
    """One recovered candidate: its stage, ratio, cumulative plan (``WidthPlan.to_dict``) and scores."""

    stage: str
    ratio: float
    plan: dict[str, Any]
    atr: float
    per_task: dict[str, float]
    flops: float
    training_free_atr: float | None = None
    weights: str | None = None  # where its recovered trainable weights were saved, if they were

    def label(self) -> str:
        return f"{self.stage}@{self.ratio:g}"


@dataclass
class StagedSearch:
    """Algorithm 1's bookkeeping. ``grid`` ratios in [0, 1]; ``stages`` a sub-sequence of the five units."""

    grid: Sequence[float] = DEFAULT_GRID
    stages: Sequence[str] = WIDTH_UNITS
    min_retention: float = 90.0
    max_candidates: int = 2
    expand_above: float = 100.0
    stage_index: int = 0
    sweep: dict[float, float] = field(default_factory=dict)
    sweeps: dict[str, dict[float, float]] = field(default_factory=dict)  # finished stages' sweeps, for reports
    queue: list[float] = field(default_factory=list)
    tested: list[Candidate] = field(default_factory=list)
    history: list[Candidate] = field(default_factory=list)
    anchors: dict[str, Candidate] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ratios = [real_number(r) for r in self.grid]  # numbers (NumPy's too), never strings, bools or NaN
        if not ratios or any(r is None or not 0 <= r <= 1 for r in ratios):
            raise ValueError(f"grid ratios must be in [0, 1] and non-empty, got {list(self.grid)}")
        self.grid = sorted({round(float(r), 6) for r in ratios})
        self.stages = list(self.stages)
        bad = [s for s in self.stages if s not in WIDTH_UNITS]
        order = [WIDTH_UNITS.index(s) for s in self.stages if s in WIDTH_UNITS]
        if bad or not self.stages or order != sorted(set(order)):
            raise ValueError(f"stages must be a non-empty, ordered sub-sequence of {list(WIDTH_UNITS)}, "
                             f"got {self.stages}")
        self.max_candidates = check_positive_int("max_candidates", self.max_candidates)
        self.min_retention = check_number("min_retention", self.min_retention)
        self.expand_above = check_interval("expand_above", self.expand_above, -math.inf, math.inf)  # inf: never
        self.sweep = {float(k): float(v) for k, v in self.sweep.items()}
        self.sweeps = {stage: {float(k): float(v) for k, v in sw.items()} for stage, sw in self.sweeps.items()}
        self.tested = [c if isinstance(c, Candidate) else Candidate(**c) for c in self.tested]
        self.history = [c if isinstance(c, Candidate) else Candidate(**c) for c in self.history]
        self.anchors = {k: c if isinstance(c, Candidate) else Candidate(**c) for k, c in self.anchors.items()}

    # ------------------------------------------------------------------ where we are
    @property
    def done(self) -> bool:
        return self.stage_index >= len(self.stages)

    @property
    def stage(self) -> str | None:
        return None if self.done else self.stages[self.stage_index]

    @property
    def swept(self) -> bool:
        """Whether the current stage's training-free sweep has been recorded."""
        return bool(self.sweep)

    def anchor_plan(self) -> dict[str, Any] | None:
        """The cumulative plan fixed by the last finished stage (None before the first)."""
        done = [s for s in self.stages[:self.stage_index] if s in self.anchors]
        return self.anchors[done[-1]].plan if done else None

    # ------------------------------------------------------------------ steps
    def start_stage(self, training_free_atr: dict[float, float]) -> list[float]:
        """Record the sweep A_TF(rho) for every grid ratio; returns the candidates to recover (DropCandidates)."""
        if self.done:
            raise RuntimeError("the search is finished")
        got = {round(float(k), 6): float(v) for k, v in training_free_atr.items()}
        if sorted(got) != self.grid:
            raise ValueError(f"the sweep must cover the grid {self.grid}, got ratios {sorted(got)}")
        self.sweep = got
        passing = [r for r in self.grid if got[r] >= self.min_retention]
        self.queue = sorted(passing, reverse=True)[:int(self.max_candidates)] or [self.grid[0]]
        self.tested = []
        return list(self.queue)

    def next_ratio(self) -> float | None:
        """The next candidate to recover in this stage (None: the stage is complete)."""
        if not self.swept:
            raise RuntimeError(f"stage {self.stage!r} has no training-free sweep yet")
        if not self.queue:
            self._expand()
        return self.queue[0] if self.queue else None

    def record(self, candidate: Candidate) -> None:
        """The recovered, fully evaluated candidate of `next_ratio`."""
        if not self.queue or round(candidate.ratio, 6) != self.queue[0] or candidate.stage != self.stage:
            raise ValueError(f"expected a result for {self.stage}@{self.queue[0] if self.queue else None}, "
                             f"got {candidate.label()}")
        candidate.training_free_atr = self.sweep[self.queue.pop(0)]
        self.tested.append(candidate)

    def _expand(self) -> None:
        tried = {round(c.ratio, 6) for c in self.tested}
        if not tried:
            return
        top = max(self.tested, key=lambda c: c.ratio)
        bottom = min(self.tested, key=lambda c: c.ratio)
        larger = [r for r in self.grid if r > top.ratio and r not in tried]
        smaller = [r for r in self.grid if r < bottom.ratio and r not in tried]
        if top.atr >= self.expand_above and larger:
            self.queue.append(larger[0])
        elif bottom.atr < self.min_retention and smaller:
            self.queue.append(smaller[-1])

    def finish_stage(self) -> Candidate:
        """Fix the anchor (ATR closest to 100, ties to the larger ratio) and move to the next stage."""
        if self.next_ratio() is not None:
            raise RuntimeError(f"stage {self.stage!r} still has untested candidates {self.queue}")
        anchor = min(self.tested, key=lambda c: (abs(c.atr - 100.0), -c.ratio))
        self.anchors[self.stage] = anchor
        self.sweeps[self.stage] = dict(self.sweep)
        self.history.extend(self.tested)
        self.stage_index += 1
        self.sweep, self.queue, self.tested = {}, [], []
        return anchor

    def final(self) -> Candidate:
        """Algorithm 1, lines 24-29: the final anchor, replaced by any earlier candidate better on both counts."""
        if not self.done:
            raise RuntimeError(f"the search is at stage {self.stage!r}; finish every stage first")
        best = self.anchors[self.stages[-1]]
        for candidate in self.history:
            if candidate.atr > best.atr and candidate.flops < best.flops:
                best = candidate
        return best

    # ------------------------------------------------------------------ state
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["sweep"] = {str(k): v for k, v in self.sweep.items()}
        data["sweeps"] = {stage: {str(k): v for k, v in sw.items()} for stage, sw in self.sweeps.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "StagedSearch":
        return cls(**data)
