"""RouterDelta: rank experts by router sensitivity under a brief adapter fit, prune the original, export.

Paper 003 (sections 3.2-3.4; METHODS.md "Router sensitivity"): the adapter fitted by
``lightprune fit`` is an instrument. At fit start the callback records the row norms of the
*original* router weights (and a float64 fingerprint of every base parameter); at fit end it

1. scores every expert: ``weight`` / ``signed_weight`` from the adapter-merged router
   (Eqs. 4 / 3), or ``logit`` from the router logits of held-out batches (the datamodule's val
   dataloader) with the adapter on versus the base model with it removed (Eq. 5);
   ``auto`` picks ``weight`` when the router is trainable, else ``logit``;
2. discards the adapter (``remove_adapters``: weights not merged) and checks that what is left
   holds exactly the original weights;
3. prunes the same count ``n`` from every layer (``n_per_layer``, or ``floor(ratio x E)``),
   smallest scores first, the per-layer floor enforced by :func:`select_experts`;
4. writes ``scores.json`` (raw and importance per layer) and ``plan.json`` (criterion
   ``router_delta:<score>``), exports the pruned original through :func:`export_pruned` to
   ``<output_dir>/model`` and writes ``report.json`` and ``kept_experts.png``.

Rank 0 writes; every rank leaves with the same pruned model. After the callback,
``pl_module.model`` is the pruned base model without adapters.

Across processes (DDP, DeepSpeed ZeRO-1/2/3) every rank scores: router weights are read with
the routers' ZeRO-3 partitions gathered (the routers only, never the experts), the fingerprint
one module at a time, logits by forwards that every rank runs on the same held-out batches. The
plan is checked to be equal on every rank. Under ZeRO-3 the base model is un-partitioned before
surgery (:func:`lightprune.distributed.materialize`: full values on rank 0, ``meta`` elsewhere).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch import nn

from ..models import find_moe_layers
from ..plan import ExpertPlan
from ..scores import ExpertScores
from ..select import select_experts
from ..sensitivity import (SCORES, logit_delta, router_logits, router_row_norms, unwrap_model, weight_delta)
from ..distributed import gathered, materialize, same_on_every_rank
from .job_end import JobEndCallback

__all__ = ["RouterDelta", "base_fingerprint"]

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
    from ..distributed import gathered

    out: dict[str, tuple[float, float]] = {}
    base = unwrap_model(model)
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


def _adapters():
    """The adapters module's functions, or peft-only stand-ins while it is absent."""
    try:
        from ..modules.adapters import merged_router_weights, remove_adapters, router_is_trainable
        return merged_router_weights, remove_adapters, router_is_trainable
    except ImportError:  # pragma: no cover - the adapters module ships with lightprune.modules
        from ..sensitivity import effective_router_weights

        def remove(model):
            return model.unload() if hasattr(model, "unload") else model

        def trainable(model):
            return any(p.requires_grad for l in find_moe_layers(unwrap_model(model)) for p in l.router.parameters())

        return effective_router_weights, remove, trainable


class RouterDelta(JobEndCallback):
    """Prune the experts whose router moved least under the run's adapter fit.

    Args:
        score: ``weight`` (Eq. 4), ``signed_weight`` (Eq. 3), ``logit`` (Eq. 5) or ``auto``
            (``weight`` when the router is trainable, else ``logit``).
        ratio: fraction of each layer's experts to prune, in [0, 1) (``floor(ratio x E)``).
        n_per_layer: prune exactly this many experts from every layer instead (give ``ratio: null``).
        holdout_batches: batches of the datamodule's val dataloader for the logit delta.
        output_dir: run directory (default: ``trainer.default_root_dir``).
        export: export the pruned original to ``<output_dir>/model`` and write report.json and
            kept_experts.png; when False the plan is written and the model left unpruned.
        overwrite: replace an existing checkpoint directory.
        atol: export verification tolerance (see :class:`~lightprune.callbacks.Export`).
        summary: print the summary table.
    """

    def __init__(self, score: str = "auto", ratio: float | None = 0.5, n_per_layer: int | None = None,
                 holdout_batches: int = 1, output_dir: str | None = None, export: bool = True,
                 overwrite: bool = False, atol: float | None = None, summary: bool = True):
        super().__init__()
        if score not in (*SCORES, "auto"):
            raise ValueError(f"score must be one of {[*SCORES, 'auto']}, got {score!r}")
        if (ratio is None) == (n_per_layer is None):
            raise ValueError("give exactly one of ratio (a fraction per layer) or n_per_layer (a count per layer); "
                             f"got ratio={ratio!r}, n_per_layer={n_per_layer!r} (set ratio: null to use n_per_layer)")
        if ratio is not None and (not isinstance(ratio, (int, float)) or not 0.0 <= ratio < 1.0):
            raise ValueError(f"ratio must be in [0, 1), got {ratio!r}")
        if n_per_layer is not None and (int(n_per_layer) != n_per_layer or n_per_layer < 0):
            raise ValueError(f"n_per_layer must be a non-negative integer, got {n_per_layer!r}")
        if int(holdout_batches) != holdout_batches or holdout_batches < 1:
            raise ValueError(f"holdout_batches must be a positive integer, got {holdout_batches!r}")
        if atol is not None and not atol > 0:
            raise ValueError(f"atol must be positive, got {atol!r}")
        self.score = score
        self.ratio = None if ratio is None else float(ratio)
        self.n_per_layer = None if n_per_layer is None else int(n_per_layer)
        self.holdout_batches = int(holdout_batches)
        self.output_dir, self.export, self.overwrite, self.atol, self.summary = \
            output_dir, export, overwrite, atol, summary
        self.resolved: str | None = None
        self.before: dict[int, torch.Tensor] | None = None
        self.fingerprint: dict[str, tuple[float, float]] | None = None
        self.scores: ExpertScores | None = None
        self.plan: ExpertPlan | None = None
        self.report: dict[str, Any] | None = None

    @property
    def criterion(self) -> str:
        return f"router_delta:{self.resolved or self.score}"

    def run_dir(self, trainer: pl.Trainer) -> Path:
        return Path(self.output_dir or trainer.default_root_dir)

    # ------------------------------------------------------------------ selection
    def select(self, scores: ExpertScores) -> ExpertPlan:
        """The plan: the same count per layer (uniform), smallest scores pruned, floor enforced."""
        if self.ratio is not None:
            return select_experts(scores, self.ratio, "uniform", limits=scores.limits, criterion=self.criterion)
        n = self.n_per_layer
        keep, num, pruned = {}, {}, 0
        for layer, values in scores.items():
            lim = scores.limits[layer]
            if n > lim.num_experts - lim.min_experts:
                raise ValueError(f"n_per_layer={n} prunes {n} of {lim.num_experts} experts in layer {layer}, below "
                                 f"its floor of {lim.min_experts} kept (top_k={lim.top_k})")
            # (n + 0.5) / E floors to exactly n for select_experts' floor(ratio x E)
            part = select_experts({layer: values}, (n + 0.5) / lim.num_experts, "uniform",
                                  limits={layer: lim}, criterion=self.criterion)
            keep[layer], num[layer] = part.keep[layer], part.num_experts[layer]
            pruned += part.total_pruned
        ratios = {n / e for e in num.values()}
        return ExpertPlan(keep=keep, num_experts=num, criterion=self.criterion,
                          ratio=ratios.pop() if len(ratios) == 1 else None, allocation="uniform",
                          metadata={"n_per_layer": n, "normalize": None, "target_pruned": n * len(num),
                                    "pruned": pruned})

    def _check_model(self, model: nn.Module) -> None:
        layers = find_moe_layers(unwrap_model(model))
        limits = ExpertScores.limits_of(layers)
        self.select(ExpertScores({l.index: torch.arange(l.num_experts, dtype=torch.float64) for l in layers}, limits))

    def _resolve(self, model: nn.Module) -> str:
        if self.score != "auto":
            return self.score
        return "weight" if _adapters()[2](model) else "logit"

    # ------------------------------------------------------------------ lifecycle
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
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
        if self.plan is not None:
            return
        if self.before is None:
            raise RuntimeError("RouterDelta has no snapshot of the original router: on_fit_start did not run")
        merged_router_weights, remove_adapters, _ = _adapters()
        start = time.perf_counter()
        model = pl_module.model
        limits = ExpertScores.limits_of(find_moe_layers(unwrap_model(model)))
        if self.resolved in ("weight", "signed_weight"):
            routers = [p for l in find_moe_layers(unwrap_model(model)) for p in l.router.parameters()]
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
        self.scores = scores
        self.plan = self.select(scores)
        same_on_every_rank(self.plan.keep, f"RouterDelta's plan ({self.criterion})")
        seconds_scoring = time.perf_counter() - start

        out = self.run_dir(trainer)
        if trainer.is_global_zero:
            out.mkdir(parents=True, exist_ok=True)
            (out / "scores.json").write_text(json.dumps({self.criterion: scores.to_json()}, indent=1) + "\n")
            self.plan.save(out / "plan.json")
            rank_zero_info(f"RouterDelta: {self.criterion} prunes {self.plan.total_pruned} experts; "
                           f"plan in {out / 'plan.json'}")
        if not self.export:
            return
        base = self._full_precision(pl_module, base)
        materialize(base, engine=trainer.strategy.model)  # ZeRO-3 only; every rank
        if not trainer.is_global_zero:
            from ..surgery import prune_experts

            prune_experts(base, self.plan)
            self.report = {}
            return
        self.report = self._export(base, out, getattr(pl_module, "source", type(base).__name__), seconds_scoring)

    @staticmethod
    def _full_precision(pl_module: pl.LightningModule, base: nn.Module) -> nn.Module:
        """The original weights in full precision: a 4-bit base (QLoRA) is rebuilt from the module's source."""
        from ..modules.quantize import is_quantized_4bit

        if not is_quantized_4bit(base):
            return base
        if not hasattr(pl_module, "build_original"):
            raise ValueError("the fitted model has 4-bit base weights and the LightningModule cannot rebuild the "
                             "full-precision original (no build_original()); export needs the original weights")
        original = pl_module.build_original()
        pl_module.model = original
        return original

    def _export(self, base: nn.Module, out: Path, source: Any, seconds_scoring: float) -> dict[str, Any]:
        from .export import export_with_report

        return export_with_report(base, self.plan, out, out / "model", source=source, seconds_scoring=seconds_scoring,
                                  overwrite=self.overwrite, atol=self.atol, summary=self.summary,
                                  extra={"n_per_layer": self.n_per_layer})

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "resolved": self.resolved,
            "before": None if self.before is None else {str(l): v.tolist() for l, v in self.before.items()},
            "fingerprint": self.fingerprint,
            "plan": None if self.plan is None else self.plan.to_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.resolved = state_dict.get("resolved")
        before = state_dict.get("before")
        self.before = None if before is None else {int(l): torch.tensor(v, dtype=torch.float64)
                                                   for l, v in before.items()}
        fingerprint = state_dict.get("fingerprint")
        self.fingerprint = None if fingerprint is None else {k: tuple(v) for k, v in fingerprint.items()}
        plan = state_dict.get("plan")
        self.plan = None if plan is None else ExpertPlan.from_dict(plan)
