"""ExpertPruning: score experts, select a plan, write scores.json and plan.json.

Runs once, at the end of the job: ``on_export`` (``lightprune export``), ``on_calibrate_end``
(``lightprune calibrate``) or ``on_fit_end`` (``lightprune fit``), whichever comes first. The
plan it makes is what :class:`~lightprune.callbacks.Export` applies; scoring and surgery stay
apart (Torch-Pruning's habit). Run files go to ``output_dir`` (default: the trainer's
``default_root_dir``). Weight criteria need no data; criteria that need calibration
statistics are an error here until the calibration callback provides them.

Across processes (DDP, DeepSpeed ZeRO-1/2/3) every rank scores: weight criteria gather one
layer's ZeRO-3 partitions at a time, calibration criteria read statistics already summed across
ranks by :class:`ExpertStats`, so every rank computes the same plan; that is checked (one small
``all_gather_object``; a mismatch raises on every rank) and rank 0 writes the files.
"""

from __future__ import annotations

import inspect
import json
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from ..calibration import CRITERIA as CALIBRATION_CRITERIA
from ..calibration import SUBSETS
from ..distributed import same_on_every_rank
from ..criteria import Criterion, get_criterion, get_criterion_class
from ..scores import ExpertScores
from .expert_stats import ExpertStats
from ..models import find_moe_layers
from ..plan import ExpertPlan
from .job_end import JobEndCallback
from ..select import ALLOCATIONS, NORMALIZATIONS, select_experts

__all__ = ["ExpertPruning", "CALIBRATION"]

#: criteria read from calibration statistics (ExpertStats) rather than from weights
CALIBRATION = (*CALIBRATION_CRITERIA, "maep")


class ExpertPruning(JobEndCallback):
    """Score with ``criterion``, prune ``ratio`` of the routed experts by ``allocation``.

    Args:
        criterion: a registered criterion name (``aimer``, ``magnitude``, ``router_norm``,
            ``random``, or one registered by your project) or a ``Criterion`` instance
            (from a config: ``class_path`` + ``init_args``); or a calibration criterion
            (``frequency``, ``seer``, ``ean``, ``reap``, ``routing_kl``, ``delta_h``,
            ``delta_h_promoted``, ``maep``) read from the run's :class:`ExpertStats` callback.
        subset: the token subset of a calibration criterion (``all``, ``text``, ``vision``, ...).
        alpha: MAEP's mixing weight (None: its closed form).
        ratio: fraction of routed experts to prune, in [0, 1).
        allocation: ``uniform`` (same count per layer) or ``global`` (one ranking over layers).
        normalize: ``None`` or ``log_zscore`` (per-layer z-score of log values before a global ranking).
        seed: passed to criteria named by string whose constructor takes ``seed`` (``random``).
        output_dir: where scores.json and plan.json go (default: ``trainer.default_root_dir``).
    """

    def __init__(self, criterion: str | Criterion = "aimer", ratio: float = 0.5, allocation: str = "uniform",
                 normalize: str | None = None, seed: int = 0, output_dir: str | None = None, subset: str = "all",
                 alpha: float | None = None):
        super().__init__()
        if subset not in SUBSETS:
            raise ValueError(f"subset must be one of {SUBSETS}, got {subset!r}")
        self.subset, self.alpha = subset, alpha
        if not isinstance(ratio, (int, float)) or not 0.0 <= ratio < 1.0:
            raise ValueError(f"ratio must be in [0, 1), got {ratio!r}")
        if allocation not in ALLOCATIONS:
            raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {allocation!r}")
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
        self.calibration_criterion = criterion if isinstance(criterion, str) and criterion in CALIBRATION else None
        if self.calibration_criterion is not None:
            self.criterion = None
        elif isinstance(criterion, Criterion):
            self.criterion = criterion
        else:
            cls = get_criterion_class(criterion)
            takes_seed = "seed" in inspect.signature(cls).parameters
            self.criterion = get_criterion(cls, **({"seed": seed} if takes_seed else {}))
        self.ratio, self.allocation, self.normalize, self.seed = float(ratio), allocation, normalize, seed
        self.output_dir = output_dir
        self.plan: ExpertPlan | None = None
        self.scores: ExpertScores | None = None
        self.seconds: float | None = None

    @property
    def name(self) -> str:
        return self.calibration_criterion or self.criterion.name

    def _scores(self, trainer: pl.Trainer, model) -> ExpertScores:
        if self.calibration_criterion is None:
            return self.criterion.score(model)
        stats = next((cb.stats for cb in trainer.callbacks if isinstance(cb, ExpertStats) and cb.stats), None)
        if stats is None:
            raise ValueError(f"criterion {self.name!r} needs calibration statistics: add an ExpertStats callback "
                             "and run `lightprune calibrate` with calibration data")
        if self.calibration_criterion == "maep":
            from ..maep import maep_scores

            return maep_scores(stats, alpha=self.alpha)[0]
        return stats.score(self.calibration_criterion, self.subset)

    @property
    def state_key(self) -> str:
        """Unique per configuration, so one run may hold several ExpertPruning callbacks (one per criterion)."""
        return self._generate_state_key(criterion=self.name, subset=self.subset, ratio=self.ratio,
                                        allocation=self.allocation, output_dir=self.output_dir)

    def run_dir(self, trainer: pl.Trainer) -> Path:
        return Path(self.output_dir or trainer.default_root_dir)

    # ------------------------------------------------------------------ lifecycle
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "export" and (self.calibration_criterion or self.criterion.needs_data):
            raise ValueError(f"criterion {self.name!r} needs calibration data: run `lightprune calibrate` "
                             "with an ExpertStats callback, or pick a weight criterion for `lightprune export`")
        if getattr(pl_module, "model", None) is not None:
            self._check_model(pl_module.model)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_model(pl_module.model)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_model(pl_module.model)

    def _check_model(self, model) -> None:
        """Fail before any data is spent: not an MoE model, or a ratio that would cut below a floor."""
        if self.plan is not None:
            return
        layers = find_moe_layers(model)
        dry = {layer.index: torch.zeros(layer.num_experts) for layer in layers}
        select_experts(dry, self.ratio, self.allocation, limits={l.index: l.limits for l in layers})

    # ------------------------------------------------------------------ work
    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.plan is not None:
            return
        model = pl_module.model
        layers = find_moe_layers(model)
        start = time.perf_counter()
        scores = self._scores(trainer, model)
        self.plan = select_experts(scores, self.ratio, self.allocation, self.normalize,
                                   limits={l.index: l.limits for l in layers}, criterion=self.name)
        if hasattr(scores, "alpha_report"):
            self.plan.metadata["alpha"] = scores.alpha_report.to_dict()
        same_on_every_rank(self.plan.keep, f"ExpertPruning's plan ({self.name})")
        self.scores = scores
        self.seconds = time.perf_counter() - start
        if trainer.is_global_zero:
            out = self.run_dir(trainer)
            out.mkdir(parents=True, exist_ok=True)
            (out / "scores.json").write_text(json.dumps({self.name: scores.to_json()}, indent=1) + "\n")
            self.plan.save(out / "plan.json")
            rank_zero_info(f"ExpertPruning: {self.name} pruned {self.plan.total_pruned} experts "
                           f"({self.allocation}, ratio {self.ratio}); plan in {out / 'plan.json'}")

    def state_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict() if self.plan is not None else None, "seconds": self.seconds}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        plan = state_dict.get("plan")
        self.plan = ExpertPlan.from_dict(plan) if plan is not None else None
        self.seconds = state_dict.get("seconds")
