"""First-order Taylor importance of MWOP's width units (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning
for Efficient MLLMs"), section 3 and appendix A.1).

Loss: teacher-forced answer cross-entropy. ``labels`` are -100 outside the answer and are shifted by
one like a causal LM; sample b's loss L_b is the mean CE over its own answer tokens, and one backward
of sum_b L_b per batch gives every sample's own gradients (samples do not interact in the forward).

- Attention (MWOP appendix A.1): O_(l,h,p) = (A ⊙ M_p) V is path p's additive contribution
  to head h's output before ``o_proj`` with the attention weights A held fixed (no renormalisation:
  "we zero either contribution without renormalizing"). A unit gate g[b, h, p] = 1 multiplies it, so
  dL_b/dg[b, h, p] = <O_(l,h,p), dL_b/dO_(l,h)> and

      S_attn(l, h, p) = mean over samples b of |dL_b/dg[b, h, p]| / |Q_p,b|

  with |Q_p,b| the number of queries of the path's query modality in sample b (VISION for V2V, TEXT for
  T2V and T2T). A sample without such queries contributes 0 and still counts as a sample.
- FFN (MWOP appendix B.1): a gate g[b, c, mu] multiplies h_ic (the gated activation before ``down_proj``) for the
  tokens i of modality mu, so dL_b/dg = sum_{i in mu} h_ic dL_b/dh_ic and

      S_ffn(l, c, mu) = mean over samples b of |sum_{i in mu} h_ic dL_b/dh_ic|.

With ``plan`` its masks are applied during the pass (Alg. 1 line 7: FFN importance is computed with the
chosen attention masks). Gradients are taken w.r.t. the gates only (no parameter ``.grad`` is written);
the model's modules end in the train/eval mode they started in; under torch.distributed the sums and
the sample count are all-reduced once at the end.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from lightprune.core.batch import model_inputs
from lightprune.core.jsonio import read_json, write_json
from lightprune.models.unwrap import base_model_of
from lightprune.width.layers import find_width_layers, vision_token_ids
from lightprune.width.mask import WidthHooks
from lightprune.width.paths import MODALITIES, PATHS, TEXT, VISION
from lightprune.width.plan import WidthPlan

__all__ = ["WidthScores", "taylor_importance", "answer_losses"]


@dataclass(eq=False)
class WidthScores:
    """``attn[l]`` float64 [H, 3] (columns `PATHS`), ``ffn[l]`` {"vision", "text"} float64 [m]."""

    attn: dict[int, torch.Tensor]
    ffn: dict[int, dict[str, torch.Tensor]]
    num_samples: int

    def to_dict(self) -> dict[str, Any]:
        return {"paths": list(PATHS), "num_samples": int(self.num_samples),
                "attn": {str(l): s.tolist() for l, s in self.attn.items()},
                "ffn": {str(l): {mu: s[mu].tolist() for mu in MODALITIES} for l, s in self.ffn.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "WidthScores":
        unknown = sorted(set(data) - {"paths", "num_samples", "attn", "ffn"})
        if unknown:
            raise ValueError(f"unknown width score keys {unknown}")
        if tuple(data.get("paths", PATHS)) != PATHS:
            raise ValueError(f"width score columns are {data.get('paths')}, this lightprune reads {list(PATHS)}")
        attn = {int(l): torch.tensor(s, dtype=torch.float64) for l, s in data.get("attn", {}).items()}
        bad = [l for l, s in attn.items() if s.dim() != 2 or s.shape[1] != len(PATHS)]
        if bad:
            raise ValueError(f"attention scores of layers {bad} are not [heads, {len(PATHS)}]")
        ffn = {}
        for l, s in data.get("ffn", {}).items():
            if set(s) != set(MODALITIES):
                raise ValueError(f"FFN scores of layer {l} must have the keys {list(MODALITIES)}, got {sorted(s)}")
            ffn[int(l)] = {mu: torch.tensor(s[mu], dtype=torch.float64) for mu in MODALITIES}
        return cls(attn=attn, ffn=ffn, num_samples=int(data["num_samples"]))

    def save(self, path: str | os.PathLike) -> Path:
        return write_json(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "WidthScores":
        return cls.from_dict(read_json(path, "width score"))


def answer_losses(logits: torch.Tensor, labels: torch.Tensor, where: str = "batch") -> torch.Tensor:
    """[B] mean next-token cross-entropy over each sample's answer tokens (labels != -100, shifted by one)."""
    if labels.shape != logits.shape[:2]:
        raise ValueError(f"{where}: labels {tuple(labels.shape)} do not match the logits {tuple(logits.shape[:2])}")
    target = labels[:, 1:]
    answer = target != -100
    counts = answer.sum(dim=1)
    if not bool(answer.any()):
        raise ValueError(f"{where}: labels mark no answer token (every label is -100 after the shift by one)")
    empty = (counts == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"{where}: samples {empty} have no answer token (labels all -100 after the shift by one)")
    ce = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), target.masked_fill(~answer, 0), reduction="none")
    return (ce * answer).sum(dim=1) / counts


def _show_progress(progress: bool | None) -> bool:
    if progress is not None:
        return bool(progress)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    return (not distributed or torch.distributed.get_rank() == 0) and sys.stderr.isatty()


def taylor_importance(model: nn.Module, batches: Iterable[Mapping[str, Any]], *, attention: bool = True,
                      ffn: bool = False, plan: WidthPlan | None = None, progress: bool | None = None) -> WidthScores:
    """Taylor scores of the attention paths (``attention``) and dense-FFN channels (``ffn``); module docstring.

    ``batches`` are dicts of model inputs plus ``labels`` (-100 outside the answer); ``labels`` and
    ``task_ids`` are not passed to the model. ``progress`` None shows a bar on an interactive rank 0.
    """
    if not (attention or ffn):
        raise ValueError("taylor_importance needs attention=True or ffn=True: nothing to score")
    if plan is not None and not isinstance(plan, WidthPlan):
        raise TypeError(f"plan must be a WidthPlan or None, got {type(plan).__name__}")
    base = base_model_of(model)
    layers = {layer.index: layer for layer in find_width_layers(base)}
    vision_token_ids(base)  # an error naming the model when it has no vision tokens
    dense = sorted(i for i, layer in layers.items() if layer.intermediate_size is not None)
    if ffn and not dense:
        raise ValueError(f"ffn=True but every FFN of {type(base).__name__} is an MoE block (layers {sorted(layers)}): "
                         f"no dense FFN channels to score")
    device = next(base.parameters()).device
    attn_sum = {i: torch.zeros(layers[i].num_heads, len(PATHS), dtype=torch.float64, device=device)
                for i in (layers if attention else ())}
    ffn_sum = {i: torch.zeros(layers[i].intermediate_size, len(MODALITIES), dtype=torch.float64, device=device)
               for i in (dense if ffn else ())}
    samples = torch.zeros((), dtype=torch.float64, device=device)
    modes = {m: m.training for m in base.modules()}
    iterator = batches
    if _show_progress(progress):
        from tqdm.auto import tqdm

        iterator = tqdm(batches, desc="taylor importance", unit="batch", leave=False)
    hooks = WidthHooks(base, plan, gate_attention=attention, gate_ffn=ffn)
    try:
        base.eval()
        for step, batch in enumerate(iterator):
            if "labels" not in batch:
                raise ValueError(f"batch {step} has no 'labels': Taylor importance needs the answer tokens "
                                 f"(-100 elsewhere)")
            inputs = model_inputs(batch, device=device)
            labels = batch["labels"].to(device)
            gates = hooks.new_gates(labels.shape[0], device)
            with torch.enable_grad():
                losses = answer_losses(base(**inputs).logits, labels, where=f"batch {step}")
                grads = dict(zip(gates, torch.autograd.grad(losses.sum(), list(gates.values()))))
            with torch.no_grad():
                modality = hooks.state.modality.to(device)
                queries = torch.stack([(modality == VISION).sum(1), (modality == TEXT).sum(1),
                                       (modality == TEXT).sum(1)], dim=1).double()  # [B, 3] per path
                for i in attn_sum:
                    g = grads[("attn", i)].double().abs()  # [B, H, 3]
                    per_query = torch.where(queries[:, None] > 0, g / queries[:, None].clamp_min(1), 0.0)
                    attn_sum[i] += per_query.sum(dim=0)
                for i in ffn_sum:
                    ffn_sum[i] += grads[("ffn", i)].double().abs().sum(dim=0)
                samples += labels.shape[0]
            hooks.clear_gates()
    finally:
        hooks.remove()
        for module, training in modes.items():
            module.train(training)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        flat = torch.cat([samples.reshape(1)] + [t.flatten() for t in (*attn_sum.values(), *ffn_sum.values())])
        torch.distributed.all_reduce(flat)
        samples, offset = flat[0], 1
        for acc in (*attn_sum.values(), *ffn_sum.values()):
            acc.copy_(flat[offset:offset + acc.numel()].view_as(acc))
            offset += acc.numel()
    n = int(samples.item())
    if n == 0:
        raise ValueError("taylor_importance got no batches: the calibration set is empty")
    return WidthScores(attn={i: (s / n).cpu() for i, s in attn_sum.items()},
                       ffn={i: {mu: (s[:, k] / n).cpu() for k, mu in enumerate(MODALITIES)}
                            for i, s in ffn_sum.items()},
                       num_samples=n)
