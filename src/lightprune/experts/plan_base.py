"""What every depth-axis plan shares: `ExpertLayout`, the base of
[`ExpertPlan`][..plan.ExpertPlan] and [`MergePlan`][..merging.plan.MergePlan].

A plan records each MoE layer's routed-expert count before (``num_experts``, so a plan made for another model is
caught before any surgery) and says how many experts each layer keeps (`ExpertLayout.kept_counts`). From
these: whether every layer keeps the same number (plain ``from_pretrained`` reloads the result), how many experts
go, and the plan-wide fields both validate alike (``ratio`` a number in [0, 1) or null, ``metadata`` an object
holding no NaN or infinity). Both round-trip through JSON under a strict schema (`ExpertLayout.from_dict`:
unknown or missing keys, or a ``NaN`` / ``Infinity`` constant anywhere, are a [`PlanError`][..plan.PlanError]
naming them, and the file when loaded from one). A string that is not UTF-8 text (a lone surrogate such as JSON's
``"\\ud800"``) is refused anywhere in a plan, built or loaded, naming its key path (`check_text`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from lightprune.core.checks import check_utf8, real_number
from lightprune.core.errors import PlanError, listed
from lightprune.core.jsonio import check_finite as _check_finite, read_parsed, show, strict_int, write_json

__all__ = ["ExpertLayout", "layer_count", "expert_ids", "check_plan_kind", "check_finite", "check_text"]

#: what to do instead, by (the kind an entry point takes, the kind it was given)
_INSTEAD = {
    ("ExpertPlan", "MergePlan"): "a MergePlan merges experts: lp.merge_experts(model, plan) merges in place, "
                                 "lp.merged_experts(model, plan) reversibly, lp.export_pruned(model, plan, out) "
                                 "merges and exports",
    ("MergePlan", "ExpertPlan"): "an ExpertPlan prunes experts: lp.prune_experts(model, plan) prunes in place, "
                                 "lp.mask_experts(model, plan) reversibly",
}


def layer_count(key: Any, n: Any) -> int:
    """A layer's expert count from ``num_experts[key]``: a positive integer (a [`PlanError`][] otherwise)."""
    value = strict_int(n)
    if value is None or value < 1:
        raise PlanError(f"num_experts[{key!r}] must be a positive integer (the layer's expert count), got {show(n)}")
    return value


def expert_ids(where: str, ids: Any, non_empty: bool = False) -> list[int]:
    """``ids`` (a plan file's list at ``where``) as expert ids, each a JSON integer; a refusal names ``where``, the
    entry and the value."""
    if not isinstance(ids, (list, tuple)) or (non_empty and not ids):
        raise PlanError(f"{where} must be a {'non-empty ' if non_empty else ''}list of expert ids, got {show(ids)}")
    out = []
    for i, e in enumerate(ids):
        value = strict_int(e)
        if value is None:
            raise PlanError(f"{where}[{i}] must be an expert id (an integer), got {show(e)}")
        out.append(value)
    return out


def check_plan_kind(plan: Any, kind: type, caller: str, instead: str | None = None) -> None:
    """Raise ``TypeError`` unless ``plan`` is a ``kind`` (an [`ExpertPlan`][...plan.ExpertPlan] or a
    [`MergePlan`][...merging.plan.MergePlan]), naming
    ``caller``, what it got and what to call instead (``instead`` overrides the default advice)."""
    if isinstance(plan, kind):
        return
    got = type(plan).__name__
    advice = instead or _INSTEAD.get((kind.__name__, got))
    if advice is None:
        advice = f"build one with lp.{kind.__name__}(...) or load a saved one with lp.{kind.__name__}.load(path)"
    raise TypeError(f"{caller} takes a{'n' if kind.__name__[0] in 'AEIOU' else ''} {kind.__name__}, got {got}: "
                    f"{advice}")


def check_text(data: Any, kind: str) -> None:
    """Refuse a string anywhere in ``data`` (a plan's fields, or its JSON object: a field, a metadata key or value at
    any depth) that is not UTF-8 text, naming the key path: a plan is written as UTF-8 JSON, and its strings go into
    the export's manifest and model card."""
    check_utf8(data, f"a {kind} file (UTF-8 JSON)", PlanError)


def check_finite(data: Any, kind: str) -> None:
    """`lightprune.core.jsonio.check_finite` raising a [`PlanError`][]."""
    _check_finite(data, kind, PlanError)


class ExpertLayout:
    """Base of the depth-axis plans (see the module docstring). Subclasses are dataclasses with ``num_experts``,
    ``ratio`` and ``metadata`` fields; they implement `kept_counts` and `to_dict` and set the schema
    (`KIND`, `FIELDS`, `REQUIRED`, `SHAPE`)."""

    #: what the plan is called in errors ("plan", "merge plan")
    KIND: ClassVar[str] = "plan"
    #: every key of its JSON form, and those that must be present
    FIELDS: ClassVar[tuple[str, ...]] = ()
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    #: its JSON form in a few words, for the error about a value that is not an object
    SHAPE: ClassVar[str] = "{...}"
    #: JSON indentation of :meth:`save`
    INDENT: ClassVar[int] = 2

    num_experts: dict[int, int]
    ratio: float | None
    metadata: dict[str, Any]

    # ------------------------------------------------------------------ views
    def kept_counts(self) -> dict[int, int]:
        """{layer: routed experts the layer has after the plan}."""
        raise NotImplementedError

    def check_layers(self, layers: Iterable) -> None:
        """Raise [`PlanError`][] unless this plan fits the model whose MoE layers are ``layers``: every MoE
        layer named and no other, each layer's expert count before, the routing floors. Every entry point that
        takes a plan runs it before any surgery."""
        raise NotImplementedError

    @property
    def is_uniform(self) -> bool:
        """True when every layer keeps the same number of experts (plain ``from_pretrained`` reloads it)."""
        return len(set(self.kept_counts().values())) <= 1

    @property
    def total_removed(self) -> int:
        """Experts gone over all layers: the counts before less the experts kept."""
        return sum(self.num_experts[layer] - kept for layer, kept in self.kept_counts().items())

    def _check_plan_fields(self) -> None:
        """``ratio`` and ``metadata``, alike in every plan."""
        if self.ratio is not None:
            ratio = real_number(self.ratio)  # a NumPy float as a Python one (a plan file holds no other)
            if ratio is None or not 0 <= ratio < 1:
                raise PlanError(f"ratio must be a number in [0, 1) or null, got {show(self.ratio)}")
            self.ratio = ratio
        if not isinstance(self.metadata, dict):
            raise PlanError(f"metadata must be an object, got {show(self.metadata)}")
        check_finite({"metadata": self.metadata}, self.KIND)
        check_text({name: getattr(self, name) for name in self.FIELDS}, self.KIND)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        """The plan ``data`` describes (`to_dict`'s form); any break of the schema is a [`PlanError`][]."""
        if not isinstance(data, Mapping):
            raise PlanError(f"{cls.KIND} must be an object {cls.SHAPE}, got {show(data)}")
        unknown = sorted(set(data) - set(cls.FIELDS), key=str)
        if unknown:
            raise PlanError(f"unknown {cls.KIND} keys {listed(unknown)}; its keys: {', '.join(cls.FIELDS)}")
        missing = [key for key in cls.REQUIRED if key not in data]
        if missing:
            raise PlanError(f"{cls.KIND} is missing {missing[0]!r}" if len(missing) == 1 else
                            f"{cls.KIND} is missing {missing}")
        check_finite(data, cls.KIND)
        check_text(data, cls.KIND)
        return cls(**data)

    def save(self, path: str | os.PathLike) -> Path:
        return write_json(self.to_dict(), path, indent=self.INDENT)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Any:
        """The plan saved at ``path``; a [`PlanError`][] names the file."""
        return read_parsed(path, cls.KIND, PlanError, cls.from_dict)
