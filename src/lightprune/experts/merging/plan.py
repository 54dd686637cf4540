"""MergePlan: which experts a merging run folds together, the only thing passed from clustering to surgery.

Per MoE layer (decimal string keys in JSON, ints in Python):

- ``clusters``: a partition of the layer's expert ids ``0..E-1`` into lists (each sorted, the list ordered by
  each cluster's smallest id);
- ``dominant``: per cluster, the member whose slot holds the merged expert (and, with ``router="dominant"``,
  whose router row routes to it); the merged layer keeps the dominants in ascending id order;
- ``coefficients``: per cluster member, its weight in the average, non-negative and summing to 1 per cluster
  (HC-SMoE and M-SMoE: the members' routing frequencies, normalised);
- ``num_experts``: the layer's expert count before merging, so a plan made for another model is caught.

Plan-wide: ``router`` is ``"dominant"`` (the dominant's router row and per-expert router tensors are kept) or
``"average"`` (the coefficient-weighted average of the members' rows: logits are linear in the row, so the
merged expert's logit is the members' averaged logit); ``align`` (M-SMoE, section 3.2): each member's
intermediate neurons are permuted to match the dominant's before averaging; ``method``, ``ratio`` and
``metadata`` describe the run. Every break of the schema is a [`PlanError`][...plan.PlanError] naming the
file (when loaded from one), the key and the value.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, ClassVar, Iterable

from lightprune.core.errors import PlanError, listed
from lightprune.core.jsonio import layer_items, show
from lightprune.experts.plan import ExpertPlan
from lightprune.experts.plan_base import ExpertLayout, expert_ids, layer_count

__all__ = ["MergePlan", "ROUTER_RULES"]

#: how a merged expert's router row is formed
ROUTER_RULES = ("dominant", "average")
_SUM_TOLERANCE = 1e-6


def _numbers(where: str, values: Any, length: int) -> list[float]:
    if not isinstance(values, (list, tuple)) or len(values) != length:
        raise PlanError(f"{where} must be a list of {length} coefficients (one per member), got {show(values)}")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v) or v < 0:
            raise PlanError(f"{where}[{i}] must be a finite non-negative number, got {show(v)}")
        out.append(float(v))
    total = sum(out)
    if abs(total - 1.0) > _SUM_TOLERANCE:
        raise PlanError(f"{where} must sum to 1 (a weighted average), got {listed(out)} (sum {total:.9g})")
    return out


@dataclass
class MergePlan(ExpertLayout):
    """Which experts each MoE layer folds together, and how (see the module docstring)."""

    KIND: ClassVar[str] = "merge plan"
    FIELDS: ClassVar[tuple[str, ...]] = ("clusters", "dominant", "coefficients", "num_experts", "router", "align",
                                         "method", "ratio", "metadata")
    REQUIRED: ClassVar[tuple[str, ...]] = ("clusters", "dominant", "coefficients", "num_experts")
    SHAPE: ClassVar[str] = "{clusters: ..., ...}"
    INDENT: ClassVar[int] = 1

    clusters: dict[int, list[list[int]]]
    dominant: dict[int, list[int]]
    coefficients: dict[int, list[list[float]]]
    num_experts: dict[int, int]
    router: str = "dominant"
    align: bool = False
    method: str = "unknown"
    ratio: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        counts = {layer: layer_count(key, n)
                  for key, layer, n in layer_items(self.num_experts, "num_experts", "{layer: expert count}", PlanError)}
        clusters = {layer: (key, value) for key, layer, value in
                    layer_items(self.clusters, "clusters", "{layer: [[expert ids], ...]}", PlanError)}
        dominant = {layer: value for _, layer, value in
                    layer_items(self.dominant, "dominant", "{layer: [expert id per cluster]}", PlanError)}
        coefficients = {layer: value for _, layer, value in
                        layer_items(self.coefficients, "coefficients", "{layer: [[weights], ...]}", PlanError)}
        for name, other in (("dominant", dominant), ("coefficients", coefficients), ("num_experts", counts)):
            if set(other) != set(clusters):
                raise PlanError(f"{name} names layers {listed(sorted(other))}, clusters names "
                                f"{listed(sorted(clusters))}: "
                                "every layer needs clusters, dominants, coefficients and its expert count")
        self.clusters, self.dominant, self.coefficients, self.num_experts = {}, {}, {}, {}
        for layer, (key, groups) in sorted(clusters.items()):
            self._set_layer(layer, key, groups, dominant[layer], coefficients[layer], counts[layer])
        if self.router not in ROUTER_RULES:
            raise PlanError(f"router must be one of {list(ROUTER_RULES)}, got {show(self.router)}")
        if not isinstance(self.align, bool):
            raise PlanError(f"align must be true or false, got {show(self.align)}")
        if not isinstance(self.method, str):
            raise PlanError(f"method must be a string, got {show(self.method)}")
        self._check_plan_fields()

    def _set_layer(self, layer: int, key: Any, groups: Any, dominant: Any, coefficients: Any, count: int) -> None:
        if not isinstance(groups, (list, tuple)) or not groups:
            raise PlanError(f"clusters[{key!r}] must be a non-empty list of clusters, got {show(groups)}")
        members = [expert_ids(f"clusters[{key!r}][{c}]", ids, non_empty=True) for c, ids in enumerate(groups)]
        seen = sorted(e for ids in members for e in ids)
        if seen != list(range(count)):
            dup = sorted(e for e, n in Counter(seen).items() if n > 1)
            lost = sorted(set(range(count)) - set(seen))
            bad = sorted(e for e in set(seen) if not 0 <= e < count)
            raise PlanError(f"clusters[{key!r}] must partition the layer's experts 0..{count - 1}: "
                            + "; ".join(p for p in (f"ids {listed(dup)} appear twice" if dup else "",
                                                    f"ids {listed(lost)} are in no cluster" if lost else "",
                                                    f"ids {listed(bad)} are out of range" if bad else "") if p))
        doms = expert_ids(f"dominant[{key!r}]", dominant, non_empty=True)
        if len(doms) != len(members):
            raise PlanError(f"dominant[{key!r}] names {len(doms)} experts for {len(members)} clusters")
        if not isinstance(coefficients, (list, tuple)) or len(coefficients) != len(members):
            raise PlanError(f"coefficients[{key!r}] must hold one list per cluster ({len(members)}), "
                            f"got {show(coefficients)}")
        order = sorted(range(len(members)), key=lambda c: min(members[c]))
        clusters, dominants, weights = [], [], []
        for c in order:
            if doms[c] not in members[c]:
                raise PlanError(f"dominant[{key!r}][{c}] = {doms[c]} is not a member of its cluster "
                                f"{listed(members[c])}")
            w = _numbers(f"coefficients[{key!r}][{c}]", coefficients[c], len(members[c]))
            pairs = sorted(zip(members[c], w))
            clusters.append([e for e, _ in pairs])
            weights.append([v for _, v in pairs])
            dominants.append(doms[c])
        self.clusters[layer], self.dominant[layer], self.coefficients[layer] = clusters, dominants, weights
        self.num_experts[layer] = count

    # ------------------------------------------------------------------ views
    def expert_plan(self) -> ExpertPlan:
        """The ExpertPlan of the merged layout: each layer keeps its dominants (the slots holding merged experts)."""
        return ExpertPlan(keep={l: sorted(d) for l, d in self.dominant.items()}, num_experts=dict(self.num_experts),
                          criterion=self.method, ratio=self.ratio,
                          allocation="uniform" if self.is_uniform else "global", metadata={"merge": self.to_dict()})

    def kept_counts(self) -> dict[int, int]:
        return {l: len(c) for l, c in self.clusters.items()}

    @property
    def total_merged_away(self) -> int:
        """Experts gone: the layers' counts before less the merged experts left (`total_removed`)."""
        return self.total_removed

    def check_layers(self, layers: Iterable) -> None:
        """Raise [`PlanError`][] unless this plan fits ``layers``: its kept layout (the dominants) as
        [`ExpertPlan.check_layers`][.....plan.ExpertPlan.check_layers] checks one."""
        self.expert_plan().check_layers(layers)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        per_layer = lambda d: {str(k): v for k, v in d.items()}  # noqa: E731
        return {"clusters": per_layer(self.clusters), "dominant": per_layer(self.dominant),
                "coefficients": per_layer(self.coefficients), "num_experts": per_layer(self.num_experts),
                "router": self.router, "align": self.align, "method": self.method, "ratio": self.ratio,
                "metadata": dict(self.metadata)}
