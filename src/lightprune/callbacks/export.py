"""Export: apply the run's ExpertPlan structurally, save, reload, verify, report.

At the end of the job (phase ``export``: after ExpertPruning, wherever either is listed) it takes the plan from the run
state (made by [`ExpertPruning`][..expert_pruning.ExpertPruning]) or from ``plan_path`` (then no ExpertPruning selects,
and the run's plan.json, or merge_plan.json, is written from the file once the export has succeeded), computes the
masked model's logits on a probe batch, prunes in place, writes the checkpoint (temporary directory renamed into place)
and verifies the reloaded checkpoint against the masked logits. The checkpoint holds the source's tokenizer files (or
the run's tokenizer / processor when the source has none) and a README.md model card. A model fitted on 4-bit base
weights (QLoRA) is exported from its full-precision original, rebuilt by the LightningModule. It writes ``report.json``
(parameter counts and checkpoint bytes before and after, per-layer kept counts, timings) and ``kept_experts.png``, and
prints a summary table.

Across processes only rank 0 writes and verifies. When the weights are still the source checkpoint's (a
calibration job from a local checkpoint: no training, adapter, 4-bit base or precision cast), rank 0 prunes the
source checkpoint shard by shard with the agreed plan
([`lightprune.export.prune_checkpoint`][lightprune.export.streamed.prune_checkpoint]) instead of
writing the model: under DDP and ZeRO-1/2 every rank also applies the plan to its full copy; under ZeRO-3 nothing
is gathered and the in-memory model stays partitioned and unpruned (unless an evaluation follows the export, which
needs the pruned model: then it is gathered as below). Otherwise every rank leaves with the same pruned
architecture: under DDP and ZeRO-1/2 every rank applies the plan to its full copy; under ZeRO-3 the model is first
un-partitioned one module at a time (`lightprune.core.distributed.materialize`): rank 0 gathers the full values
onto the CPU in the weights' own dtype (16-bit under mixed precision) and is the only rank holding them; the other
ranks keep ``meta`` tensors of the same shapes and apply the same surgery to those.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from lightprune.callbacks.export_dirs import (
    RUN_FILES,
    WritesCheckpoint,
    check_checkpoint_dir,
    check_plan_path,
    checkpoint_dir_of,
)
from lightprune.callbacks.job_end import JobEndCallback
from lightprune.callbacks.options import OPTIONS, uses_options
from lightprune.callbacks.state import RunState, run_directory
from lightprune.checkpoints.directory import TOKENIZER_FILES, weight_files
from lightprune.core.distributed import has_partitioned, materialize
from lightprune.core.errors import PlanError
from lightprune.core.jsonio import read_json
from lightprune.experts.merging import MergePlan, merge_experts
from lightprune.experts.plan import ExpertPlan
from lightprune.experts.prune import prune_experts
from lightprune.export import ExportResult, export_pruned, prune_checkpoint
from lightprune.export.source import resolve_source_dir
from lightprune.finetune.quantize import is_quantized_4bit
from lightprune.models import find_moe_layers
from lightprune.reporting.report import plot_kept_experts, write_report

__all__ = ["Export"]


def _figures(result: ExportResult, params_before: int | None) -> dict[str, Any]:
    """The report's figures of the export ``result`` (the unpruned model's parameters given; the source's checkpoint
    bytes are the manifest's, as the model card shows them: None without a local source)."""
    return {"params_before": params_before, "params_after": result.parameters,
            "checkpoint_bytes_before": result.weight_bytes_before, "checkpoint_bytes_after": result.weight_bytes,
            "expected_bytes_after": result.parameter_bytes, "max_abs_diff": result.max_abs_diff}


def _run_report(plan: ExpertPlan, run_dir: Path, ckpt_dir: Path, *, source: Any, figures: dict[str, Any],
                seconds_scoring: float, start: float) -> dict[str, Any]:
    """``report.json`` (the plan's facts, ``figures`` of the export, timings) and ``kept_experts.png``; returns the
    report."""
    report = {
        "source": source,
        "criterion": plan.criterion,
        "ratio": plan.ratio,
        "allocation": plan.allocation,
        "experts_before": sum(plan.num_experts.values()),
        "experts_after": sum(len(ids) for ids in plan.keep.values()),
        **figures,
        "kept_per_layer": {str(l): len(ids) for l, ids in plan.keep.items()},
        "n_per_layer": plan.metadata.get("n_per_layer"),
        "seconds_scoring": seconds_scoring,
        "seconds_export": time.perf_counter() - start,
        "checkpoint_dir": str(ckpt_dir),
    }
    write_report(report, run_dir / "report.json")
    plot_kept_experts(plan, run_dir / "kept_experts.png")
    return report


def export_with_report(model, plan: ExpertPlan | MergePlan, run_dir: Path, ckpt_dir: Path, *, source: Any,
                       seconds_scoring: float, overwrite: bool, atol: float | None,
                       extra: dict[str, Any] | None = None, processor: Any = None,
                       evaluation: dict[str, Any] | None = None, quantize: str | None = None) -> dict[str, Any]:
    """Prune (a MergePlan: merge) ``model`` by ``plan``, export and verify it to ``ckpt_dir`` (with the source
    checkpoint's tokenizer files, else ``processor``, and a model card), then write ``report.json`` and
    ``kept_experts.png`` to ``run_dir``; returns the report (`lightprune.reporting.report.summary_table`
    shows it)."""
    start = time.perf_counter()
    card = {"source": str(source), **({"evaluation": evaluation} if evaluation else {})}
    result = export_pruned(model, plan, ckpt_dir, overwrite=overwrite, atol=atol, processor=processor, card=card,
                           quantize=quantize)
    figures = {**(extra or {}), **_figures(result, result.parameters_before)}
    layout = plan
    if isinstance(plan, MergePlan):
        layout = plan.expert_plan()
        figures["merge"] = {"method": plan.method, "router": plan.router, "align": plan.align}
    return _run_report(layout, run_dir, ckpt_dir, source=source, figures=figures, seconds_scoring=seconds_scoring,
                       start=start)


def streamed_export_with_report(source_dir: Path, plan: ExpertPlan, run_dir: Path, ckpt_dir: Path, *, source: Any,
                                params_before: int, seconds_scoring: float, overwrite: bool,
                                atol: float | None, quantize: str | None = None, device: Any = "cpu") -> dict[str, Any]:
    """[`lightprune.export.prune_checkpoint`][lightprune.export.streamed.prune_checkpoint] of ``source_dir`` by ``plan``
    into ``ckpt_dir`` (verified on ``device``), then the same ``report.json`` and ``kept_experts.png`` as
    `export_with_report`, from the checkpoints."""
    start = time.perf_counter()
    result = prune_checkpoint(source_dir, plan, ckpt_dir, overwrite=overwrite, atol=atol,
                              card={"source": str(source or source_dir)}, quantize=quantize, device=device)
    figures = {"streamed": True, **_figures(result, params_before)}
    return _run_report(plan, run_dir, ckpt_dir, source=source or str(source_dir), figures=figures,
                       seconds_scoring=seconds_scoring, start=start)


def checkpoint_path(trainer: pl.Trainer, output_dir: str | None, checkpoint_dir: str | None) -> Path:
    """Where an export callback writes the checkpoint: ``checkpoint_dir``, else ``<output_dir or
    trainer.default_root_dir>/model``."""
    return checkpoint_dir_of({"output_dir": output_dir, "checkpoint_dir": checkpoint_dir}, trainer.default_root_dir)


@uses_options(OPTIONS["Export"])
class Export(WritesCheckpoint, JobEndCallback):
    """Prune by the run's plan and export a verified checkpoint.

    Args:
        output_dir: run directory for report.json and the PNG (default: ``trainer.default_root_dir``).
        checkpoint_dir: where the pruned checkpoint goes (default: ``<output_dir>/model``).
        plan_path: apply this plan.json (or merge this merge_plan.json) instead of the plan an ExpertPruning
            callback would make (one listed then selects nothing; the run's plan.json is this plan).
        overwrite: replace an existing checkpoint directory; the previous run's files in the run folder that this run
            does not write (its calibration.json beside a new plan) are deleted when the new checkpoint is published.
        atol: the absolute term of verification's tolerance ``atol + rtol * max|reference|`` (default: 1e-5 in
            fp32, 1e-2 in bf16/fp16, where a near tie between router scores can flip an expert choice; ``rtol``:
            `lightprune.export.verify.default_rtol`).
        summary: print the summary table at the end of the job (with Evaluate's perplexity before and after).
        quantize: ``"fp8"``: once verified, write the checkpoint FP8 block-scaled (the DeepSeek-V3 layout
            transformers and the serving stacks load;
            [`lightprune.quantize_checkpoint`][lightprune.export.quantize.quantize_checkpoint]), in 128x128 blocks or
            those of the FP8 checkpoint the model was loaded from; a checkpoint streamed from a quantized source keeps
            its own format without it. None: the weights' dtype.
    """

    def __init__(self, output_dir: str | None = None, checkpoint_dir: str | None = None,
                 plan_path: str | None = None, overwrite: bool = False, atol: float | None = None,
                 summary: bool = True, quantize: str | None = None):
        super().__init__()
        plan_path = check_plan_path(plan_path) if plan_path is not None else None
        self.output_dir, self.checkpoint_dir, self.plan_path = output_dir, checkpoint_dir, plan_path
        self.overwrite, self.atol, self.summary = overwrite, self.OPTIONS.check("atol", atol), summary
        self.quantize = self.OPTIONS.check("quantize", quantize)
        self.report: dict[str, Any] | None = None

    def check(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # an existing checkpoint directory without overwrite fails now, before any data is spent
        check_checkpoint_dir(self._checkpoint_dir(trainer), self.overwrite, "export")
        # a plan_path made for another model fails here, before the run writes anything (config.yaml)
        if self.plan_path is not None and getattr(pl_module, "model", None) is not None:
            _load_plan(self.plan_path).check_layers(find_moe_layers(pl_module.model))
        if self.overwrite and trainer.is_global_zero:  # the previous run's files this run does not rewrite (its
            # calibration.json beside a new plan) are deleted when the new checkpoint is published with its files
            RunState.of(trainer).previous_files(run_directory(trainer, self.output_dir), RUN_FILES)

    def _plan(self, trainer: pl.Trainer) -> tuple[ExpertPlan, MergePlan | None, float]:
        """(the kept layout, the merge plan when the experts are merged, the seconds spent scoring)."""
        state = RunState.of(trainer)
        if self.plan_path is not None:  # the plan applied, so the run's plan file (written once the export succeeded)
            loaded = _load_plan(self.plan_path)
            merge = loaded if isinstance(loaded, MergePlan) else None
            plan = merge.expert_plan() if merge is not None else loaded
            state.expert_plan, state.merge_plan = plan, merge
            if trainer.is_global_zero:
                run_dir = run_directory(trainer, self.output_dir)
                if merge is not None:
                    state.stage_file(run_dir / "merge_plan.json", merge.to_dict(), indent=MergePlan.INDENT)
                else:
                    state.stage_file(run_dir / "plan.json", plan.to_dict(), indent=ExpertPlan.INDENT)
            return plan, merge, 0.0
        if state.expert_plan is None:
            raise ValueError("Export needs a plan: add an ExpertPruning callback or set plan_path")
        return state.expert_plan, state.merge_plan, state.scoring_seconds

    def _checkpoint_dir(self, trainer: pl.Trainer) -> Path:
        return checkpoint_path(trainer, self.output_dir, self.checkpoint_dir)

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.report is not None:
            return
        plan, merge, seconds_scoring = self._plan(trainer)
        run_dir = run_directory(trainer, self.output_dir)
        ckpt_dir = self._checkpoint_dir(trainer)
        state = RunState.of(trainer)
        for name in ("report.json", "kept_experts.png"):  # written once the checkpoint is in place
            state.supersedes(run_dir / name)
        skeleton = getattr(pl_module, "skeleton", None)
        if merge is not None and skeleton is not None:
            raise ValueError("a merge plan is exported from the model in memory; this run streams the checkpoint "
                             "(MoECausalLM sequential=True): run it without sequential")
        # MoECausalLM(sequential=True), or several processes whose weights are still the source's: rank 0 prunes the
        # source checkpoint shard by shard (a merge writes new expert tensors: from the model in memory)
        source_dir = skeleton.checkpoint.path if skeleton is not None else \
            None if merge is not None else _stream_source(trainer, pl_module)
        if source_dir is not None:
            model = pl_module.model
            params_before = sum(int(getattr(p, "ds_numel", 0) or p.numel()) for p in model.parameters())
            if not has_partitioned(model):  # every rank's copy (a meta skeleton: its shapes) takes the plan
                prune_experts(model, plan)
            self.report = {} if not trainer.is_global_zero else streamed_export_with_report(
                source_dir, plan, run_dir, ckpt_dir, source=getattr(pl_module, "source", None),
                params_before=params_before, seconds_scoring=seconds_scoring, overwrite=self.overwrite,
                atol=self.atol, quantize=self.quantize,
                device=skeleton.device if skeleton is not None else "cpu")  # where the module streams
            if trainer.is_global_zero:
                RunState.of(trainer).exported = ckpt_dir
            self._summarise(trainer)
            return
        model = _full_precision(pl_module)
        materialize(model, engine=trainer.strategy.model)  # ZeRO-3 only; every rank
        _to_trainer_precision(model, trainer)
        if not trainer.is_global_zero:
            # every rank leaves with the same pruned (merged) model; only rank 0 writes (and verifies) the checkpoint;
            # under ZeRO-3 the other ranks hold shapes on the meta device, which take the layout alone
            if merge is not None and not any(p.device.type == "meta" for p in model.parameters()):
                merge_experts(model, merge)
            else:
                prune_experts(model, plan)
            self.report = {}
            return
        source = getattr(pl_module, "source", type(model).__name__)
        self.report = export_with_report(model, merge or plan, run_dir, ckpt_dir, source=source,
                                         seconds_scoring=seconds_scoring, overwrite=self.overwrite,
                                         atol=self.atol,
                                         processor=_run_tokenizer(model, trainer.datamodule or state.datamodule),
                                         evaluation=dict(state.evaluation) or None, quantize=self.quantize)
        state.exported = ckpt_dir
        self._summarise(trainer)

    def _summarise(self, trainer: pl.Trainer) -> None:
        """The summary table, printed once the job's steps have all run (the evaluation after the export too)."""
        if self.summary and self.report:
            RunState.of(trainer).summary = self.report


def _load_plan(path: str | Path) -> ExpertPlan | MergePlan:
    """The plan file at ``path``: a merge plan (it has ``clusters``) or an expert plan."""
    data = read_json(path, "plan", PlanError)
    return MergePlan.load(path) if isinstance(data, dict) and "clusters" in data else ExpertPlan.load(path)


def _stream_source(trainer: pl.Trainer, pl_module: pl.LightningModule) -> Path | None:
    """The source checkpoint directory when a multi-process export streams from it instead of gathering the model:
    the job did not train (a calibration), the weights are the source's (no adapter, no 4-bit base, no
    ``--trainer.precision`` cast) and it is a local safetensors checkpoint; under ZeRO-3 also no evaluation after
    the export (which needs the pruned model in memory, so the model is gathered then)."""
    from lightning.pytorch.trainer.states import TrainerFn

    model = pl_module.model
    if trainer.world_size < 2 or trainer.state.fn == TrainerFn.FITTING or getattr(pl_module, "adapter", None):
        return None
    if is_quantized_4bit(model) or str(getattr(trainer, "precision", "")) in _TRUE_PRECISION:
        return None
    if has_partitioned(model) and RunState.of(trainer).has_phase("evaluate"):
        return None
    source = resolve_source_dir(model, None)
    if source is None:
        return None
    try:
        weight_files(source)
    except FileNotFoundError:  # no safetensors weights to stream from: the export runs in memory
        return None
    return source


def _full_precision(pl_module: pl.LightningModule):
    """The model to export: the module's model, or its full-precision original when the base weights are 4-bit
    (QLoRA; the plan applies to the original weights)."""
    model = pl_module.model
    if not is_quantized_4bit(model):
        return model
    if not hasattr(pl_module, "build_original"):
        raise ValueError("the fitted model has 4-bit base weights and the LightningModule cannot rebuild the "
                         "full-precision original (no build_original()); export needs the original weights")
    pl_module.model = pl_module.build_original()
    return pl_module.model


#: ``--trainer.precision`` values that convert the weights' dtype (Lightning's default "32-true" and the "-mixed"
#: ones keep the weights as they are: a bf16 checkpoint stays bf16)
_TRUE_PRECISION = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}


def _to_trainer_precision(model, trainer: pl.Trainer) -> None:
    """Honour ``--trainer.precision bf16-true`` (and 16-true, 64-true): the checkpoint is written in that dtype.

    ``lightprune fit`` has already converted the module; ``lightprune export`` runs no loop, so the precision
    plugin never did: cast the floating weights here, before the reference logits are taken."""
    dtype = _TRUE_PRECISION.get(str(getattr(trainer, "precision", "")))
    if dtype is None:
        return
    if any(p.is_floating_point() and p.dtype != dtype and p.device.type != "meta" for p in model.parameters()):
        model.to(dtype)


def _run_tokenizer(model, datamodule) -> Any:
    """The run's tokenizer / processor for the export, when the source checkpoint has no tokenizer files of its own
    (those are copied as they are); ``None`` without one."""
    source = resolve_source_dir(model, None)
    if source is not None and any((source / name).is_file() for name in TOKENIZER_FILES):
        return None
    return getattr(datamodule, "processor", None) or getattr(datamodule, "tokenizer", None)
