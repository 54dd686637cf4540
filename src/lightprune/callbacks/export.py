"""Export: apply the run's ExpertPlan structurally, save, reload, verify, report.

At the end of the job (``on_export``, ``on_calibrate_end`` or ``on_fit_end``) it takes the plan
from the run's :class:`ExpertPruning` callback (running it first if it has not run yet, so the
order of the two in the callback list does not matter) or from ``plan_path``, computes the masked model's logits on a probe batch, prunes in
place, writes the checkpoint (temporary directory renamed into place) and verifies the reloaded
checkpoint against the masked logits. It writes ``report.json`` (parameter counts and checkpoint
bytes before and after, per-layer kept counts, timings) and ``kept_experts.png``, and prints a
summary table.

Across processes every rank leaves with the same pruned architecture and only rank 0 writes and
verifies. Under DDP and ZeRO-1/2 every rank applies the plan to its full copy. Under ZeRO-3 the
model is first un-partitioned one module at a time (:func:`lightprune.distributed.materialize`):
rank 0 gathers the full values onto the CPU in the weights' own dtype (16-bit under mixed
precision) and is the only rank holding them; the other ranks keep ``meta`` tensors of the same
shapes and apply the same surgery to those.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from ..distributed import materialize
from ..export import export_pruned
from ..models import find_moe_layers
from ..plan import ExpertPlan
from ..report import plot_kept_experts, print_summary, write_report
from ..surgery import prune_experts
from .expert_pruning import ExpertPruning
from .job_end import JobEndCallback

__all__ = ["Export", "export_with_report"]


def _dir_bytes(path: Path) -> int | None:
    if not path.is_dir():
        return None
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def export_with_report(model, plan: ExpertPlan, run_dir: Path, ckpt_dir: Path, *, source: Any,
                       seconds_scoring: float, overwrite: bool, atol: float | None, summary: bool,
                       extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Prune ``model`` by ``plan``, export and verify it to ``ckpt_dir``, then write ``report.json``
    and ``kept_experts.png`` to ``run_dir`` (and print the summary table); returns the report."""
    start = time.perf_counter()
    result = export_pruned(model, plan, ckpt_dir, overwrite=overwrite, atol=atol)
    before = Path(source) if isinstance(source, str) else None
    report = {
        "source": source,
        "criterion": plan.criterion,
        "ratio": plan.ratio,
        "allocation": plan.allocation,
        **(extra or {}),
        "experts_before": sum(plan.num_experts.values()),
        "experts_after": sum(len(ids) for ids in plan.keep.values()),
        "params_before": result["params_before"],
        "params_after": result["params_after"],
        "checkpoint_bytes_before": _dir_bytes(before) if before is not None else None,
        "checkpoint_bytes_after": result["checkpoint_bytes"],
        "expected_bytes_after": result["expected_bytes"],
        "kept_per_layer": {str(l): len(ids) for l, ids in plan.keep.items()},
        "max_abs_diff": result["max_abs_diff"],
        "seconds_scoring": seconds_scoring,
        "seconds_export": time.perf_counter() - start,
        "checkpoint_dir": str(ckpt_dir),
    }
    write_report(report, run_dir / "report.json")
    plot_kept_experts(plan, run_dir / "kept_experts.png")
    if summary:
        print_summary(report)
    return report


class Export(JobEndCallback):
    """Prune by the run's plan and export a verified checkpoint.

    Args:
        output_dir: run directory for report.json and the PNG (default: ``trainer.default_root_dir``).
        checkpoint_dir: where the pruned checkpoint goes (default: ``<output_dir>/model``).
        plan_path: apply this plan.json instead of the one an ExpertPruning callback made.
        overwrite: replace an existing checkpoint directory.
        atol: largest logit difference accepted by verification (default: 1e-5 in fp32, 1e-2 in
            bf16/fp16, where a near tie between router scores can flip an expert choice).
        summary: print the summary table.
    """

    def __init__(self, output_dir: str | None = None, checkpoint_dir: str | None = None,
                 plan_path: str | None = None, overwrite: bool = False, atol: float | None = None,
                 summary: bool = True):
        super().__init__()
        if plan_path is not None and not Path(plan_path).is_file():
            raise FileNotFoundError(f"plan_path {plan_path!r} does not exist")
        self.output_dir, self.checkpoint_dir, self.plan_path = output_dir, checkpoint_dir, plan_path
        if atol is not None and not atol > 0:
            raise ValueError(f"atol must be positive, got {atol!r}")
        self.overwrite, self.atol, self.summary = overwrite, atol, summary
        self.report: dict[str, Any] | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # a plan_path made for another model fails here, before the run writes anything (config.yaml)
        if self.plan_path is not None and getattr(pl_module, "model", None) is not None:
            ExpertPlan.load(self.plan_path).check_layers(find_moe_layers(pl_module.model))

    def _plan(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[ExpertPlan, float]:
        if self.plan_path is not None:
            return ExpertPlan.load(self.plan_path), 0.0
        pruning = [cb for cb in trainer.callbacks if isinstance(cb, ExpertPruning)]
        if not pruning:
            raise ValueError("Export needs a plan: add an ExpertPruning callback or set plan_path")
        pruning[0].run(trainer, pl_module)
        return pruning[0].plan, pruning[0].seconds or 0.0

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.report is not None:
            return
        plan, seconds_scoring = self._plan(trainer, pl_module)
        run_dir = Path(self.output_dir or trainer.default_root_dir)
        ckpt_dir = Path(self.checkpoint_dir) if self.checkpoint_dir else run_dir / "model"
        materialize(pl_module.model, engine=trainer.strategy.model)  # ZeRO-3 only; every rank
        if not trainer.is_global_zero:
            # every rank leaves with the same pruned model; only rank 0 writes (and verifies) the checkpoint
            prune_experts(pl_module.model, plan)
            self.report = {}
            return
        source = getattr(pl_module, "source", type(pl_module.model).__name__)
        self.report = export_with_report(pl_module.model, plan, run_dir, ckpt_dir, source=source,
                                         seconds_scoring=seconds_scoring, overwrite=self.overwrite,
                                         atol=self.atol, summary=self.summary)
