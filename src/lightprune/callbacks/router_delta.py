"""RouterDelta: score experts by router sensitivity under a brief adapter fit (a scorer: it never prunes).

Router sensitivity ("Router Sensitivity Under Lightweight Fine-Tuning Identifies Prunable Experts in Mixture-of-Experts
Models", arXiv 2608.07890, sections 3.2-3.4): the adapter fitted by ``lightprune fit`` is an instrument. At fit start
the callback records the row norms of the *original* router weights (and a float64 fingerprint of every base parameter);
at fit end it

1. scores every expert: ``weight`` / ``signed_weight`` from the adapter-merged router
   (Eqs. 4 / 3), or ``logit`` from the router logits of held-out batches (the datamodule's val
   dataloader) with the adapter on versus the base model with it removed (Eq. 5);
   ``auto`` picks ``weight`` when the router is trainable, else ``logit``;
2. discards the adapter (``remove_adapters``: weights not merged) and checks that what is left
   holds exactly the original weights; ``pl_module.model`` is that original model afterwards;
3. puts the scores (criterion ``router_delta:<score>``) in the run state, under ``router_delta``.

Selection and export are the other callbacks' (phase order: this one scores first):
``ExpertPruning(criterion="router_delta", ratio=...)`` (or ``n_per_layer``) makes the plan and writes
``scores.json`` and ``plan.json``, [`Export`][..export.Export] prunes the original and exports.

Across processes (DDP, DeepSpeed ZeRO-1/2/3) every rank scores: router weights are read with
the routers' ZeRO-3 partitions gathered (the routers only, never the experts), the fingerprint
one module at a time, logits by forwards that every rank runs on the same held-out batches. The
plan is checked to be equal on every rank. Under ZeRO-3 the base model is un-partitioned before
surgery (by Export).
"""

from __future__ import annotations

import re
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import nn

from lightprune.callbacks.job_end import JobEndCallback
from lightprune.callbacks.options import OPTIONS, uses_options
from lightprune.callbacks.state import RunState
from lightprune.core.distributed import gathered
from lightprune.experts.scores import ExpertScores
from lightprune.experts.sensitivity import logit_delta, router_logits, router_row_norms, weight_delta
from lightprune.finetune.adapters import merged_router_weights, remove_adapters, router_is_trainable
from lightprune.models import find_moe_layers
from lightprune.models.unwrap import base_model_of

__all__ = ["RouterDelta"]

_CHUNK = 1 << 24
_ORIGINAL = re.compile(r"\.parametrizations\.(\w+)\.original$")


def _clean(name: str) -> str:
    if name.startswith("base_model.model."):
        name = name[len("base_model.model."):]
    return _ORIGINAL.sub(r".\1", name.replace(".base_layer", ""))


@torch.no_grad()
def base_fingerprint(model: nn.Module) -> dict[str, tuple[float, float]]:
    """``{parameter name: (sum, sum of squares)}`` in float64 over the model's parameters.

    Wrapper prefixes (peft ``base_model.model.``, ``.base_layer``, a parametrized weight's
    ``original``) are stripped, so an adapted model and the model left after removing its adapters
    name their shared parameters alike; LoRA / IA3 factors are skipped (they have no counterpart).
    Large tensors are reduced in chunks; under ZeRO-3 one module's partitions are gathered at a time.
    """
    out: dict[str, tuple[float, float]] = {}
    base = base_model_of(model)
    for prefix, module in base.named_modules():
        own = [(f"{prefix}.{n}" if prefix else n, p) for n, p in module.named_parameters(recurse=False)
               if "lora_" not in f"{prefix}.{n}" and "ia3_" not in f"{prefix}.{n}"]
        if not own:
            continue
        with gathered(p for _, p in own):  # ZeRO-3: one module's partitions at a time
            for name, param in own:
                out[_clean(name)] = _sums(param)
    return out


def _sums(param: torch.Tensor) -> tuple[float, float]:
    """(sum, sum of squares) of ``param`` in float64, reduced in chunks."""
    flat = param.detach().reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=flat.device)
    squares = torch.zeros((), dtype=torch.float64, device=flat.device)
    for chunk in flat.split(_CHUNK):
        chunk = chunk.double()
        total += chunk.sum()
        squares += (chunk * chunk).sum()
    return float(total), float(squares)


@uses_options(OPTIONS["RouterDelta"])
class RouterDelta(JobEndCallback):
    """Score experts by how much their router moved under the run's adapter fit.

    Args:
        score: ``weight`` (Eq. 4), ``signed_weight`` (Eq. 3), ``logit`` (Eq. 5) or ``auto``
            (``weight`` when the router is trainable, else ``logit``).
        holdout_batches: batches of the datamodule's val dataloader for the logit delta.

    It never prunes: list ``ExpertPruning(criterion="router_delta", ...)`` and ``Export(...)`` beside it for that.
    """

    phase = "score"

    def __init__(self, score: str = "auto", holdout_batches: int = 1):
        super().__init__()
        self.score = self.OPTIONS.check("score", score)
        self.holdout_batches = self.OPTIONS.check("holdout_batches", holdout_batches)
        self.resolved: str | None = None
        self.before: dict[int, torch.Tensor] | None = None
        self.fingerprint: dict[str, tuple[float, float]] | None = None
        self.scores: ExpertScores | None = None

    @property
    def criterion(self) -> str:
        return f"router_delta:{self.resolved or self.score}"

    def _check_model(self, model: nn.Module) -> None:
        find_moe_layers(base_model_of(model))

    def _resolve(self, model: nn.Module) -> str:
        if self.score != "auto":
            return self.score
        return "weight" if router_is_trainable(model) else "logit"

    # ------------------------------------------------------------------ lifecycle
    def check(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if getattr(pl_module, "model", None) is not None:
            self._check_model(pl_module.model)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        model = pl_module.model
        self._check_model(model)
        if self.resolved is None:
            self.resolved = self._resolve(model)
        if self.resolved == "logit" and not callable(getattr(trainer.datamodule, "val_dataloader", None)):
            raise ValueError("RouterDelta(score='logit') needs held-out data: a datamodule with a val_dataloader")
        if self.before is None:  # restored by load_state_dict on a resumed run
            self.before = router_row_norms(model)
            self.fingerprint = base_fingerprint(model)

    # The job-end hooks of a calibrate/export job have no adapter fit to read.
    def on_export(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        raise ValueError("RouterDelta scores an adapter fit: run it with `lightprune fit`")

    def on_calibrate_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        raise ValueError("RouterDelta scores an adapter fit: run it with `lightprune fit`")

    def _holdout(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> list[dict[str, Any]]:
        from lightning.fabric.utilities.apply_func import move_data_to_device

        batches = []
        for batch in trainer.datamodule.val_dataloader():
            batches.append(move_data_to_device(batch, pl_module.device))
            if len(batches) == self.holdout_batches:
                break
        if not batches:
            raise ValueError("RouterDelta(score='logit'): the datamodule's val_dataloader gave no batch")
        return batches

    @staticmethod
    def _logits(model: nn.Module, batches: list[dict[str, Any]]) -> dict[int, torch.Tensor]:
        per_batch = [{k: v.cpu() for k, v in router_logits(model, b).items()} for b in batches]
        return {layer: torch.cat([b[layer] for b in per_batch]) for layer in per_batch[0]}

    def _check_original(self, base: nn.Module) -> None:
        norms = router_row_norms(base)
        moved = [l for l in self.before if not torch.equal(norms[l], self.before[l])]
        now = base_fingerprint(base)
        changed = sorted(n for n, v in now.items() if n in self.fingerprint and v != self.fingerprint[n])
        if moved or changed:
            raise RuntimeError(
                "RouterDelta prunes the original weights, but the model left after removing the adapter differs "
                f"from the one at fit start (routers of layers {moved}, parameters {changed[:5]}"
                f"{' ...' if len(changed) > 5 else ''}): base weights were trained. Train an adapter only "
                "(freeze the base model)")

    def run(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        state = RunState.of(trainer)
        if self.scores is not None:
            state.expert_scores.setdefault("router_delta", self.scores)
            return
        if self.before is None:
            raise RuntimeError("RouterDelta has no snapshot of the original router: on_fit_start did not run")
        start = time.perf_counter()
        model = pl_module.model
        limits = ExpertScores.limits_of(find_moe_layers(base_model_of(model)))
        if self.resolved in ("weight", "signed_weight"):
            routers = [p for l in find_moe_layers(base_model_of(model)) for p in l.router.parameters()]
            with gathered(routers):  # ZeRO-3: the routers (and their LoRA factors) only
                after = {l: w.detach().cpu() for l, w in merged_router_weights(model).items()}
            scores = weight_delta(self.before, after, signed=self.resolved == "signed_weight", limits=limits)
            base = remove_adapters(model)
        else:
            batches = self._holdout(trainer, pl_module)
            adapted = self._logits(model, batches)
            base = remove_adapters(model)
            scores = logit_delta(self._logits(base, batches), adapted, limits=limits)
        self._check_original(base)
        pl_module.model = base
        self.scores = state.expert_scores["router_delta"] = scores
        state.scoring_seconds += time.perf_counter() - start
        rank_zero_info(f"RouterDelta: scored {sum(len(v) for v in scores.values())} experts ({self.criterion})")
        if not state.has_phase("select"):
            rank_zero_warn("RouterDelta only scores: add ExpertPruning(criterion='router_delta', ratio=...) and "
                           "Export to prune and export (nothing is written)")

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "resolved": self.resolved,
            "before": None if self.before is None else {str(l): v.tolist() for l, v in self.before.items()},
            "fingerprint": self.fingerprint,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.resolved = state_dict.get("resolved")
        before = state_dict.get("before")
        self.before = None if before is None else {int(l): torch.tensor(v, dtype=torch.float64)
                                                   for l, v in before.items()}
        fingerprint = state_dict.get("fingerprint")
        self.fingerprint = None if fingerprint is None else {k: tuple(v) for k, v in fingerprint.items()}
