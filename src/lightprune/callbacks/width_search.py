"""WidthSearch: MWOP's staged search with recovery epochs as a Lightning callback (MWOP ("MWOP: Modality-aware
Width-wise Operation Pruning for Efficient MLLMs"), Alg. 1).

The fit loop's epochs are the recovery epochs of the candidates, one candidate after another; the
callback owns the schedule, in the manner of Lightning's ``BaseFinetuning``:

- ``on_fit_start``: snapshot M0's trainable weights (the fresh adapter and the projector), evaluate M0 on
  the full evaluation set (the retention reference), count the FLOPs profile, compute attention importance
  (``criterion``; Taylor by default) on M0, run the first stage's training-free sweep and choose the first candidate.
- ``on_train_epoch_start``: for a new candidate, reset the trainable weights to M0, clear the optimizer
  state and restart the learning-rate schedule over the candidate's steps; (re)apply its cumulative masks.
- ``on_train_epoch_end``: after ``recovery_epochs`` epochs, score the candidate on the full evaluation set
  (ATR against M0), keep its trainable weights, then decide the next one (`StagedSearch`), running
  each new stage's training-free sweep on the selection set on Mask(M0, Omega_rho); FFN importance is
  computed once, when the FFN_V stage begins, on M0 with the attention masks chosen so far. When every
  stage is done: the final revisit, the chosen candidate's weights and masks are put in place (the model stays
  masked with the chosen plan after the fit), ``width_plan.json`` and ``search.json`` are written and training stops.

Everything a restart needs (search state, M0 snapshot, scores, reference, the current candidate) is in
``state_dict``, so a fit resumed from a Lightning checkpoint (``ckpt_path``) carries on at the next
candidate, or inside a candidate's recovery with its masks re-applied.

Importance comes from ``criterion``, a width scorer (`lightprune.width.scorers`; default ``taylor``, the
paper's first-order Taylor importance), computed for the attention paths on M0 and for the FFN channels under the
chosen attention masks, as Algorithm 1 does with Taylor importance.

Data (from the datamodule): ``calibration_dataloader`` (the scorer's calibration set; ``train_dataloader`` when
absent; a scorer that reads one set per task category, ``min_rank``, gets ``dataloader("calibration",
tasks=[name])`` for every name of ``task_names``: [`category_batches`][lightprune.width.category_batches]; a
calibration-free scorer reads none), ``selection_dataloader`` (training-free sweeps; ``val_dataloader`` when
absent: said in the log), ``val_dataloader`` (full evaluation), ``task_names`` (task families; one "default" family
when absent).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info

import lightprune.callbacks.recovery_weights as recovery
from lightprune.callbacks.options import OPTIONS, uses_options
from lightprune.callbacks.state import RunState, run_directory
from lightprune.core.checks import integer
from lightprune.core.jsonio import write_json
from lightprune.core.paths import check_state_file
from lightprune.data.tokenizer import end_of_turn_ids
from lightprune.models.unwrap import base_model_of
from lightprune.width.flops import decoder_flops
from lightprune.width.layers import find_width_layers
from lightprune.width.modality import token_profile
from lightprune.width.paths import PATHS
from lightprune.width.plan import WIDTH_UNITS, WidthPlan
from lightprune.width.retention import evaluate_tasks, retention
from lightprune.width.scorer import BATCHES, PER_TASK, WidthScorer, category_batches
from lightprune.width.scorers import get_width_scorer
from lightprune.width.search import DEFAULT_GRID, Candidate, StagedSearch
from lightprune.width.select import select_channels, select_paths
from lightprune.width.taylor import WidthScores

__all__ = ["WidthSearch"]


@uses_options(OPTIONS["WidthSearch"])
class WidthSearch(pl.Callback):
    """MWOP's Algorithm 1 over ``lightprune fit`` (see the module docstring).

    Args:
        grid: masking ratios of the training-free sweep (the paper: 0, 0.1, ..., 1.0).
        stages: the units to search, in order (default V2V, T2V, T2T, FFN_V, FFN_T; an MoE model's FFNs are
            experts, so it takes the three attention paths only).
        min_retention: training-free ATR (percent) a ratio needs to become a candidate.
        max_candidates: how many passing ratios (the largest) are recovered first in a stage.
        expand_above: a recovered ATR at or above this queues the next larger ratio.
        recovery_epochs: epochs of recovery per candidate (the paper: 1).
        metric: per-task score, ``token`` (answer-token accuracy) or ``exact`` (whole-answer match).
        last_layer_first: spend the visual FFN budget on the last layer first (MWOP section 5).
        flops_profile: (vision tokens, text tokens) for the FLOPs of the final revisit; default: the mean
            counts of the evaluation set (system tokens excluded, MWOP appendix D.4).
        align: FFN channel alignment b of the FLOPs count.
        output_dir: where width_plan.json, search.json and candidates/ go (default: the trainer's root dir).
        progress: show a progress bar across stages and over evaluation batches.
        criterion: the width scorer of the attention paths and FFN channels: a registered name
            ([`available_width_scorers`][lightprune.width.available_width_scorers]: ``taylor``, ``min_rank``,
            ``random``, ...),
            a dotted import path, a [`WidthScorer`][lightprune.width.WidthScorer] subclass or instance.
    """

    def __init__(self, grid: Sequence[float] = DEFAULT_GRID, stages: Sequence[str] = WIDTH_UNITS,
                 min_retention: float = 90.0, max_candidates: int = 2, expand_above: float = 100.0,
                 recovery_epochs: int = 1, metric: str = "token", last_layer_first: bool = False,
                 flops_profile: Sequence[int] | None = None, align: int = 64, output_dir: str | None = None,
                 progress: bool = True, criterion: str | WidthScorer = "taylor"):
        super().__init__()
        self.criterion = get_width_scorer(criterion)
        options = self.OPTIONS
        options.check("metric", metric)
        recovery_epochs = options.check("recovery_epochs", recovery_epochs)
        tokens = None if flops_profile is None else [integer(v) for v in flops_profile]
        if tokens is not None and (len(tokens) != 2 or any(v is None or v < 0 for v in tokens)):
            raise ValueError(f"flops_profile must be (vision tokens, text tokens) >= 0, got {flops_profile!r}")
        self.search = StagedSearch(grid=grid, stages=stages, min_retention=min_retention,
                                   max_candidates=max_candidates, expand_above=expand_above)
        self.recovery_epochs = int(recovery_epochs)
        self.metric = metric
        self.last_layer_first = last_layer_first
        self.flops_profile = tokens
        self.align = options.check("align", align)
        self.output_dir = output_dir
        self.progress = progress
        self.plan: WidthPlan | None = None  # the final plan, once the search is done
        self._m0: dict[str, torch.Tensor] | None = None
        self._reference: list[float] | None = None
        self._attn_scores: dict[int, torch.Tensor] | None = None
        self._ffn_scores: dict[int, dict[str, torch.Tensor]] | None = None
        self._current: float | None = None  # ratio of the candidate being recovered
        self._epochs_done = 0
        self._state: RunState | None = None  # the run state: it owns the width masks on the model
        self._bar = None

    # ------------------------------------------------------------------ helpers
    def run_dir(self, trainer: pl.Trainer) -> Path:
        return run_directory(trainer, self.output_dir)

    @staticmethod
    def _loader(datamodule, name: str, fallback: str):
        fn = getattr(datamodule, name, None)
        if callable(fn):
            return fn()
        rank_zero_info(f"WidthSearch: the datamodule has no {name}; using its {fallback}")
        return getattr(datamodule, fallback)()

    def _task_names(self, trainer: pl.Trainer) -> list[str]:
        return list(getattr(trainer.datamodule, "task_names", None) or ["default"])

    def _evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loader, desc: str):
        names = self._task_names(trainer)
        scores = evaluate_tasks(pl_module.model, loader, len(names), self.metric, progress=self.progress, desc=desc,
                                end_ids=end_of_turn_ids(trainer.datamodule))
        return scores, names

    def _retention(self, trainer, pl_module, loader, desc: str):
        scores, names = self._evaluate(trainer, pl_module, loader, desc)
        return retention(scores, torch.tensor(self._reference, dtype=torch.float64), names)

    def _base_plan(self, pl_module) -> WidthPlan:
        anchor = self.search.anchor_plan()
        return WidthPlan.from_dict(anchor) if anchor is not None else WidthPlan.dense(pl_module.model)

    def _plan_for(self, pl_module, stage: str, ratio: float) -> WidthPlan:
        base = self._base_plan(pl_module)
        if stage in PATHS:
            return select_paths(self._attn_scores, {stage: ratio}, base)
        modality = stage.removeprefix("ffn_")
        return select_channels(self._ffn_scores, {modality: ratio}, base, last_layer_first=self.last_layer_first)

    def release_masks(self) -> None:
        """Remove the masks the search applied (after the search: the chosen plan's); e.g. before an export."""
        self._unmask()

    def _unmask(self) -> None:
        if self._state is not None:
            self._state.release_width_masks()

    def _mask(self, pl_module, plan: WidthPlan) -> None:
        self._state.apply_width_masks(pl_module.model, plan)

    def _flops(self, pl_module, plan: WidthPlan) -> float:
        return decoder_flops(base_model_of(pl_module.model).config, *self.flops_profile, plan=plan, align=self.align).total

    # ------------------------------------------------------------------ lifecycle
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._state = RunState.of(trainer)
        self._state.check_callbacks(trainer)  # a second WidthSearch, ...: refused before any work
        if stage != "fit":
            return
        if trainer.datamodule is None:
            raise ValueError("WidthSearch needs a datamodule with train, val (full evaluation) and ideally "
                             "selection and calibration dataloaders")
        if self.criterion.calibration == PER_TASK and not callable(getattr(trainer.datamodule, "dataloader", None)):
            raise ValueError(f"WidthSearch: width scorer {self.criterion.label!r} reads one calibration set per task "
                             f"category, but {type(trainer.datamodule).__name__} has no dataloader(split, "
                             f"tasks=[name]) to serve them")
        self._check_weights_paths(trainer)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._state = RunState.of(trainer)
        layers = find_width_layers(pl_module.model)
        ffn_stages = [s for s in self.search.stages if s.startswith("ffn_")]
        if ffn_stages and all(layer.intermediate_size is None for layer in layers):
            raise ValueError(f"stages {ffn_stages} do not apply: every FFN of {type(pl_module.base_model).__name__} "
                             f"is a mixture of experts; set stages to {list(PATHS)}")
        if not recovery.trainable(pl_module.model):
            raise ValueError("WidthSearch recovers candidates by training, but the model has no trainable "
                             "parameter: give the module an adapter (e.g. LoRA on language_model)")
        if trainer.lr_scheduler_configs and not hasattr(pl_module.hparams, "scheduler"):
            raise ValueError(f"WidthSearch restarts the learning-rate schedule per candidate and knows "
                             f"MoECausalLM's schedule only; {type(pl_module).__name__} configures another")
        # an upper bound: Lightning stops when the search says so
        trainer.fit_loop.max_epochs = len(self.search.stages) * (len(self.search.grid) + 1) * self.recovery_epochs
        if self.progress and trainer.is_global_zero:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=len(self.search.stages), desc="width search", unit="stage",
                             initial=self.search.stage_index)
        if self._m0 is not None:  # resumed: the state came from a checkpoint
            rank_zero_info(f"WidthSearch: resuming at {self.search.stage}@{self._current} "
                           f"({len(self.search.history)} candidates recovered before)")
            return
        self._m0 = {n: p.detach().cpu().clone() for n, p in recovery.trainable(pl_module.model).items()}
        scores, names = self._evaluate(trainer, pl_module, trainer.datamodule.val_dataloader(), "reference")
        self._reference = scores.tolist()
        rank_zero_info(f"WidthSearch: reference scores {dict(zip(names, self._reference))}")
        if self.flops_profile is None:
            self.flops_profile = self._profile(pl_module, trainer.datamodule.val_dataloader())
        self._attn_scores = self._score(trainer, pl_module, attention=True, plan=None).attn
        self._advance(trainer, pl_module)

    def _profile(self, pl_module, loader) -> list[int]:
        profile = token_profile(pl_module.model, loader)
        return [profile["vision_tokens"], profile["text_tokens"]]

    def _calibration(self, trainer: pl.Trainer):
        """What the scorer reads: one calibration loader, one per task category, or nothing."""
        if self.criterion.calibration == BATCHES:
            return self._loader(trainer.datamodule, "calibration_dataloader", "train_dataloader")
        if self.criterion.calibration == PER_TASK:
            batches = category_batches(trainer.datamodule, "calibration")
            left_out = [t for t in self._task_names(trainer) if t not in batches]
            if left_out:
                rank_zero_info(f"WidthSearch: tasks {left_out} have no calibration rows; {self.criterion.label!r} "
                               f"ranks by the others {list(batches)}")
            return batches
        return None

    def _score(self, trainer, pl_module, attention: bool, plan: WidthPlan | None) -> WidthScores:
        """Attention (``attention``) or FFN importance of M0's weights, under ``plan``'s masks while observing."""
        batches = self._calibration(trainer)
        recovery.load_trainable(pl_module.model, self._m0)
        self._unmask()
        return self.criterion.score(pl_module.model, batches, attention=attention, ffn=not attention, plan=plan,
                                    progress=self.progress)

    def _advance(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Decide the next candidate, running sweeps (and FFN importance) as stages begin; finish at the end."""
        search = self.search
        while not search.done:
            if not search.swept:
                self._sweep(trainer, pl_module)
            ratio = search.next_ratio()
            if ratio is not None:
                self._current, self._epochs_done = ratio, 0
                return
            anchor = search.finish_stage()
            rank_zero_info(f"WidthSearch: stage {anchor.stage} anchored at ratio {anchor.ratio:g} "
                           f"(ATR {anchor.atr:.2f})")
            if self._bar is not None:
                self._bar.update(1)
        self._finish(trainer, pl_module)

    def _sweep(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        stage = self.search.stage
        if stage.startswith("ffn_") and self._ffn_scores is None:
            self._ffn_scores = self._score(trainer, pl_module, attention=False, plan=self._base_plan(pl_module)).ffn
        recovery.load_trainable(pl_module.model, self._m0)
        loader = self._loader(trainer.datamodule, "selection_dataloader", "val_dataloader")
        results = {}
        for ratio in self.search.grid:
            self._mask(pl_module, self._plan_for(pl_module, stage, ratio))
            results[ratio] = self._retention(trainer, pl_module, loader, f"sweep {stage}@{ratio:g}").atr
        self._unmask()
        queued = self.search.start_stage(results)
        rank_zero_info(f"WidthSearch: {stage} training-free ATR {results}; candidates {queued}")

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.search.done:
            return
        if self._epochs_done == 0:
            recovery.load_trainable(pl_module.model, self._m0)
            recovery.restart_optimization(trainer, pl_module, self.recovery_epochs)
        self._mask(pl_module, self._plan_for(pl_module, self.search.stage, self._current))
        if self._bar is not None:
            self._bar.set_postfix_str(f"recovering {self.search.stage}@{self._current:g}")

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.search.done:
            return
        self._epochs_done += 1
        if self._epochs_done < self.recovery_epochs:
            return
        stage, ratio = self.search.stage, self._current
        plan = self._plan_for(pl_module, stage, ratio)
        result = self._retention(trainer, pl_module, trainer.datamodule.val_dataloader(), f"evaluate {stage}@{ratio:g}")
        candidate = Candidate(stage, ratio, plan.to_dict(), result.atr, result.per_task, self._flops(pl_module, plan))
        candidate.weights = recovery.save_trainable(trainer, pl_module.model, self._weights_path(trainer, candidate))
        self.search.record(candidate)
        rank_zero_info(f"WidthSearch: {candidate.label()} recovered: ATR {result.atr:.2f}, per task {result.per_task}")
        self._unmask()
        self._advance(trainer, pl_module)

    def _weights_path(self, trainer, candidate: Candidate) -> Path:
        """Where a candidate's recovered trainable weights go (read back when it is chosen)."""
        return recovery.candidate_weights_path(self.run_dir(trainer), candidate)

    def _check_weights_paths(self, trainer) -> None:
        """Refuse, before any work, a candidate weights path of the search (every stage at every ratio of the grid)
        that is not a regular file, or a folder that cannot be written (`check_state_file`)."""
        for stage in self.search.stages:
            for ratio in self.search.grid:
                check_state_file(self._weights_path(trainer, Candidate(stage, ratio, {}, 0.0, {}, 0.0)),
                                 "WidthSearch candidate weights", "move it away (or delete it), or give WidthSearch "
                                 "another output_dir")

    def _finish(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        best = self.search.final()
        recovery.load_trainable(pl_module.model, torch.load(best.weights, map_location="cpu", weights_only=True))
        self.plan = self._state.width_plan = WidthPlan.from_dict(best.plan)
        self.plan.metadata.update({"method": "mwop", "criterion": repr(self.criterion), "atr": best.atr,
                                   "flops": best.flops,
                                   "flops_fraction": best.flops / self._flops(pl_module, WidthPlan.dense(pl_module.model)),
                                   "flops_profile": self.flops_profile, "chosen": best.label()})
        self._mask(pl_module, self.plan)
        self._current = None
        if trainer.is_global_zero:
            out = self.run_dir(trainer)
            out.mkdir(parents=True, exist_ok=True)
            self.plan.save(out / "width_plan.json")
            write_json({"chosen": best.label(), "criterion": repr(self.criterion), "reference": self._reference,
                        "task_names": self._task_names(trainer), "flops_profile": self.flops_profile,
                        "search": self.search.to_dict()}, out / "search.json", indent=2)
        rank_zero_info(f"WidthSearch: chose {best.label()} (ATR {best.atr:.2f}, "
                       f"{self.plan.metadata['flops_fraction']:.3f} of the dense FLOPs)")
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        trainer.should_stop = True

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        return {"search": self.search.to_dict(), "m0": self._m0, "reference": self._reference,
                "attn_scores": self._attn_scores, "ffn_scores": self._ffn_scores, "current": self._current,
                "epochs_done": self._epochs_done, "flops_profile": self.flops_profile,
                "criterion": repr(self.criterion), "plan": None if self.plan is None else self.plan.to_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # a state from before the criterion argument was scored by Taylor importance
        scored_by = state.get("criterion", "TaylorScorer()")
        if scored_by != repr(self.criterion):
            raise ValueError(f"WidthSearch: the checkpoint's search scored with {scored_by}, this WidthSearch with "
                             f"{self.criterion!r}; resume with the same criterion (scores of both would mix)")
        self.search = StagedSearch.from_dict(state["search"])
        self._m0, self._reference = state["m0"], state["reference"]
        self._attn_scores, self._ffn_scores = state["attn_scores"], state["ffn_scores"]
        self._current, self._epochs_done = state["current"], state["epochs_done"]
        self.flops_profile = state["flops_profile"]
        if self.search.done:  # a finished search resumed (its fit ends at once): its plan is the run's again
            self.plan = WidthPlan.from_dict(state["plan"]) if state.get("plan") is not None else self._chosen()
            if self._state is not None:
                self._state.width_plan = self.plan

    def _chosen(self) -> WidthPlan:
        """The plan of a finished search's choice, for a checkpoint saved before the plan was part of the state
        (its metadata without the FLOPs fraction, which needs the model)."""
        best = self.search.final()
        plan = WidthPlan.from_dict(best.plan)
        plan.metadata.update({"method": "mwop", "criterion": repr(self.criterion), "atr": best.atr,
                              "flops": best.flops, "flops_profile": self.flops_profile, "chosen": best.label()})
        return plan
