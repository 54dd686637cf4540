"""ExpertPruning: score experts, select a plan, write scores.json and plan.json.

Runs once, at the end of the job (phase ``select``: after the run's scores exist, before Export):
``on_export`` (``lightprune export``), ``on_calibrate_end`` (``lightprune calibrate``) or ``on_fit_end``
(``lightprune fit``). Every criterion comes from one registry (`lightprune.experts.criteria`) and is
asked the same way ([`score_in_run`][lightprune.experts.criteria.base.Criterion.score_in_run]): weight criteria read the
model, calibration criteria the run state's calibration statistics (ExpertStats), ``router_delta`` the
scores of the run's adapter fit (RouterDelta). The plan goes to the run state, where
[`Export`][..export.Export] applies it; scoring and surgery stay apart (Torch-Pruning's habit).
``scores.json`` and ``plan.json`` go to ``output_dir`` (default: the trainer's ``default_root_dir``) once the
export has succeeded (or at the end of a job without one): a failed export leaves the previous files.

With Export's ``plan_path`` the run applies that file's plan: ExpertPruning selects nothing (and says so), and the
run's plan.json is the file's plan (Export writes it). A run may list several ExpertPruning, each writing into its
own ``output_dir``; the run's plan (Export's, Evaluate's) is then the one written into Export's folder
([`lightprune.callbacks.roster`][..roster]).

Across processes (DDP, DeepSpeed ZeRO-1/2/3) every rank scores: weight criteria gather one
layer's ZeRO-3 partitions at a time, calibration criteria read statistics already summed across
ranks, so every rank computes the same plan; that is checked (one small ``all_gather_object``; a
mismatch raises on every rank) and rank 0 writes the files.
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightprune.callbacks.job_end import JobEndCallback
from lightprune.callbacks.options import OPTIONS, uses_options
from lightprune.callbacks.state import RunState, run_directory
from lightprune.core.distributed import same_on_every_rank
from lightprune.experts.criteria import (
    Criterion,
    MergeMethod,
    get_criterion,
    get_criterion_class,
)
from lightprune.experts.criteria.scoring import streamed_layer_weights
from lightprune.experts.merging import MergePlan
from lightprune.experts.plan import ExpertPlan
from lightprune.experts.scores import ExpertScores
from lightprune.experts.select import select_experts
from lightprune.models import find_moe_layers
from lightprune.models.unwrap import base_model_of

__all__ = ["ExpertPruning"]

#: constructor arguments ExpertPruning passes on to a criterion named by string, when it takes them
_CRITERION_ARGS = ("seed", "subset", "alpha")


@uses_options(OPTIONS["ExpertPruning"])
class ExpertPruning(JobEndCallback):
    """Score with ``criterion``, prune ``ratio`` of the routed experts by ``allocation``.

    Args:
        criterion: a registered criterion name or a ``Criterion`` instance (from a config: ``class_path``
            + ``init_args``). Weight criteria: ``aimer``, ``magnitude``, ``router_norm``, ``random`` or one
            registered by your project; calibration criteria (``frequency``, ``seer``, ``ean``, ``reap``,
            ``routing_kl``, ``delta_h``, ``delta_h_promoted``, ``maep``) read the run's ExpertStats;
            ``router_delta`` reads the run's RouterDelta fit. The merging methods ``hc_smoe`` and ``m_smoe``
            merge ``ratio`` of the experts away instead (a MergePlan, written as merge_plan.json; their
            statistics: ExpertStats' ``criteria`` with ``expert_outputs`` / ``router_logits``).
        subset: the token subset of a calibration criterion (``all``, ``text``, ``vision``, ...).
        alpha: MAEP's mixing weight (None: its closed form).
        ratio: fraction of routed experts to prune, in [0, 1) (``null`` with ``n_per_layer``).
        n_per_layer: prune exactly this many experts from every layer instead (router sensitivity ("Router
            Sensitivity Under Lightweight Fine-Tuning Identifies Prunable Experts in Mixture-of-Experts Models",
            arXiv 2608.07890), section 3.4).
        allocation: ``uniform`` (same count per layer) or ``global`` (one ranking over layers).
        normalize: ``None`` or ``log_zscore`` (per-layer z-score of log values before a global ranking).
        seed: passed to criteria named by string whose constructor takes ``seed`` (``random``).
        output_dir: where scores.json and plan.json go (default: ``trainer.default_root_dir``).
    """

    phase = "select"

    def __init__(self, criterion: str | Criterion = "aimer", ratio: float | None = 0.5, allocation: str = "uniform",
                 normalize: str | None = None, seed: int = 0, output_dir: str | None = None, subset: str = "all",
                 alpha: float | None = None, n_per_layer: int | None = None):
        super().__init__()
        options = self.OPTIONS
        self.subset, self.alpha = options.check("subset", subset), options.check("alpha", alpha)
        self.allocation = options.check("allocation", allocation)
        self.normalize = options.check("normalize", normalize)
        if (ratio is None) == (n_per_layer is None):
            raise ValueError("give exactly one of ratio (a fraction) or n_per_layer (a count per layer); "
                             f"got ratio={ratio!r}, n_per_layer={n_per_layer!r} (set ratio: null to use n_per_layer)")
        self.ratio = options.check("ratio", ratio)
        self.n_per_layer = options.check("n_per_layer", n_per_layer)
        if self.n_per_layer is not None and allocation != "uniform":
            raise ValueError(f"n_per_layer prunes the same count from every layer: allocation must be 'uniform', "
                             f"got {allocation!r}")
        if isinstance(criterion, Criterion):
            self.criterion = criterion
        else:
            cls = get_criterion_class(options.check("criterion", criterion))
            takes = inspect.signature(cls).parameters
            given = {"seed": seed, "subset": subset, "alpha": self.alpha}
            self.criterion = get_criterion(cls, **{k: given[k] for k in _CRITERION_ARGS if k in takes})
        self.seed = seed
        self.output_dir = output_dir
        if isinstance(self.criterion, MergeMethod) and self.ratio is None:
            raise ValueError(f"merging method {self.name!r} takes a ratio (the share of experts merged away), "
                             "not n_per_layer")
        self.plan: ExpertPlan | None = None
        self.merge_plan: MergePlan | None = None
        self.scores: ExpertScores | None = None
        self.seconds: float | None = None

    @property
    def name(self) -> str:
        """The criterion's registry name."""
        return self.criterion.name or type(self.criterion).__name__

    @property
    def state_key(self) -> str:
        """Unique per configuration, so one run may hold several ExpertPruning callbacks (one per criterion)."""
        return self._generate_state_key(criterion=self.name, subset=self.subset, ratio=self.ratio,
                                        allocation=self.allocation, output_dir=self.output_dir)

    def run_dir(self, trainer: pl.Trainer) -> Path:
        return run_directory(trainer, self.output_dir)

    def _select(self, scores, limits, criterion: str | None = None) -> ExpertPlan:
        return select_experts(scores, self.ratio, self.allocation, self.normalize, limits=limits,
                              criterion=criterion, n_per_layer=self.n_per_layer)

    # ------------------------------------------------------------------ lifecycle
    def check(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if RunState.of(trainer).plan_file is not None:  # Export applies its plan_path: nothing is selected here
            return
        if stage == "export" and self.criterion.needs_data:
            raise ValueError(f"criterion {self.name!r} needs calibration data: run `lightprune calibrate` "
                             "with an ExpertStats callback, or pick a weight criterion for `lightprune export`")
        if getattr(pl_module, "model", None) is not None:
            self._check_model(pl_module.model)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_model(pl_module.model)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_model(pl_module.model)

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        """A merging method whose statistic the run's calibration does not collect fails at the first batch, not
        after the whole pass (the observer is in the run state by then, wherever the callbacks are listed)."""
        state = RunState.of(trainer)
        observer = state.observer
        if batch_idx or self.plan is not None or not isinstance(self.criterion, MergeMethod) or observer is None \
                or state.plan_file is not None:
            return
        if self.criterion.statistic not in observer.merging:
            raise ValueError(f"merging method {self.name!r} needs the calibration statistic "
                             f"{self.criterion.statistic!r}, which this run does not collect: add it to ExpertStats' "
                             f"criteria (e.g. criteria: [frequency, {self.criterion.statistic}])")

    def _check_model(self, model) -> None:
        """Fail before any data is spent: not an MoE model, or a ratio that would cut below a floor."""
        if self.plan is not None:
            return
        layers = find_moe_layers(base_model_of(model))
        dry = {layer.index: torch.zeros(layer.num_experts) for layer in layers}
        self._select(dry, {l.index: l.limits for l in layers})

    # ------------------------------------------------------------------ work
    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        state = RunState.of(trainer)
        if state.plan_file is not None:
            rank_zero_info(f"ExpertPruning: {self.name} selects nothing: Export applies the plan in {state.plan_file} "
                           "(its plan_path), written to the run's folder once the export has succeeded")
            return
        gives_plan = state.gives_run_plan(self.run_dir(trainer))
        if self.plan is not None:  # done, or restored from a checkpoint
            if gives_plan:
                state.expert_plan = state.expert_plan or self.plan
                state.merge_plan = state.merge_plan or self.merge_plan
            return
        if isinstance(self.criterion, MergeMethod):
            self._merge(trainer, state, gives_plan)
            return
        start = time.perf_counter()
        skeleton = getattr(pl_module, "skeleton", None)
        if skeleton is not None and not self.criterion.needs_data:  # one MoE block read in at a time
            weights = streamed_layer_weights(skeleton, self.criterion)
            scores = self.criterion.score(pl_module.model, layer_weights=weights)
        else:
            scores = self.criterion.score_in_run(pl_module.model, state.calibration, state.expert_scores)
        label = getattr(scores, "criterion", None) or self.name
        layers = find_moe_layers(base_model_of(pl_module.model))
        self.plan = self._select(scores, {l.index: l.limits for l in layers}, criterion=label)
        if hasattr(scores, "alpha_report"):
            self.plan.metadata["alpha"] = scores.alpha_report.to_dict()
        same_on_every_rank(self.plan.keep, f"ExpertPruning's plan ({label})")
        self.scores = scores
        self.seconds = time.perf_counter() - start
        state.expert_scores.setdefault(self.name, scores)
        if gives_plan:
            state.expert_plan = self.plan
            state.scoring_seconds += self.seconds
        if trainer.is_global_zero:  # written with the export, once it has succeeded (RunState.stage_file)
            out = self.run_dir(trainer)
            state.stage_file(out / "scores.json", {label: scores.to_json()}, indent=1)
            state.stage_file(out / "plan.json", self.plan.to_dict(), indent=ExpertPlan.INDENT)
            how = f"{self.n_per_layer} per layer" if self.n_per_layer is not None else \
                f"{self.allocation}, ratio {self.ratio}"
            rank_zero_info(f"ExpertPruning: {label} selects {self.plan.total_pruned} experts to prune ({how}); "
                           f"{_when_written(state, out / 'plan.json')}")

    def _merge(self, trainer: pl.Trainer, state: RunState, gives_plan: bool = True) -> None:
        """A merging method: its MergePlan (and the kept layout as the run's ExpertPlan) from the calibration."""
        start = time.perf_counter()
        self.merge_plan = self.criterion.merge_plan(state.calibration, self.ratio, self.allocation)
        self.plan = self.merge_plan.expert_plan()
        same_on_every_rank(self.merge_plan.clusters, f"ExpertPruning's merge plan ({self.name})")
        self.seconds = time.perf_counter() - start
        if gives_plan:
            state.expert_plan, state.merge_plan = self.plan, self.merge_plan
            state.scoring_seconds += self.seconds
        if trainer.is_global_zero:
            out = self.run_dir(trainer)
            state.stage_file(out / "merge_plan.json", self.merge_plan.to_dict(), indent=MergePlan.INDENT)
            rank_zero_info(f"ExpertPruning: {self.name} selects {self.merge_plan.total_merged_away} experts to merge "
                           f"away (ratio {self.ratio}); {_when_written(state, out / 'merge_plan.json')}")

    def state_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict() if self.plan is not None else None, "seconds": self.seconds,
                "merge_plan": self.merge_plan.to_dict() if self.merge_plan is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        plan = state_dict.get("plan")
        self.plan = ExpertPlan.from_dict(plan) if plan is not None else None
        merge = state_dict.get("merge_plan")
        self.merge_plan = MergePlan.from_dict(merge) if merge is not None else None
        self.seconds = state_dict.get("seconds")


def _when_written(state: RunState, path: Path) -> str:
    """When a staged plan file is written: with the export, or at the end of the job (never by a run that fails
    before)."""
    when = "once the export has succeeded" if state.has_phase("export") else "at the end of the job"
    return f"{path.name} is written to {path.parent} {when}"
