"""Evaluate: perplexity and accuracy on held-out data before and after pruning, merged into report.json.

Metrics (torchmetrics, over the positions whose next-token label is not -100: completions and answers
with the JSONL datamodules' prompt masking, every token of a plain text row):

- ``perplexity``: ``torchmetrics.text.Perplexity`` = exp(mean next-token cross-entropy); ``loss`` its log;
- ``next_token_accuracy``: the fraction of those positions whose argmax is the label
  (`TaskAccuracy` with one task, metric ``token``);
- ``task_accuracy``: per task family (the datamodule's ``task_names`` and the batches' ``task_ids``; one
  ``default`` family without them), `TaskAccuracy` with ``metric`` (``token``,
  ``exact`` whole-answer match, or ``prob``);
- ``lm_eval``: optionally, lm-evaluation-harness on local task YAML files (`run_lm_eval`) through its
  HF wrapper around the in-memory model (the ``eval`` extra, imported only then).

When (the ``Evaluate`` callback): ``before`` at the start of the job, on the model as built (``on_fit_start``
under ``fit``, ``setup`` under ``export``, the calibration loop's start under ``calibrate``, with the
calibration observer paused, so its batches are never observed); ``after`` at the end of the job (phase
``evaluate``: after scoring, selection and export, wherever it is listed), on the model they leave: pruned in
place, or masked by the run state's plan when it is not (an ExpertPlan through
[`mask_experts`][lightprune.experts.mask.mask_experts], a MergePlan through
[`merged_experts`][lightprune.experts.merging.merge.merged_experts], a WidthPlan through
[`mask_width`][lightprune.width.mask_width]). Under ``lightprune
test`` it evaluates the model as loaded, as ``test``. Results go to ``report.json`` in the run directory under
``"evaluation"``, merged with what is there (`lightprune.reporting.report.merge_report`); only rank 0 writes.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightprune.callbacks.job_end import JobEndCallback
from lightprune.callbacks.options import OPTIONS, uses_options
from lightprune.callbacks.state import RunState, run_directory
from lightprune.core.batch import model_inputs
from lightprune.core.jsonio import read_yaml
from lightprune.data.tokenizer import end_of_turn_ids
from lightprune.experts.mask import mask_experts
from lightprune.experts.merging import merged_experts
from lightprune.export.result import record_evaluation
from lightprune.models import find_moe_layers
from lightprune.models.unwrap import base_model_of
from lightprune.reporting.report import merge_report
from lightprune.width.mask import mask_width
from lightprune.width.retention import METRICS, TaskAccuracy

__all__ = ["Evaluate"]


def _labels(batch: Mapping[str, Any]) -> torch.Tensor:
    labels = batch.get("labels")
    if labels is not None:
        return labels
    mask = batch.get("attention_mask")
    ids = batch["input_ids"]
    return ids if mask is None else ids.masked_fill(mask == 0, -100)


@torch.no_grad()
def evaluate_lm(model: torch.nn.Module, batches: Iterable[Mapping[str, Any]], task_names: Sequence[str] | None = None,
                metric: str = "token", progress: bool = False, desc: str = "evaluate",
                max_batches: int | None = None, end_ids: Sequence[int] = ()) -> dict[str, Any]:
    """Perplexity, next-token accuracy and per-task accuracy of ``model`` over ``batches`` (mode restored); the
    task accuracy leaves the end-of-turn markers ``end_ids`` out of the answers
    (`lightprune.width.retention.answer_mask`), perplexity and next-token accuracy count every label."""
    from torchmetrics.text import Perplexity

    if metric not in METRICS:
        raise ValueError(f"metric must be one of {list(METRICS)}, got {metric!r}")
    names = list(task_names or ["default"])
    device = next(model.parameters()).device
    ppl = Perplexity(ignore_index=-100).to(device)
    next_token = TaskAccuracy(1, "token").to(device)
    tasks = TaskAccuracy(len(names), metric, end_ids).to(device)
    was_training = model.training
    model.eval()
    iterator: Iterable = batches if max_batches is None else itertools.islice(batches, max_batches)
    if progress:
        from tqdm.auto import tqdm

        total = len(batches) if hasattr(batches, "__len__") else None
        if max_batches is not None and total is not None:
            total = min(total, max_batches)
        iterator = tqdm(iterator, desc=desc, unit="batch", leave=False, total=total)
    samples = 0
    try:
        for batch in iterator:
            labels = _labels(batch).to(device)
            logits = model(**model_inputs(batch, device=device)).logits.float()
            if (labels[:, 1:] != -100).any():
                ppl.update(logits[:, :-1], labels[:, 1:])
            next_token.update(logits, labels)
            tasks.update(logits, labels, batch.get("task_ids"))
            samples += labels.shape[0]
    finally:
        model.train(was_training)
    tokens = int(next_token.total.sum())
    if tokens == 0:
        raise ValueError(f"{desc}: the evaluation set has no label tokens (labels != -100) in {samples} samples")
    value = float(ppl.compute())
    per_task = tasks.compute().reshape(-1).tolist()  # torchmetrics squeezes a 1-element result
    return {"perplexity": value, "loss": math.log(value), "next_token_accuracy": float(next_token.compute()),
            "metric": metric, "task_accuracy": {n: (None if v != v else v) for n, v in zip(names, per_task)},
            "tokens": tokens, "samples": samples}


def _require_lm_eval():
    try:
        import lm_eval  # noqa: F401
        from lm_eval.models.huggingface import HFLM
    except ImportError as err:
        from lightprune.core.extras import missing

        raise missing("eval", f"lm_eval_tasks (lm-evaluation-harness; import failed with: {err})") from None
    return HFLM


def load_lm_eval_task(path: str | Path) -> dict[str, Any]:
    """A local lm-eval task YAML as a config dict, its ``dataset_kwargs.data_files`` made absolute (relative
    paths are relative to the YAML file); a hub dataset (any ``dataset_path`` but a local format) is refused."""
    path = Path(path).expanduser()
    config = read_yaml(path, "lm_eval task")  # not there, not a regular file, empty, not UTF-8 YAML: said
    if not isinstance(config, dict) or "task" not in config:
        raise ValueError(f"{path}: an lm_eval task YAML needs a mapping with a 'task' name, got {type(config).__name__}")
    if config.get("dataset_path") not in ("json", "csv", "parquet", "text"):
        raise ValueError(f"{path}: dataset_path must be a local format (json, csv, parquet, text) with "
                         f"dataset_kwargs.data_files; got {config.get('dataset_path')!r} (nothing is downloaded)")
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    if not files:
        raise ValueError(f"{path}: dataset_kwargs.data_files is missing (the local JSONL of the task)")

    def resolve(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v) for v in value]
        file = Path(value).expanduser()
        file = file if file.is_absolute() else path.parent / file
        if not file.is_file():
            raise FileNotFoundError(f"{path}: data file {str(file)!r} does not exist")
        return str(file.resolve())

    config["dataset_kwargs"] = {**config["dataset_kwargs"], "data_files": resolve(files)}
    return config


def run_lm_eval(model: torch.nn.Module, tokenizer: Any, tasks: Sequence[str | Path], batch_size: int = 8,
                limit: int | None = None, log_samples: bool = False) -> dict[str, Any]:
    """lm-evaluation-harness on local task YAML files, through ``HFLM(pretrained=model)``; returns
    ``{task: {metric: value}}`` (and ``"samples"`` when ``log_samples``). Offline: sets ``HF_DATASETS_OFFLINE=1``
    unless the environment sets it (before ``datasets`` is first imported), and the tasks' data are local files."""
    import os

    HFLM = _require_lm_eval()
    configs = [load_lm_eval_task(t) for t in tasks]
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    was_training = model.training
    try:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(next(model.parameters()).device))
        out = simple_evaluate(model=lm, tasks=configs, task_manager=TaskManager(include_defaults=False),
                              limit=limit, log_samples=log_samples)
    finally:
        model.train(was_training)
    results = {name: {k: v for k, v in values.items() if k not in ("alias", "name")}
               for name, values in out["results"].items()}
    if log_samples:
        results["samples"] = out["samples"]
    return results


def _accuracies(per_task: dict[str, float | None]) -> str:
    """``0.8125`` for one task, ``digit 0.8125, count 0.9750`` for several (``-``: a task with no answer here)."""
    shown = {name: "-" if value is None else f"{value:.4f}" for name, value in per_task.items()}
    return next(iter(shown.values())) if len(shown) == 1 else ", ".join(f"{n} {v}" for n, v in shown.items())


@uses_options(OPTIONS["Evaluate"])
class Evaluate(JobEndCallback):
    """Perplexity and accuracy before and after pruning (see the module docstring).

    Args:
        split: the datamodule split to evaluate on: ``test`` or ``val``.
        metric: the per-task accuracy, ``token``, ``exact`` or ``prob`` (see `lightprune.width.retention`).
        when: ``before``, ``after`` or both (``lightprune test`` always evaluates once, as ``test``).
        max_batches: evaluate the first batches only.
        lm_eval_tasks: local lm-eval task YAML files (``dataset_path: json`` + ``dataset_kwargs.data_files``);
            needs the ``eval`` extra.
        lm_eval_batch_size: lm-eval's batch size.
        lm_eval_limit: lm-eval's samples per task (None: all).
        data: a datamodule to read the split from (default: the trainer's, under ``fit`` and ``test``; ``calibrate``
            and ``export`` do not give their callbacks one, so there it is needed).
        output_dir: the run directory of report.json (default: ``trainer.default_root_dir``).
        progress: progress bars over the evaluation batches.
    """

    phase = "evaluate"

    def __init__(self, split: str = "test", metric: str = "token", when: str | Sequence[str] = ("before", "after"),
                 max_batches: int | None = None, lm_eval_tasks: Sequence[str] = (), lm_eval_batch_size: int = 8,
                 lm_eval_limit: int | None = None, data: pl.LightningDataModule | None = None,
                 output_dir: str | None = None, progress: bool = True):
        super().__init__()
        options = self.OPTIONS
        options.check("split", split)
        options.check("metric", metric)
        when = [when] if isinstance(when, str) else list(when)
        if not when or any(w not in ("before", "after") for w in when):
            raise ValueError(f"when must be a non-empty subset of ['before', 'after'], got {when!r}")
        max_batches = options.check("max_batches", max_batches)
        self.lm_eval_tasks = [str(t) for t in lm_eval_tasks]
        if self.lm_eval_tasks:
            _require_lm_eval()
            for task in self.lm_eval_tasks:
                load_lm_eval_task(task)
        self.split, self.metric, self.when, self.max_batches = split, metric, when, max_batches
        self.lm_eval_batch_size = options.check("lm_eval_batch_size", lm_eval_batch_size)
        self.lm_eval_limit = lm_eval_limit
        self.data, self.output_dir, self.progress = data, output_dir, progress
        self.results: dict[str, Any] = {}
        self.written = False

    # ------------------------------------------------------------------ helpers
    def run_dir(self, trainer: pl.Trainer) -> Path:
        return run_directory(trainer, self.output_dir)

    def _datamodule(self, trainer: pl.Trainer):
        dm = self.data if self.data is not None else trainer.datamodule
        if dm is None:
            raise ValueError("Evaluate needs held-out data: give it data= (a datamodule); under lightprune fit and "
                             "test the trainer's datamodule serves, but calibrate and export pass none to callbacks")
        return dm

    def _loader(self, trainer: pl.Trainer):
        loader = getattr(self._datamodule(trainer), f"{self.split}_dataloader")()
        if isinstance(loader, list) and not loader:
            raise ValueError(f"Evaluate: the datamodule has no {self.split!r} split (no {self.split}= JSONL file); "
                             f"give one or set split to {'val' if self.split == 'test' else 'test'}")
        return loader

    def _tokenizer(self, trainer: pl.Trainer):
        dm = self._datamodule(trainer)
        tok = getattr(dm, "tokenizer", None) or getattr(getattr(dm, "processor", None), "tokenizer", None)
        if tok is None:
            raise ValueError(f"lm_eval_tasks need a tokenizer: {type(dm).__name__} has neither .tokenizer nor "
                             ".processor.tokenizer")
        return tok

    def measure(self, trainer: pl.Trainer, model: torch.nn.Module, label: str) -> dict[str, Any]:
        """Evaluate ``model`` now and keep the result as ``label``."""
        dm = self._datamodule(trainer)
        result = evaluate_lm(model, self._loader(trainer), getattr(dm, "task_names", None), self.metric,
                             progress=self.progress, desc=f"evaluate {label}", max_batches=self.max_batches,
                             end_ids=end_of_turn_ids(dm))
        if self.lm_eval_tasks:
            result["lm_eval"] = run_lm_eval(model, self._tokenizer(trainer), self.lm_eval_tasks,
                                            self.lm_eval_batch_size, self.lm_eval_limit)
        self.results[label] = result
        if getattr(trainer, "strategy", None) is not None:
            RunState.of(trainer).evaluation.update({"split": self.split, label: result})
        rank_zero_info(f"Evaluate ({label}): perplexity {result['perplexity']:.4g}, next-token accuracy "
                       f"{result['next_token_accuracy']:.4f}, {self.metric} accuracy "
                       f"{_accuracies(result['task_accuracy'])}")
        return result

    def _pruned_view(self, trainer: pl.Trainer, model: torch.nn.Module):
        """A context in which ``model`` is the run's pruned model: as it is when pruned in place, else masked."""
        state = RunState.of(trainer)
        if state.width_plan is not None:
            return contextlib.nullcontext() if state.width_masks_active else mask_width(model, state.width_plan)
        plan = state.expert_plan
        if plan is not None:
            counts = {l.index: l.num_experts for l in find_moe_layers(base_model_of(model))}
            if all(counts.get(l) == len(ids) for l, ids in plan.keep.items()):
                return contextlib.nullcontext()  # pruned (or merged) in place
            if state.merge_plan is not None:
                return merged_experts(model, state.merge_plan)
            return mask_experts(model, plan)
        return contextlib.nullcontext()

    def _write(self, trainer: pl.Trainer) -> None:
        if trainer.is_global_zero and self.results:
            dm = self._datamodule(trainer)
            merge_report({"evaluation": {"split": self.split, "metric": self.metric,
                                         "task_names": list(getattr(dm, "task_names", None) or ["default"]),
                                         **self.results}}, self.run_dir(trainer) / "report.json")
            state = RunState.of(trainer)
            if "after" in self.results and state.exported is not None:  # the card was written before "after"
                record_evaluation(state.exported, state.evaluation)
        self.written = True

    # ------------------------------------------------------------------ lifecycle
    def _before(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if "before" in self.when and "before" not in self.results:
            self.measure(trainer, pl_module.model, "before")

    def check(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "export":  # the model is built and no data loop follows: fail or measure now
            self._datamodule(trainer)
            if getattr(pl_module, "model", None) is not None:
                self._before(trainer, pl_module)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._before(trainer, pl_module)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not getattr(trainer, "calibrating", False) or "before" in self.results:
            return
        # wherever Evaluate is listed: its own batches are never counted as calibration data
        with RunState.of(trainer).paused_observation():
            self._before(trainer, pl_module)

    def run_test(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.written:
            return
        self.measure(trainer, pl_module.model, "test")
        self._write(trainer)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """The measurements so far: a fit resumed from a checkpoint keeps its ``before`` (of the original model)."""
        return {"results": self.results}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.results = dict(state_dict.get("results") or {})

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.written:
            return
        if "after" in self.when:
            model = pl_module.model
            with self._pruned_view(trainer, model):
                self.measure(trainer, model, "after")
        self._write(trainer)
