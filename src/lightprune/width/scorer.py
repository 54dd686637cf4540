"""The width-scorer interface: one small class per importance of MWOP's width units (MWOP ("MWOP: Modality-aware
Width-wise Operation Pruning for Efficient MLLMs"), section 3).

A width scorer turns a model, and the calibration batches it asks for, into
[`WidthScores`][..WidthScores]: for every decoder layer l of the language model ``attn[l]``, float64
[heads, 3] (columns `PATHS`: V2V, T2V, T2T), and for every dense-FFN layer ``ffn[l]``,
{"vision", "text"} float64 [channels]; an importance, higher = keep. A scorer never prunes: the selections
(`lightprune.width.select`: MWOP sections 4 and 5) turn scores into a plan, as Torch-Pruning keeps its
importance apart from its pruner. The built-in scorers (`lightprune.width.scorers`) are MWOP's first-order
Taylor importance (section 3, appendix A.1)

    S_attn(l, h, p) = mean_b |<O_(l,h,p), dL_b/dO_(l,h)>| / |Q_p,b|,   S_ffn(l, c, mu) = mean_b |sum_{i in mu} h_ic dL_b/dh_ic|,

its "All Tasks" variant (appendix A.4: every unit ranked by min over task categories c of its rank r_c(u) in
category c's own Taylor scores) and the random baseline.

What a scorer reads is its class attribute `WidthScorer.calibration`:

- ``"none"`` (`NO_DATA`): weights only; ``batches`` is None;
- ``"batches"`` (`BATCHES`): one calibration set, an iterable of batches (model inputs plus ``labels``);
- ``"per_task"`` (`PER_TASK`): one calibration set per task category, a mapping {task name: batches}.
  [`category_batches`][] builds it from a datamodule that serves a split's rows per task
  (``dataloader(split, tasks=[name])``, as the generated QA datamodules do); ``WidthSearch`` and the quality
  harness call it.

The constructor is the config: subclasses take typed keyword arguments and validate them in ``__init__`` with
errors naming the bad value; ``hparams`` and ``repr`` read them back. Calibration-free scorers implement
[`WidthScorer.score_heads`][] and [`WidthScorer.score_channels`][] (one layer at a time, under no_grad, ZeRO-3
partitions gathered); scorers that read data implement [`WidthScorer.compute`][]. [`WidthScorer.score`][]
is the one call the callers make: it checks the arguments, then the result's layers, shapes and values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from lightprune.core.distributed import gathered
from lightprune.core.registry import Configured
from lightprune.width.layers import WidthLayer, find_width_layers
from lightprune.width.paths import MODALITIES, PATHS
from lightprune.width.plan import WidthPlan
from lightprune.width.taylor import WidthScores

__all__ = ["BATCHES", "CALIBRATIONS", "NO_DATA", "PER_TASK", "WidthScorer", "category_batches"]

NO_DATA, BATCHES, PER_TASK = "none", "batches", "per_task"
#: what a scorer may read (its ``calibration`` class attribute)
CALIBRATIONS = (NO_DATA, BATCHES, PER_TASK)


class WidthScorer(Configured):
    """Base class of every width scorer; register subclasses with ``@register_width_scorer("name")``."""

    #: registry name, set by ``@register_width_scorer``
    name: ClassVar[str] = ""
    #: what :meth:`score` reads as ``batches``: one of :data:`CALIBRATIONS` (module docstring)
    calibration: ClassVar[str] = NO_DATA

    # ------------------------------------------------------------------ config
    @property
    def label(self) -> str:
        return self.name or type(self).__name__

    # ------------------------------------------------------------------ scoring
    def score(self, model: nn.Module, batches: Any = None, *, attention: bool = True, ffn: bool = False,
              plan: WidthPlan | None = None, progress: bool | None = None) -> WidthScores:
        """Scores of the attention paths (``attention``) and the dense-FFN channels (``ffn``) of ``model``.

        Args:
            batches: what `calibration` asks for (module docstring): None, an iterable of batches, or
                {task name: batches}.
            plan: masks applied while calibration data is observed (FFN importance under the chosen attention
                masks, Alg. 1 line 7); a scorer that reads no data scores the weights, masked or not.
            progress: a progress bar over the batches (None: on an interactive rank 0).

        Returns:
            [`WidthScores`][] with ``attn`` for every decoder layer when ``attention`` (else empty) and ``ffn``
            for every dense-FFN layer when ``ffn`` (else empty), float64 on the CPU.
        """
        if not (attention or ffn):
            raise ValueError(f"width scorer {self.label!r}: attention=False and ffn=False leave nothing to score")
        if plan is not None and not isinstance(plan, WidthPlan):
            raise TypeError(f"plan must be a WidthPlan or None, got {type(plan).__name__}")
        self._check_batches(batches)
        layers = find_width_layers(model)
        if ffn and all(layer.intermediate_size is None for layer in layers):
            raise ValueError(f"width scorer {self.label!r}: ffn=True but every FFN of the model is an MoE block "
                             f"(layers {[layer.index for layer in layers]}): no dense FFN channels to score")
        scores = self.compute(model, batches, attention=attention, ffn=ffn, plan=plan, progress=progress)
        return self._checked(scores, layers, attention, ffn)

    def compute(self, model: nn.Module, batches: Any, *, attention: bool, ffn: bool, plan: WidthPlan | None,
                progress: bool | None) -> WidthScores:
        """The scores, arguments already checked. The base walks the layers with [`score_heads`][] and
        [`score_channels`][] (calibration-free scorers); scorers that read data override it."""
        if self.calibration != NO_DATA:
            raise NotImplementedError(f"{type(self).__name__} reads calibration data ({self.calibration!r}) and "
                                      f"must implement compute(model, batches, attention=, ffn=, plan=, progress=)")
        attn: dict[int, torch.Tensor] = {}
        channels: dict[int, dict[str, torch.Tensor]] = {}
        with torch.no_grad():
            for layer in find_width_layers(model):
                dense = ffn and layer.intermediate_size is not None
                if not (attention or dense):
                    continue
                with gathered(list(layer.attention.parameters()) + list(layer.mlp.parameters())):
                    if attention:
                        attn[layer.index] = _per_path(self.score_heads(layer), layer, self.label)
                    if dense:
                        channels[layer.index] = _per_modality(self.score_channels(layer), layer, self.label)
        return WidthScores(attn=attn, ffn=channels, num_samples=0)

    def score_heads(self, layer: WidthLayer) -> torch.Tensor:
        """One layer's head importance: [num_heads] (the same for the three paths) or [num_heads, 3]."""
        raise NotImplementedError(f"{type(self).__name__} must implement score_heads(layer) and "
                                  "score_channels(layer) (calibration-free scorers) or compute(...)")

    def score_channels(self, layer: WidthLayer) -> torch.Tensor | Mapping[str, torch.Tensor]:
        """One dense-FFN layer's channel importance: [intermediate_size] (the same for both modalities) or
        {"vision": [m], "text": [m]}."""
        raise NotImplementedError(f"{type(self).__name__} must implement score_channels(layer) and "
                                  "score_heads(layer) (calibration-free scorers) or compute(...)")

    # ------------------------------------------------------------------ checks
    def _check_batches(self, batches: Any) -> None:
        kind, label = self.calibration, self.label
        if kind not in CALIBRATIONS:
            raise ValueError(f"{type(self).__name__}.calibration must be one of {list(CALIBRATIONS)}, got {kind!r}")
        if kind == NO_DATA and batches is not None:
            raise ValueError(f"width scorer {label!r} reads no calibration data; got batches ({type(batches).__name__})"
                             f", pass None")
        if kind == BATCHES and (batches is None or isinstance(batches, (Mapping, str))):
            raise ValueError(f"width scorer {label!r} reads one calibration set: an iterable of batches, got "
                             f"{type(batches).__name__}")
        if kind == PER_TASK:
            if not isinstance(batches, Mapping) or not batches:
                raise ValueError(f"width scorer {label!r} reads one calibration set per task category: a non-empty "
                                 f"mapping {{task name: batches}} (category_batches(datamodule)), got "
                                 f"{batches if isinstance(batches, Mapping) else type(batches).__name__!r}")
            bad = [t for t in batches if not isinstance(t, str) or not t]
            if bad:
                raise ValueError(f"width scorer {label!r}: task categories must be named by non-empty strings, "
                                 f"got {bad}")

    def _checked(self, scores: Any, layers: list[WidthLayer], attention: bool, ffn: bool) -> WidthScores:
        label = self.label
        if not isinstance(scores, WidthScores):
            raise TypeError(f"width scorer {label!r} returned {type(scores).__name__}, not WidthScores")
        want_attn = {layer.index: layer.num_heads for layer in layers} if attention else {}
        want_ffn = {layer.index: layer.intermediate_size for layer in layers
                    if layer.intermediate_size is not None} if ffn else {}
        if sorted(scores.attn) != sorted(want_attn) or sorted(scores.ffn) != sorted(want_ffn):
            raise ValueError(f"width scorer {label!r} scored attention layers {sorted(scores.attn)} and FFN layers "
                             f"{sorted(scores.ffn)}; expected {sorted(want_attn)} and {sorted(want_ffn)}")
        attn = {l: _values(scores.attn[l], (heads, len(PATHS)), f"{label!r}: attention scores of layer {l}")
                for l, heads in want_attn.items()}
        channels = {}
        for l, m in want_ffn.items():
            if not isinstance(scores.ffn[l], Mapping) or set(scores.ffn[l]) != set(MODALITIES):
                raise ValueError(f"width scorer {label!r}: FFN scores of layer {l} must map {list(MODALITIES)} to "
                                 f"tensors, got {scores.ffn[l]!r}")
            channels[l] = {mu: _values(scores.ffn[l][mu], (m,), f"{label!r}: {mu} FFN scores of layer {l}")
                           for mu in MODALITIES}
        return WidthScores(attn=attn, ffn=channels, num_samples=int(scores.num_samples))


def _values(tensor: Any, shape: tuple[int, ...], where: str) -> torch.Tensor:
    """float64 CPU values of the expected shape, all finite (the same tensor when it already is one)."""
    if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
        got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"width scorer {where} have shape {got}, expected {shape}")
    values = tensor.detach().to(device="cpu", dtype=torch.float64)
    bad = (~torch.isfinite(values)).nonzero().tolist()
    if bad:
        raise ValueError(f"width scorer {where} are not finite at {bad[:5]} (NaN or inf: a broken checkpoint or "
                         f"calibration pass); nothing was pruned")
    return values


def _per_path(values: torch.Tensor, layer: WidthLayer, label: str) -> torch.Tensor:
    """[H] -> [H, 3] (one value for the three paths); [H, 3] as is."""
    if isinstance(values, torch.Tensor) and tuple(values.shape) == (layer.num_heads,):
        values = values[:, None].expand(-1, len(PATHS))
    return _values(values, (layer.num_heads, len(PATHS)), f"{label!r}: score_heads of layer {layer.index}").clone()


def _per_modality(values: Any, layer: WidthLayer, label: str) -> dict[str, torch.Tensor]:
    """[m] -> {"vision": [m], "text": [m]} (one value for both modalities); a mapping as is."""
    where = f"{label!r}: score_channels of layer {layer.index}"
    if isinstance(values, Mapping):
        if set(values) != set(MODALITIES):
            raise ValueError(f"width scorer {where} must map {list(MODALITIES)}, got keys {sorted(values)}")
        return {mu: _values(values[mu], (layer.intermediate_size,), where).clone() for mu in MODALITIES}
    shared = _values(values, (layer.intermediate_size,), where)
    return {mu: shared.clone() for mu in MODALITIES}


def category_batches(datamodule: Any, split: str = "calibration") -> dict[str, Iterable]:
    """{task name: that task's batches of ``split``} for a ``per_task`` scorer, in ``task_names`` order.

    Reads ``datamodule.task_names`` and ``datamodule.dataloader(split, tasks=[name])`` (the generated QA
    datamodules serve both). A category whose loader has no batches (a list or a sized loader of length 0) is left
    out: it ranks nothing. The loaders are returned as given (not materialised).
    """
    names = getattr(datamodule, "task_names", None)
    serve = getattr(datamodule, "dataloader", None)
    if not callable(serve):
        raise ValueError(f"{type(datamodule).__name__} has no dataloader(split, tasks=[name]): a per-task width "
                         f"scorer needs one calibration set per task category; give the scorer {{task: batches}} "
                         f"yourself or use a datamodule that serves a split per task")
    if not names:
        raise ValueError(f"{type(datamodule).__name__} has no task_names: no task categories to calibrate on")
    out = {}
    for name in names:
        loader = serve(split, tasks=[name])
        try:
            empty = len(loader) == 0
        except TypeError:  # an unsized (iterable) loader: an empty one is an error when the scorer reads it
            empty = False
        if not empty:
            out[name] = loader
    return out
