"""WidthExport: write the MWOP search's chosen model as a verified width checkpoint (MWOP ("MWOP: Modality-aware
Width-wise Operation Pruning for Efficient MLLMs"), appendix D.5).

At the end of the fit (phase ``export``) it takes the run state's width plan (the
[`WidthSearch`][..width_search.WidthSearch]'s
choice; the model is left with the chosen candidate's recovered weights and masks) or ``plan_path``; computes the masked model's logits on a
probe batch (the first batch of the evaluation set: image and text tokens, so every path is exercised);
removes the masks; merges the LoRA adapter into the base weights (the projector was trained in full, so
it is already there); and writes the checkpoint with
[`lightprune.export.save_width_pruned`][lightprune.export.width.save_width_pruned], which
reloads it with the path-sparse attention and compact FFNs swapped in and checks the logits against the
masked ones. ``report.json`` in the run directory records the plan's pruned fractions, the search's ATR
and FLOPs, checkpoint bytes and timings. Only rank 0 writes.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightprune.callbacks.export import checkpoint_path
from lightprune.callbacks.export_dirs import WritesCheckpoint, check_checkpoint_dir, check_plan_path
from lightprune.callbacks.job_end import JobEndCallback
from lightprune.callbacks.options import OPTIONS, uses_options
from lightprune.callbacks.state import RunState, run_directory
from lightprune.core.batch import model_inputs
from lightprune.export import save_width_pruned
from lightprune.export.verify import model_logits
from lightprune.finetune.houlsby import has_houlsby
from lightprune.models.unwrap import base_model_of
from lightprune.reporting.report import merge_report
from lightprune.width.mask import mask_width
from lightprune.width.plan import WidthPlan

__all__ = ["WidthExport"]


def _merged(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model with a peft LoRA merged in (in place); other adapters are refused."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        return model.merge_and_unload()
    base = base_model_of(model)
    if has_houlsby(base):
        raise ValueError("WidthExport merges LoRA adapters; Houlsby adapters add modules a checkpoint of the "
                         "stock architecture cannot hold")
    return base


@uses_options(OPTIONS["WidthExport"])
class WidthExport(WritesCheckpoint, JobEndCallback):
    """Export the width-pruned model of the run.

    Args:
        output_dir: run directory for report.json (default: ``trainer.default_root_dir``).
        checkpoint_dir: where the checkpoint goes (default: ``<output_dir>/model``).
        plan_path: export the model as it is with this saved width_plan.json (a run with a WidthSearch exports
            the search's plan: the two are refused together).
        overwrite: replace an existing checkpoint directory.
        atol: largest logit difference accepted by verification (default 1e-5 fp32, 1e-2 bf16/fp16).
        align: the compact FFN's channel alignment b (paper: 64).
    """

    def __init__(self, output_dir: str | None = None, checkpoint_dir: str | None = None,
                 plan_path: str | None = None, overwrite: bool = False, atol: float | None = None, align: int = 64):
        super().__init__()
        plan_path = check_plan_path(plan_path) if plan_path is not None else None
        self.output_dir, self.checkpoint_dir, self.plan_path = output_dir, checkpoint_dir, plan_path
        self.overwrite, self.atol = overwrite, self.OPTIONS.check("atol", atol)
        self.align = self.OPTIONS.check("align", align)
        self.report: dict[str, Any] | None = None

    def check(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # an existing checkpoint directory without overwrite fails now, before the search is spent
        check_checkpoint_dir(checkpoint_path(trainer, self.output_dir, self.checkpoint_dir), self.overwrite,
                             "width_export")

    def _plan(self, trainer: pl.Trainer) -> WidthPlan:
        state = RunState.of(trainer)
        if self.plan_path is not None:
            plan = WidthPlan.load(self.plan_path)
            state.width_plan = state.width_plan or plan
            return plan
        if state.width_plan is None:
            raise ValueError("WidthExport needs a plan: add a WidthSearch callback (it must finish: a fit stopped "
                             "early has no plan) or set plan_path")
        return state.width_plan

    def _probe(self, trainer: pl.Trainer) -> dict[str, Any]:
        batch = next(iter(trainer.datamodule.val_dataloader()))
        return model_inputs(batch)

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.report is not None:
            return
        start = time.perf_counter()
        plan = self._plan(trainer)
        run_dir = run_directory(trainer, self.output_dir)
        ckpt_dir = checkpoint_path(trainer, self.output_dir, self.checkpoint_dir)
        probe = self._probe(trainer)
        RunState.of(trainer).release_width_masks()  # the search's masks; the reference is taken with the plan's
        with mask_width(pl_module.model, plan):
            reference = model_logits(pl_module.model, probe)
        model = _merged(pl_module.model)
        pl_module.model = model
        processor = getattr(trainer.datamodule, "processor", None)
        if trainer.is_global_zero:
            state = RunState.of(trainer)
            evaluation = {"evaluation": dict(state.evaluation)} if state.evaluation else {}
            result = save_width_pruned(model, plan, ckpt_dir, probe=probe, reference_logits=reference,
                                       atol=self.atol, align=self.align, overwrite=self.overwrite, processor=processor,
                                       metadata={"search": dict(plan.metadata), **evaluation})
            state.exported = result.path  # Evaluate records what it measures after the export there
            self.report = {"method": "mwop", "checkpoint": str(result.path),
                           "checkpoint_bytes": sum(f.stat().st_size for f in result.path.rglob("*") if f.is_file()),
                           "pruned_fractions": result.pruned_fractions, "search": dict(plan.metadata),
                           "verification": result.verification, "seconds": time.perf_counter() - start}
            merge_report(self.report, run_dir / "report.json")  # other callbacks' entries are kept
            rank_zero_info(f"WidthExport: wrote {ckpt_dir} (max |logit diff| {result.max_abs_diff:.2g}); "
                           f"pruned {result.pruned_fractions}")
        else:
            self.report = {}
        trainer.strategy.barrier()
