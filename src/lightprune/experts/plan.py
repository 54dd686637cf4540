"""ExpertPlan: the experts a pruning run keeps, the only thing passed from scoring to surgery.

``ExpertPlan.keep`` maps each decoder layer index to the sorted ids of the routed experts it keeps;
``num_experts`` records each layer's count before pruning, so a plan made for another model is
caught before any surgery.

The plan round-trips through JSON under a strict schema, nothing coerced: ``keep`` an object
{layer: [expert ids]}, ``num_experts`` {layer: positive count}, layer keys plain decimal strings (ints
when built in Python), ids and counts integers (never booleans, floats or strings), ``criterion`` and
``allocation`` strings, ``ratio`` a number in [0, 1) or null, ``metadata`` an object. Every violation is
a [`PlanError`][] naming the file (when loaded from one), the key path and the value, e.g.
``plan file '/x/plan.json': keep['3'][1] must be an expert id (an integer), got 1.7``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Iterable

from lightprune.core.errors import PlanError, listed
from lightprune.core.jsonio import layer_items, show
from lightprune.experts.plan_base import ExpertLayout, expert_ids, layer_count

__all__ = ["ExpertPlan", "PlanError"]

def _layout(counts: dict[int, int]) -> str:
    """MoE layers and their expert counts in a few words: ``2 layers [1, 2] (8 experts each)``."""
    if not counts:
        return "no layers"
    each = set(counts.values())
    experts = f"{each.pop()} experts each" if len(each) == 1 else \
        f"experts {listed([counts[layer] for layer in sorted(counts)])}"
    return f"{len(counts):,} layer{'s' if len(counts) != 1 else ''} {listed(sorted(counts))} ({experts})"


def _other_layers(plan: "ExpertPlan", by_index: dict, unknown: list[int], left_out: list[int]) -> str:
    """The refusal of a plan whose layers are not the model's MoE layers: what differs, then both layouts."""
    model = {index: layer.num_experts for index, layer in sorted(by_index.items())}
    named = {index: plan.num_experts[index] for index in sorted(plan.keep)}
    if unknown:
        return (f"plan made for another model? It names {_layout(named)}, this model has MoE {_layout(model)}: plan "
                f"names layers {listed(unknown)} that are not MoE layers of this model")
    return (f"plan leaves out MoE layers {listed(left_out)} of this model, whose MoE layers are {_layout(model)}; the "
            f"plan names {_layout(named)}: a plan made for another model, or, to leave a layer unpruned, keep all its "
            "experts (plan.completed(lp.find_moe_layers(model)) does so for every layer left out)")


@dataclass
class ExpertPlan(ExpertLayout):
    """The experts each MoE layer keeps (see the module docstring)."""

    KIND: ClassVar[str] = "plan"
    FIELDS: ClassVar[tuple[str, ...]] = ("keep", "num_experts", "criterion", "ratio", "allocation", "metadata")
    REQUIRED: ClassVar[tuple[str, ...]] = ("keep", "num_experts")
    SHAPE: ClassVar[str] = "{keep: ..., num_experts: ...}"

    keep: dict[int, list[int]]
    num_experts: dict[int, int]
    criterion: str = "unknown"
    ratio: float | None = None
    allocation: str = "uniform"
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        keep = layer_items(self.keep, "keep", "{layer: [expert ids]}", PlanError)
        counts = layer_items(self.num_experts, "num_experts", "{layer: expert count}", PlanError)
        self.keep = {layer: sorted(expert_ids(f"keep[{key!r}]", ids)) for key, layer, ids in keep}
        self.num_experts = {layer: layer_count(key, n) for key, layer, n in counts}
        for name in ("criterion", "allocation"):
            if not isinstance(getattr(self, name), str):
                raise PlanError(f"{name} must be a string, got {show(getattr(self, name))}")
        self._check_plan_fields()
        missing = sorted(set(self.keep) - set(self.num_experts))
        if missing:
            raise PlanError(f"plan keeps experts of layers {listed(missing)} but records no expert count for them")
        for layer, ids in self.keep.items():
            if len(set(ids)) != len(ids):
                twice = sorted(e for e, n in Counter(ids).items() if n > 1)
                raise PlanError(f"plan layer {layer} keeps duplicate expert ids {listed(twice)} (its ids: "
                                f"{listed(ids)})")
            bad = [e for e in ids if not 0 <= e < self.num_experts[layer]]
            if bad:
                raise PlanError(f"plan layer {layer} keeps expert ids {listed(bad)} outside "
                                f"0..{self.num_experts[layer] - 1}")

    # ------------------------------------------------------------------ views
    def pruned(self) -> dict[int, list[int]]:
        """{layer: sorted ids removed}."""
        return {l: sorted(set(range(self.num_experts[l])) - set(ids)) for l, ids in self.keep.items()}

    def kept_counts(self) -> dict[int, int]:
        return {l: len(ids) for l, ids in self.keep.items()}

    @property
    def total_pruned(self) -> int:
        """Experts removed over all layers (`total_removed`)."""
        return self.total_removed

    def completed(self, layers: Iterable) -> "ExpertPlan":
        """This plan with every MoE layer of ``layers`` it leaves out keeping all its experts (what pruning does to
        them), so that what is written records every layer; the plan itself when it names them all."""
        layers = list(layers)
        if all(layer.index in self.keep for layer in layers):
            return self
        keep = {**{layer.index: list(range(layer.num_experts)) for layer in layers}, **self.keep}
        counts = {**{layer.index: layer.num_experts for layer in layers}, **self.num_experts}
        return ExpertPlan(keep=keep, num_experts=counts, criterion=self.criterion, ratio=self.ratio,
                          allocation=self.allocation, metadata=self.metadata)

    # ------------------------------------------------------------------ checks
    def check_layers(self, layers: Iterable) -> None:
        """Raise [`PlanError`][] unless this plan fits ``layers`` (``MoELayer`` list of a model): every MoE
        layer named and no other, each one's expert count, its floor (top-k, or the per-group minimum) and, for
        group-limited routing, the same count kept in every group."""
        by_index = {layer.index: layer for layer in layers}
        unknown = sorted(set(self.keep) - set(by_index))
        left_out = sorted(set(by_index) - set(self.keep))
        if unknown:
            raise PlanError(_other_layers(self, by_index, unknown, left_out))
        for index in self.keep:
            if self.num_experts[index] != by_index[index].num_experts:
                raise PlanError(f"plan was made for {self.num_experts[index]} experts in layer {index}, "
                                f"the model has {by_index[index].num_experts}: a plan for another model?")
        for index, ids in self.keep.items():
            layer = by_index[index]
            if len(ids) < layer.min_experts:
                raise PlanError(f"plan keeps {len(ids)} experts in layer {index}, below its floor of "
                                f"{layer.min_experts} (top_k={layer.top_k}"
                                + (f", n_group={layer.n_group}, topk_group={layer.topk_group})" if layer.limits.is_grouped else ")"))
            if layer.n_group > 1:
                size = layer.num_experts // layer.n_group
                per_group = [sum(1 for e in ids if e // size == g) for g in range(layer.n_group)]
                if len(set(per_group)) != 1:
                    raise PlanError(f"plan keeps {per_group} experts per group in layer {index}; group-limited "
                                    "routing needs the same count in every group")
        if left_out:  # after what the named layers say: a plan of part of this model's layers, or another model's
            raise PlanError(_other_layers(self, by_index, [], left_out))

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["keep"] = {str(k): v for k, v in self.keep.items()}
        d["num_experts"] = {str(k): v for k, v in self.num_experts.items()}
        return d
