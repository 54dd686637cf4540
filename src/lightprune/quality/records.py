"""Per-row records: the evaluation rows every figure of the results page is computed from, kept compactly.

Each testbed seed's file (``docs/results/seeds/<part>-seed<n>.json``) keeps, for every metric a claim is judged
on, each plan's per-row sums (`ROW_SUMS`: the numerator n_r and denominator
d_r of every evaluation row r), so that every p-value, paired difference and bootstrap interval can be computed
again from the file alone (``scripts/recompute_results.py``, which reads these arrays with numpy and draws the
same bootstrap rows). An array is float32, little-endian, zlib-compressed and base64-encoded (`pack`); the
measured sums are rounded to float32 before any figure is computed from them (`as_recorded`), so the
record is the source of every figure, not an approximation of it. Random plans are kept as their rows' sums and
their seed (the plan itself is drawn again from the seed: ``score_weights(model, "random", seed=s)``), never as
the pruned experts.

The record of one seed::

    {"format": 1, "bootstrap": {"resamples", "seed", "level", "rows": how the resampled rows are drawn},
     "metrics": {metric: {"denominator": packed d (the same rows' d for every plan), "dense": packed n,
                          "plans": {"<criterion>@<ratio>" | "random:<seed>@<ratio>": packed n}}}}

A plan whose denominators differ from the dense model's keeps ``[packed n, packed d]`` instead of ``packed n``.

MWOP's rows are means over task families of each family's retention (its ATR), so their record keeps each
evaluation row's task id and, per plan, every sum those figures read (`TaskRowRecords`)::

    {"format": 1, "bootstrap": {...}, "fields": [the sums' names, e.g. "right", "tokens", "nll"],
     "task": packed task ids [R], "dense": packed [F * R] (field-major), "plans": {"<point>/<method>" |
     "<point>/random:<seed>": packed [F * R]}}
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["RECORD_FORMAT", "RowRecords", "TaskRowRecords", "as_recorded", "as_recorded_rows", "pack", "plan_key",
           "unpack"]

RECORD_FORMAT = 1


def pack(values: torch.Tensor) -> str:
    """``values`` (any shape: flattened) as float32 little-endian bytes, zlib-compressed, base64 text."""
    array = torch.as_tensor(values).detach().flatten().to(torch.float32).cpu().numpy().astype("<f4")
    return base64.b64encode(zlib.compress(array.tobytes(), 9)).decode("ascii")


def unpack(text: str) -> torch.Tensor:
    """The float64 tensor of a `pack` string (the float32 values, exactly)."""
    import numpy as np

    raw = zlib.decompress(base64.b64decode(text.encode("ascii")))
    return torch.from_numpy(np.frombuffer(raw, dtype="<f4").astype(np.float64))


def as_recorded(sums: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Row sums rounded to float32 (as `pack` keeps them), in float64: what every figure is computed from."""
    return {m: tuple(torch.as_tensor(t).detach().flatten().to(torch.float32).double() for t in pair)
            for m, pair in sums.items()}


def as_recorded_rows(rows: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-row sums ``{field: [R]}`` (e.g. `answer_row_sums`) rounded to float32
    as `pack` keeps them, in float64: what MWOP's figures are computed from (task ids are exact)."""
    return {k: torch.as_tensor(v).detach().flatten().to(torch.float32).double() for k, v in rows.items()}


def plan_key(name: str, ratio: float) -> str:
    """The record key of a plan: ``"<name>@<ratio>"`` (a random plan's name is ``random:<seed>``)."""
    return f"{name}@{float(ratio):g}"


class RowRecords:
    """Collects the row sums of the dense model and of every plan for ``metrics`` (`add`) into the record
    of the module docstring (`to_dict`)."""

    def __init__(self, metrics, dense: Mapping[str, tuple[torch.Tensor, torch.Tensor]], *, resamples: int,
                 seed: int, level: float):
        self.metrics = [m for m in metrics if m in dense]
        self.dense = {m: dense[m] for m in self.metrics}
        self.plans: dict[str, dict[str, Any]] = {m: {} for m in self.metrics}
        self.bootstrap = {"resamples": int(resamples), "seed": int(seed), "level": float(level),
                          "rows": "torch.randint(0, R, (resamples, R), generator=torch.Generator().manual_seed(seed))"
                                  " over the R rows; percentiles by linear interpolation"}

    def add(self, key: str, sums: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep the plan ``key``'s row sums of every recorded metric it has."""
        for metric in self.metrics:
            if metric not in sums:
                continue
            numerator, denominator = sums[metric]
            same = torch.equal(torch.as_tensor(denominator).double().flatten(),
                               torch.as_tensor(self.dense[metric][1]).double().flatten())
            self.plans[metric][key] = pack(numerator) if same else [pack(numerator), pack(denominator)]

    def to_dict(self) -> dict[str, Any]:
        return {"format": RECORD_FORMAT, "bootstrap": dict(self.bootstrap),
                "metrics": {m: {"denominator": pack(self.dense[m][1]), "dense": pack(self.dense[m][0]),
                                "plans": dict(self.plans[m])} for m in self.metrics}}


class TaskRowRecords:
    """Collects, for a table of task-mean figures (MWOP's ATRs), each row's task id and the dense model's and every
    plan's sums of ``fields`` (`add`) into the record of the module docstring (`to_dict`)."""

    def __init__(self, fields, dense: Mapping[str, torch.Tensor], *, resamples: int, seed: int, level: float):
        self.fields = list(dict.fromkeys(fields))
        missing = [f for f in ["task", *self.fields] if f not in dense]
        if missing:
            raise ValueError(f"the dense rows have no {missing} (they have {sorted(dense)})")
        self.tasks = pack(dense["task"])
        self._task_ids = unpack(self.tasks)  # the dense rows' task ids as recorded: each plan's are compared once
        self.dense = self._packed(dense)
        self.plans: dict[str, str] = {}
        self.bootstrap = {"resamples": int(resamples), "seed": int(seed), "level": float(level),
                          "rows": "torch.randint(0, R, (resamples, R), generator=torch.Generator().manual_seed(seed))"
                                  " over the R rows; percentiles by linear interpolation"}

    def _packed(self, rows: Mapping[str, torch.Tensor]) -> str:
        return pack(torch.stack([torch.as_tensor(rows[f]).double().flatten() for f in self.fields]))

    def add(self, key: str, rows: Mapping[str, torch.Tensor]) -> None:
        """Keep the plan ``key``'s rows (the same rows, in the same order, as the dense model's)."""
        if key in self.plans:
            raise ValueError(f"plan {key!r} is recorded already")
        if not torch.equal(torch.as_tensor(rows["task"]).double().flatten(), self._task_ids):
            raise ValueError(f"plan {key!r}: its rows' task ids differ from the dense model's")
        self.plans[key] = self._packed(rows)

    def to_dict(self) -> dict[str, Any]:
        return {"format": RECORD_FORMAT, "bootstrap": dict(self.bootstrap), "fields": list(self.fields),
                "task": self.tasks, "dense": self.dense, "plans": dict(self.plans)}
