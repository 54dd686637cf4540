"""Plan -> verified checkpoint in one call: [`export_pruned`][].

The reference for verification is the *masked* model (``with mask_experts(model, plan)``),
computed before any surgery, so the exported checkpoint is checked against what the plan means,
not against the pruned model it was written from: a bug in structural removal, in saving or in
loading all show up as a logits difference.

The plan, the unpruned model's parameter count and tensor bytes go into the export's manifest and
model card (``save_pruned(card=...)``), so the checkpoint says which original experts each layer
keeps. An output directory that is (or holds) the source checkpoint is refused before any surgery.

Every input is checked before any surgery or merge: the plan against the model first (every MoE layer named and no
other, the expert counts, the floors: [`check_layers`][lightprune.experts.plan.ExpertPlan.check_layers]; a plan that
leaves layers out is refused, ``plan.completed(lp.find_moe_layers(model))`` keeps them whole), then ``atol``, the output
directory, the card and the source's fingerprint. The export's one `Verification` runs each step once: ``write_merged``,
``mask_experts`` and ``prune_experts`` are given the checked layers and do not check the plan again, and `write_pruned`
then writes and verifies the checkpoint with the same probe, buffers and ``atol``, and returns its
[`ExportResult`][..result.ExportResult].
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from lightprune.checkpoints.staging import check_out_dir
from lightprune.core.errors import PlanError
from lightprune.experts.mask import mask_experts
from lightprune.experts.merging import MergePlan, write_merged
from lightprune.experts.plan import ExpertPlan
from lightprune.experts.prune import prune_experts
from lightprune.export.card_facts import card_facts
from lightprune.export.quantize import check_quantize, model_block, quantize_staged
from lightprune.export.result import ExportResult
from lightprune.export.save import parameter_count, tensor_bytes, write_pruned
from lightprune.export.source import check_not_source, resolve_source_dir, source_fingerprint
from lightprune.export.verification import Verification, check_reference_finite, mismatch
from lightprune.export.verify import model_logits
from lightprune.models import find_moe_layers

__all__ = ["export_pruned"]


def _name_a_surgery_problem(model: nn.Module, verification: Verification, reference: torch.Tensor,
                            err: Exception) -> None:
    """After a failed save / verification: raise the surgery error when the in-memory pruned model already differs
    from the masked one (the checkpoint is not to blame); return (the caller re-raises ``err``) otherwise."""
    try:
        gap = verification.compare(model_logits(model, verification.probe_for(model)), reference, model,
                                   what="pruned model")
    except Exception:  # noqa: BLE001 - the diagnosis failed: the caller re-raises the original error
        return
    if not gap.ok:
        raise mismatch(gap, f"the pruned model's logits differ from the masked model's by up to {gap.describe()}; "
                            "nothing was written (the in-memory model is pruned). In bf16/fp16 a near tie between "
                            "router scores can flip an expert choice: pass a larger atol or export in fp32") from err


def _check_no_mtp_layers(model: nn.Module, plan: ExpertPlan | MergePlan) -> None:
    """A plan naming the checkpoint's multi-token-prediction layers (``lp.score_weights`` of the directory scores
    them, `lightprune.checkpoints.mtp`), which a model in memory does not hold: refused saying where they are
    pruned."""
    config = getattr(model.config, "text_config", None) or model.config
    count = getattr(config, "num_hidden_layers", None)
    declared = getattr(config, "num_nextn_predict_layers", None) or getattr(config, "mtp_num_hidden_layers", None)
    if not isinstance(count, int) or not isinstance(declared, int) or isinstance(declared, bool) or declared < 1:
        return
    named = sorted(layer for layer in plan.num_experts if count <= layer < count + declared)
    if named:
        raise PlanError(f"plan names layer(s) {named}, the checkpoint's multi-token-prediction layer(s), which the "
                        "model in memory does not hold: prune the checkpoint directory with lp.prune_checkpoint(dir, "
                        "plan, out_dir), which prunes them with the model, or leave them out of the plan")


def export_pruned(model: nn.Module, plan: ExpertPlan | MergePlan, out_dir: str | os.PathLike, *,
                  probe: Mapping[str, Any] | None = None, overwrite: bool = False, atol: float | None = None,
                  processor: Any = None, source_dir: str | os.PathLike | None = None,
                  card: Mapping[str, Any] | None = None, quantize: str | None = None) -> ExportResult:
    """Prune ``model`` in place by ``plan``, save it to ``out_dir`` and verify it against the masked model.

    A [`MergePlan`][lightprune.experts.merging.plan.MergePlan] merges instead: once the checks below have passed, every
    cluster's merged expert is written into its dominant's slot and the export goes on with the plan's
    ExpertPlan (the dominants kept), so the reference is the reversibly merged model
    ([`merged_experts`][lightprune.experts.merging.merge.merged_experts] computes the same).

    ``processor``, ``source_dir`` and ``card`` are as for [`save_pruned`][] (the tokenizer, the source's
    fingerprint; ``card``: ``source``, ``command``, ``evaluation``), with ``plan`` and the unpruned model's
    ``parameters_before`` / ``parameter_bytes_before`` added to the card here. ``quantize="fp8"``: once verified,
    the checkpoint is written FP8 block-scaled (`quantize_staged`, the DeepSeek-V3
    layout, each tensor checked within float8's rounding; the manifest's ``quantization``), in 128x128 blocks, or
    in the blocks of the FP8 checkpoint the model was loaded from (`model_block`).

    Returns an [`ExportResult`][...result.ExportResult]: ``path``, ``parameters_before``, ``parameters``,
    ``weight_bytes`` (safetensors bytes on disk), ``parameter_bytes`` (bytes of the pruned tensors),
    ``experts_per_layer``, ``uniform``, ``max_abs_diff``, ``seconds``, ...

    The plan is checked against the model before anything changes (every MoE layer named and no other, the
    expert counts, the routing floors: [`check_layers`][lightprune.experts.plan.ExpertPlan.check_layers], a
    [`PlanError`][lightprune.experts.plan.PlanError]), and so is the output directory (also that it is not, and does not
    hold, the source checkpoint directory: ``ValueError``). NaN or inf logits of the masked model, before any surgery,
    are an [`ExportVerificationError`][] naming the model's non-finite tensors (the model is broken, not the
    export). The reloaded checkpoint is compared with the masked
    model; only when that fails is the in-memory pruned model run too, to name the cause (a surgery
    problem, or a save / load one). A mismatch raises [`ExportVerificationError`][], leaving
    ``out_dir`` untouched and the in-memory model pruned.
    """
    start = time.perf_counter()
    if not isinstance(plan, (ExpertPlan, MergePlan)):
        raise TypeError(f"export_pruned takes an ExpertPlan (pruning) or a MergePlan (merging), got "
                        f"{type(plan).__name__}: build one with lp.select_experts / lp.hc_smoe_plan, or load a saved "
                        "one with lp.ExpertPlan.load(path) / lp.MergePlan.load(path)")
    _check_no_mtp_layers(model, plan)
    layers = find_moe_layers(model)
    verification = Verification(probe)
    plan.check_layers(layers)  # every MoE layer, counts and floors: before anything changes
    merge = plan if isinstance(plan, MergePlan) else None
    if merge is not None:
        plan = merge.expert_plan()  # checked with the MergePlan: its kept layout
    verification.check_atol(atol)  # NaN would switch verification off: refused before any surgery
    quantize = check_quantize(quantize)
    source = resolve_source_dir(model, source_dir)
    check_not_source(out_dir, source)
    check_out_dir(out_dir, overwrite)
    given = dict(card or {})
    ours = sorted({"plan", "parameters_before", "parameter_bytes_before"} & set(given))
    if ours:
        raise ValueError(f"export_pruned fills card keys {ours} itself; pass the plan as the plan argument")
    # a bad card or source is an error before any surgery
    facts = card_facts({**given, "plan": plan, "parameters_before": parameter_count(model),
                        "parameter_bytes_before": tensor_bytes(model)}, plan.kept_counts())
    fingerprint = source_fingerprint(source)
    probe = verification.probe_for(model)
    if merge is not None:
        # irreversible: after every check that can fail without surgery (plan included)
        write_merged(model, merge, layers=layers)
    verification.restore_buffers(model)  # cast with .to(bf16): rotary inv_freq back in fp32, as the checkpoint reloads
    with mask_experts(model, plan, layers=layers):  # the plan checked above
        reference = model_logits(model, probe)
    check_reference_finite(model, reference, "export_pruned", "before any pruning, the plan's experts masked",
                           "nothing was pruned or written" if merge is None else
                           "nothing was pruned or written (the in-memory model holds the merged experts)")
    prune_experts(model, plan, layers=layers)
    counts = {layer.index: layer.num_experts for layer in find_moe_layers(model)}
    requantize = functools.partial(quantize_staged, block=model_block(model, source)) if quantize else None
    try:
        return write_pruned(model, out_dir, counts, source=source, facts=facts, fingerprint=fingerprint,
                            verification=verification, reference_logits=reference, overwrite=overwrite,
                            processor=processor, max_shard_size=None, start=start, where="export_pruned",
                            expert_ids=plan.keep, after_verify=requantize)
    except Exception as err:  # re-raised below unless the surgery is to blame
        _name_a_surgery_problem(model, verification, reference, err)
        raise
