"""The [`Criterion`][] interface: one small class per expert-importance scorer.

A criterion turns a model (weight criteria) or observed batches (calibration criteria) into
[`ExpertScores`][...scores.ExpertScores]: per MoE layer one value per routed expert, higher =
keep. ``raw`` keeps the value as its paper defines it (AIMER, for one, prunes its *largest*
values, so its importance is ``-raw``).

The constructor is the config: subclasses take typed keyword arguments, validate them in
``__init__`` and raise errors that name the bad value and the allowed ones. ``hparams`` and
``repr`` read those arguments back, so a criterion is reported exactly as it was built.

Weight criteria (``needs_data = False``) implement [`Criterion.score_layer`][]; the base
class walks the MoE layers under ``torch.no_grad()`` and assembles the scores, gathering one
layer's ZeRO-3 partitions at a time (`lightprune.core.distributed`), so ``score_layer`` always
sees full tensors. A criterion that reads weights first refuses a NaN or inf in a tensor the layer's routing reads
(`check_routing_tensors`, once per layer): its ranking would be of a model
that routes on it.

Criteria that need data (``needs_data = True``) score from what a run observed instead:
[`Criterion.score_in_run`][] is the one call the pruning callback makes for every kind;
[`Criterion.score`][] on such a criterion raises an error that points to calibration.
Their base classes: `lightprune.experts.criteria.from_data`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from torch import nn

from lightprune.core.distributed import gathered, layer_parameters
from lightprune.core.registry import Configured
from lightprune.experts.scores import ExpertScores
from lightprune.models import MoELayer, find_moe_layers
from lightprune.models.routing_check import check_routing_tensors

__all__ = ["Criterion", "CriterionNeedsDataError"]


class CriterionNeedsDataError(ValueError):
    """A calibration criterion was asked to score from weights alone."""

    def __init__(self, name: str):
        super().__init__(
            f"criterion {name!r} needs calibration data and cannot score from weights alone; collect "
            f"statistics first: stats = lp.collect_expert_stats(model, batches); stats.score({name!r}) "
            f"(or run `lightprune calibrate`). Weight-only criteria: use lp.score_weights(model, name) "
            f"with one of lp.available_criteria(needs_data=False)")
        self.name = name


class Criterion(Configured):
    """Base class of every expert-importance criterion; register subclasses with
    ``@register_criterion("name")``.

    Subclass contract (weight criteria): implement [`score_layer`][] returning the raw
    per-expert value ``[E]`` of one layer; override [`importance`][] when larger raw values
    should be pruned first. Read weights in place (no per-expert copies); [`score`][] already
    runs under ``torch.no_grad()``.
    """

    #: registry name, set by ``@register_criterion``
    name: ClassVar[str] = ""
    #: True for criteria that score from calibration batches, not from weights
    needs_data: ClassVar[bool] = False
    #: False for a weight criterion that reads no tensor (``random``: the expert counts are enough)
    reads_weights: ClassVar[bool] = True

    # ------------------------------------------------------------------ scoring
    def score(self, model: nn.Module,
              layer_weights: Callable[[MoELayer], AbstractContextManager[Any]] | None = None) -> ExpertScores:
        """Score every routed expert of every MoE layer of ``model`` from its weights.

        Dense layers are absent and shared experts are never scored (the adapter's rule).
        Values come back as float64 CPU tensors. Under DeepSpeed ZeRO-3 each layer's router and
        expert partitions are gathered while that layer is scored (one layer at a time; every
        rank must call this, as the callbacks do). ``layer_weights(layer)``, when given, is the
        context in which a layer's weights are present instead (a streamed checkpoint loads them;
        entered only when `reads_weights`).
        """
        if self.needs_data:
            raise CriterionNeedsDataError(self.name or type(self).__name__)

        layers = find_moe_layers(model)
        raw: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for layer in layers:
                if not self.reads_weights:
                    context = contextlib.nullcontext()
                elif layer_weights is not None:
                    context = layer_weights(layer)
                else:
                    context = gathered(layer_parameters(layer))  # ZeRO-3: this layer's partitions only
                with context:
                    if self.reads_weights:  # the routing tensors are in memory with the layer's weights
                        check_routing_tensors(layer, f"criterion {self.name or type(self).__name__!r}",
                                              "nothing was scored (the model routes on it)")
                    values = self.score_layer(layer)
                if values.shape != (layer.num_experts,):
                    raise ValueError(f"{type(self).__name__}.score_layer returned shape {tuple(values.shape)} "
                                     f"for layer {layer.index}; expected ({layer.num_experts},)")
                bad = (~torch.isfinite(values)).nonzero().flatten().tolist()
                if bad:
                    raise ValueError(f"criterion {self.name or type(self).__name__!r}: layer {layer.index}, experts "
                                     f"{bad} score {[float(values[i]) for i in bad]} (non-finite: their weights hold "
                                     "NaN or inf, a broken checkpoint); nothing was pruned")
                raw[layer.index] = values.detach().to(device="cpu", dtype=torch.float64)
        importance = {index: self.importance(values) for index, values in raw.items()}
        return ExpertScores(importance, limits=ExpertScores.limits_of(layers),
                            criterion=self.name or type(self).__name__, raw=raw)

    def score_in_run(self, model: nn.Module, calibration: Any = None, fitted: Any = None) -> ExpertScores:
        """Importance in a run: from ``model``'s weights here; criteria that need data read ``calibration``
        (the run's CalibrationStats) or ``fitted`` (scores a fit produced, by criterion name)."""
        return self.score(model)

    def weight_modules(self, layer: MoELayer) -> list[nn.Module] | None:
        """The modules of ``layer`` whose weights [`score_layer`][] reads (None: the whole MoE block). A streamed
        checkpoint reads only these for the layer (AIMER: the experts; router norm: the router)."""
        return None

    def score_layer(self, layer: MoELayer) -> torch.Tensor:
        """The raw per-expert value ``[layer.num_experts]`` of one MoE layer."""
        raise NotImplementedError(f"{type(self).__name__} must implement score_layer(layer) "
                                  "(weight criteria) or set needs_data = True (calibration criteria)")

    def importance(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw values -> importance (higher = keep). The identity unless overridden."""
        return raw

