"""Prune a checkpoint directory shard by shard, without loading the model: [`prune_checkpoint`][].

Which tensors index experts, and along which dimension, is not guessed from names: the plan's surgery
([`lightprune.experts.prune_experts`][lightprune.experts.prune.prune_experts]) runs on the checkpoint's model on the
meta device, and the tensors it reshapes are the ones to cut (router rows and biases, fused expert tensors, a family's
per-expert router or block tensors), in the model's names. Each checkpoint key is mapped to its model tensor through
transformers' own conversion mapping ([`Skeleton`][lightprune.checkpoints.skeleton.Skeleton]); then, per key:

- a per-expert key (``...experts.<n>.<name>``, what transformers' ``save_pretrained`` writes) of a pruned layer:
  kept experts are written under their new index (their rank among the kept ones), the others are dropped;
- a fused key (``...experts.gate_up_proj``, a router ``weight``): the kept slices along the experts' dimension
  (an expert's rows where it holds several, DBRX's; a router's rows of identity experts too, LongCat-Flash's),
  copied one expert at a time when that dimension is the first; a whole fused tensor that transformers
  concatenates with others along a later dimension (Step 3.7's ``gate_proj`` and ``up_proj`` into ``gate_up_proj``)
  the same way, by its own first dimension; a tensor stored transposed (Ergo's router weight, [H, E]) along the
  stored tensor's experts' dimension;
- anything else, and any key the model has no tensor for (a multi-token-prediction module's own ``eh_proj``,
  ``enorm``, ...): copied unchanged.

The checkpoint's multi-token-prediction layers (DeepSeek-V3's ``model.layers.61``: `lightprune.checkpoints.mtp`)
are MoE layers of the skeleton's model like any other: the plan names them, or `plan_with_mtp` chooses their
experts (AIMER on their own weights), so their experts and router rows always agree with the written config. A
quantized checkpoint (`lightprune.checkpoints.quantized`) is pruned in its stored format: each key's rule
applies to its stored parts (`stored_rules`: values and scales renamed or sliced alike, their bytes copied), and
its ``quantization_config`` is kept.

Each output shard keeps its source's name; its header is written first and its tensors follow one at a time
(`SafetensorsWriter`): a whole tensor or an expert's slice goes from the source file to the output by the kernel
(``copy_file_range``) once a window on its pages has been checked finite, so this process maps one tensor (an expert of
a fused one) at a time and copies no byte; a slice along a later dimension (a router's rows stored transposed) is read,
sliced and written. config.json comes from the pruned meta model (the expert counts, ``lightprune_experts_per_layer``
and the generated ``modeling_lightprune.py`` when they differ per layer, as [`save_pruned`][] writes them), the shard
index is rewritten, the tokenizer / processor / chat-template files and ``generation_config.json`` come along. Before
anything is written, every tensor a layer's routing reads (router rows and biases, correction biases, per-expert scales,
a router's norm) is read in alone and refused when it holds a NaN or inf, as
[`prune_experts`][lightprune.experts.prune.prune_experts] refuses it in memory; every tensor is checked finite before it
is written (a NaN or inf refused naming the tensor and the expert). Everything is written into a staging directory
renamed into place only after verification (`lightprune.export.streamed_verify`): a failure or a kill leaves a previous
``out_dir`` as it was.
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from lightprune.checkpoints.device import streaming_device
from lightprune.checkpoints.directory import SAFE_INDEX, checkpoint_directory
from lightprune.checkpoints.mtp import config_without_mtp
from lightprune.checkpoints.quantized_tensor import renumbered_ignores
from lightprune.checkpoints.reader import Checkpoint
from lightprune.checkpoints.skeleton import EXPERT_INDEX, Skeleton
from lightprune.checkpoints.staging import staging_dir
from lightprune.checkpoints.writer import SafetensorsWriter
from lightprune.core.checks import check_non_negative_int, check_positive_int
from lightprune.core.errors import PlanError
from lightprune.core.paths import check_path_text
from lightprune.experts.criteria.aimer import AIMER
from lightprune.experts.plan import ExpertPlan
from lightprune.experts.plan_base import check_plan_kind
from lightprune.experts.prune import PerExpertTensor, check_routing, per_expert_tensors, prune_experts
from lightprune.experts.select import select_experts
from lightprune.export.card_facts import plan_record
from lightprune.export.config_file import finish_config
from lightprune.export.quantize import check_quantize, quantize_staged
from lightprune.export.result import ExportResult, write_manifest
from lightprune.export.save import apply_umask, check_no_pickles
from lightprune.export.source import check_not_source, source_fingerprint
from lightprune.export.streamed_verify import verify_pruned_checkpoint
from lightprune.export.tokenizer_files import copy_generation_config, copy_tokenizer_files
from lightprune.export.verification import Verification
from lightprune.export.verify import check_written_finite
from lightprune.models import MoELayer, find_moe_layers

__all__ = ["prune_checkpoint"]


@dataclass(frozen=True)
class KeyRule:
    """What one checkpoint key becomes: ``out_key`` (None: dropped), and for a fused tensor the kept indices
    ``keep`` along dimension ``dim`` (None: written whole)."""

    out_key: str | None
    dim: int | None = None
    keep: tuple[int, ...] | None = None


def expert_dims(before: nn.Module, after: nn.Module) -> dict[str, int]:
    """{model tensor name: the dimension the surgery shrank} between a model and its pruned copy (meta device)."""
    old, new = before.state_dict(keep_vars=True), after.state_dict(keep_vars=True)
    if old.keys() != new.keys():
        gone, added = sorted(old.keys() - new.keys()), sorted(new.keys() - old.keys())
        raise ValueError(f"the surgery renamed tensors (gone {gone[:4]}, new {added[:4]}): experts held as separate "
                         "modules cannot be pruned shard by shard; load the model and use lp.export_pruned")
    dims = {}
    for name, tensor in old.items():
        if tensor.shape == new[name].shape:
            continue
        changed = [d for d, (a, b) in enumerate(zip(tensor.shape, new[name].shape, strict=True)) if a != b]
        if len(changed) != 1:
            raise ValueError(f"the surgery reshaped {name} from {list(tensor.shape)} to {list(new[name].shape)}: "
                             "more than one dimension")
        dims[name] = changed[0]
    return dims


def _layer_of(name: str, layers: list[MoELayer]) -> MoELayer:
    for layer in layers:
        if name.startswith(f"{layer.name}."):
            return layer
    raise ValueError(f"the surgery reshaped {name}, which is in no MoE block")


def _per_expert_by_name(layers: list[MoELayer]) -> dict[str, PerExpertTensor]:
    """{model tensor name: `PerExpertTensor`} of every MoE layer's per-expert tensors."""
    found = {}
    for layer in layers:
        paths = {id(module): path for path, module in layer.block.named_modules(remove_duplicate=False)}
        for tensor in per_expert_tensors(layer):
            found[".".join(part for part in (layer.name, paths[id(tensor.module)], tensor.name) if part)] = tensor
    return found


def key_rules(skeleton: Skeleton, dims: dict[str, int], plan: ExpertPlan) -> dict[str, KeyRule]:
    """{checkpoint key: `KeyRule`} for every key of the skeleton's checkpoint (see the module docstring)."""
    checkpoint, layers = skeleton.checkpoint, find_moe_layers(skeleton.model)
    own = skeleton.model.state_dict(keep_vars=True)
    per_expert = _per_expert_by_name(layers)
    rules = {}
    for key in checkpoint.keys():
        target, pattern = skeleton.targets.get(key, (None, None))
        if target not in dims:
            rules[key] = KeyRule(key)
            continue
        layer = _layer_of(target, layers)
        keep = tuple(plan.keep[layer.index])
        match = EXPERT_INDEX.search(key)
        if pattern is not None and "*" in pattern and match is not None:  # one expert's tensor
            index = int(match.group(1))
            rules[key] = KeyRule(key[:match.start(1)] + str(keep.index(index)) + key[match.end(1):]
                                 if index in keep else None)
            continue
        # the kept entries of the model's tensor: an expert's rows where it holds several, identity experts' rows
        found = per_expert.get(target)
        entries = keep if found is None else tuple(found.entries(layer, torch.tensor(keep)).tolist())
        if checkpoint.shape(key) == tuple(own[target].shape):  # the model's tensor as it is
            rules[key] = KeyRule(key, dims[target], entries)
        elif dims[target] == 0 and skeleton.concatenated_fused(key):  # a piece of a fused tensor (Step 3.7's gate)
            rules[key] = KeyRule(key, 0, keep)
        elif (stored := skeleton.stored_dim(key, dims[target], tuple(own[target].shape))) is not None:
            rules[key] = KeyRule(key, stored, entries)  # stored transposed (Ergo's router weight [H, E])
        else:
            raise ValueError(f"checkpoint {str(checkpoint.path)!r}: tensor {key!r} {list(checkpoint.shape(key))} "
                             f"becomes the model's {target} {list(own[target].shape)} through a conversion that is "
                             "not a per-expert merge: it cannot be pruned shard by shard")
    return rules


def stored_rules(checkpoint: Checkpoint, rules: dict[str, KeyRule]) -> dict[str, KeyRule]:
    """{stored key: `KeyRule`}: each logical key's rule applied to its stored parts (a quantized tensor's
    values and scales, named the logical key and a suffix): renamed alike, sliced along the experts' dimension alike
    when that is the first of a tensor of more than 2 dimensions (whole experts: their blocks and scales are
    theirs alone); a quantized tensor sliced otherwise (its experts' rows sharing scale blocks) is refused."""
    out = {}
    for key, rule in rules.items():
        parts = checkpoint.parts(key)
        if len(parts) > 1 and rule.dim is not None and (rule.dim != 0 or len(checkpoint.shape(key)) < 3):
            raise ValueError(f"checkpoint {str(checkpoint.path)!r}: {key!r} {list(checkpoint.shape(key))} is stored "
                             f"quantized and pruning slices its dimension {rule.dim} by expert, across its scale "
                             "blocks: it cannot be copied in its stored format; dequantize the checkpoint first")
        for part in parts:
            out[part] = KeyRule(None if rule.out_key is None else rule.out_key + part[len(key):], rule.dim, rule.keep)
    return out


def _out_shape(checkpoint: Checkpoint, key: str, rule: KeyRule) -> tuple[int, ...]:
    shape = list(checkpoint.stored_shape(key))
    if rule.dim is not None:
        shape[rule.dim] = len(rule.keep)
    return tuple(shape)


def _write_shard(checkpoint: Checkpoint, file: Path, rules: dict[str, KeyRule], out: Path) -> dict[str, int]:
    """Write one output shard from the stored tensors (``rules``: `stored_rules`, quantized values and scales
    copied as stored); returns {output key: bytes}. Each piece is checked finite before it is written
    (`check_written_finite`: a NaN or inf is refused naming the tensor, the expert),
    read through a window on the file's pages; a whole tensor and each kept expert's rows are then copied from file to
    file by the kernel (`SafetensorsWriter.copy`): this process reads each byte once and copies none."""
    keys = [key for key in checkpoint.stored_keys_in(file) if rules[key].out_key is not None]
    entries = [(rules[k].out_key, checkpoint.stored_dtype(k), _out_shape(checkpoint, k, rules[k])) for k in keys]
    sizes = {}
    where = f"prune_checkpoint of {str(checkpoint.path)!r}"
    with SafetensorsWriter(out / file.name, entries, metadata=checkpoint.metadata.get(file.name)) as writer:
        for key, (name, dtype, shape) in zip(keys, entries, strict=True):
            rule = rules[key]
            if rule.dim is None:
                check_written_finite(repr(key), checkpoint.mapped_rows(key), where)
                writer.copy(name, *checkpoint.stored_span(key))
            elif rule.dim == 0:  # one kept slice at a time
                for index in rule.keep:
                    rows = checkpoint.mapped_rows(key, index, index + 1)
                    check_written_finite(f"{key!r} (expert {index})", rows[0] if rows.dim() > 1 else rows, where)
                    del rows  # the window unmapped before the copy
                    writer.copy(name, *checkpoint.stored_span(key, index, index + 1))
            else:
                tensor = checkpoint.stored_tensor(key).index_select(rule.dim, torch.tensor(rule.keep))
                check_written_finite(f"{key!r} (the kept experts {list(rule.keep)} along dimension {rule.dim})",
                                     tensor, where)
                writer.write(name, tensor)
            sizes[name] = torch.empty((), dtype=dtype).element_size() * int(torch.Size(shape).numel())
    return sizes


def prune_checkpoint(src_dir: str | os.PathLike, plan: ExpertPlan, out_dir: str | os.PathLike, *,
                     overwrite: bool = False, verify: bool = True, atol: float | None = None,
                     probe_tokens: int = 16, seed: int = 0, progress: bool = True,
                     card: dict[str, Any] | None = None, quantize: str | None = None,
                     device: Any = "cpu") -> ExportResult:
    """Write the checkpoint at ``src_dir`` with the experts ``plan`` prunes removed to ``out_dir``, shard by
    shard (see the module docstring); returns an [`ExportResult`][...result.ExportResult] (the manifest's
    figures as attributes; ``os.PathLike`` and ``str``: the absolute output path).

    ``verify``: check the result layer by layer and with a sequential forward against the masked source
    (`lightprune.export.streamed_verify.verify_pruned_checkpoint`, tolerance ``atol + rtol * max|reference|``,
    ``atol`` default 1e-5 fp32, 1e-2 bf16/fp16, ``probe_tokens`` per probe, ``seed``, run on ``device``: the CPU or
    a GPU; ``atol`` and the plan checked once, `Verification`); a mismatch
    raises ``ExportVerificationError`` and writes nothing. A NaN or inf in a tensor it would write is refused naming it.
    ``overwrite``: replace an existing non-empty ``out_dir`` once the new one is complete. ``card``: extra manifest
    facts (``source``, ``command``). ``quantize="fp8"``: a float checkpoint's pruned copy, once verified, written FP8
    with 128x128 block scales (`quantize_staged`); a quantized checkpoint's
    keeps its own format. The output loads with ``lp.load_pruned`` (and with plain ``from_pretrained``
    when every layer keeps the same number of experts).
    """
    start = time.perf_counter()
    # the numbers before anything is read (NumPy's too; a bool, NaN or a fraction of a token refused)
    verification = Verification().check_atol(atol)
    seed = check_non_negative_int("seed", seed)
    probe_tokens = check_positive_int("probe_tokens", probe_tokens)
    quantize = check_quantize(quantize)
    device = streaming_device(device)
    check_plan_kind(plan, ExpertPlan, "prune_checkpoint", "a MergePlan merges experts, which prune_checkpoint does "
                    "not do shard by shard: load the model (lp.load_pruned(src_dir)) and run "
                    "lp.export_pruned(model, merge_plan, out_dir)")
    unknown = sorted(set(card or {}) - {"source", "command"})
    if unknown:
        raise ValueError(f"card has unknown keys {unknown}; prune_checkpoint takes 'source' and 'command'")
    checkpoint_directory(Path(src_dir).expanduser())  # a file, a broken link, a name that is not UTF-8: said first
    check_path_text(out_dir, "output directory")
    src = Path(src_dir).expanduser().absolute()
    check_not_source(out_dir, src)
    with Checkpoint(src) as checkpoint:
        if quantize and checkpoint.quantization is not None:
            raise ValueError(f"checkpoint {str(src)!r} is stored quantized (quant_method "
                             f"{checkpoint.quantization.method!r}): its pruned copy keeps that format; leave quantize "
                             "unset")
        skeleton = Skeleton(checkpoint, mtp=True)
        layers = find_moe_layers(skeleton.model)
        plan, mtp = plan_with_mtp(skeleton, plan, layers)
        ignores = _renumbered_ignores(checkpoint, plan)  # an ignore pattern naming experts by number: refused now
        plan.check_layers(layers)  # every MoE layer, counts and floors: before anything is written
        _check_stored_routing(skeleton, layers)
        pruned = copy.deepcopy(skeleton.model)
        prune_experts(pruned, plan, layers=find_moe_layers(pruned))  # the plan checked above
        counts = {layer.index: layer.num_experts for layer in find_moe_layers(pruned)}
        uniform = len(set(counts.values())) == 1
        counts = {index: count for index, count in counts.items() if index not in skeleton.built_mtp_layers}
        config_without_mtp(pruned.config, checkpoint.config, skeleton.built_mtp_layers)
        rules = stored_rules(checkpoint, key_rules(skeleton, expert_dims(skeleton.model, pruned), plan))
        with staging_dir(out_dir, overwrite) as tmp:
            weight_map: dict[str, str] = {}
            total = 0
            for file in tqdm(checkpoint.files, desc=f"pruning {src.name}", unit="shard", leave=False,
                             disable=not progress):
                sizes = _write_shard(checkpoint, file, rules, tmp)
                weight_map.update({name: file.name for name in sizes})
                total += sum(sizes.values())
            if checkpoint.sharded:
                index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
                (tmp / SAFE_INDEX).write_text(json.dumps(index, indent=2) + "\n")
            if ignores:
                pruned.config.quantization_config = {**checkpoint.raw_config["quantization_config"], **ignores}
            pruned.config.save_pretrained(tmp)
            finish_config(tmp, pruned, uniform)
            tokenizer = copy_tokenizer_files(src, tmp)
            copy_generation_config(src, tmp)
            check_no_pickles(tmp)
            verified = verify_pruned_checkpoint(checkpoint, plan, tmp, probe_tokens=probe_tokens, seed=seed,
                                                progress=progress, device=device,
                                                verification=verification) if verify else None
            quantized = quantize_staged(tmp, progress=progress) if quantize else None
            manifest = _write_manifest(tmp, skeleton, pruned, plan, counts, total, tokenizer, verified, card,
                                       mtp, quantized)
            apply_umask(tmp)
    return ExportResult.from_manifest(out_dir, manifest, time.perf_counter() - start)


def plan_with_mtp(skeleton: Skeleton, plan: ExpertPlan, layers: list[MoELayer]) -> tuple[ExpertPlan, dict[str, Any]]:
    """``plan`` with the checkpoint's multi-token-prediction layers (`lightprune.checkpoints.mtp`) in it, and
    what the manifest says of them ({layer: kept ids, chosen by}). Each MTP layer keeps as many experts as the
    written config names for a layer (the plan's count when it is uniform, its largest otherwise), so the MTP
    layer's tensors agree with the config: the plan's own ids for a layer it names (refused at another count), else
    the experts its own weights rank first by AIMER ("AIMER: Calibration-Free Task-Agnostic MoE Pruning", arXiv
    2603.18492, section 4.2): a calibration run does not reach the MTP layer, and the ids of another layer name other
    experts."""
    mtp = [layer for layer in layers if layer.index in skeleton.built_mtp_layers]
    named = [len(ids) for index, ids in plan.keep.items() if index not in skeleton.built_mtp_layers]
    if not mtp or not named:
        return plan, {}
    target = max(named)
    keep, counts, record = dict(plan.keep), dict(plan.num_experts), {}
    for layer in mtp:
        if layer.index in plan.keep:
            if len(plan.keep[layer.index]) != target:
                raise PlanError(f"plan keeps {len(plan.keep[layer.index])} experts in multi-token-prediction layer "
                                f"{layer.index}, the written config names {target} for it (the model's layers' "
                                f"{'count' if len(set(named)) == 1 else 'largest count'}): keep {target} there")
            record[str(layer.index)] = {"kept": list(plan.keep[layer.index]), "chosen_by": "the plan"}
            continue
        with skeleton.resident(layer.name):
            importance = AIMER().importance(AIMER().score_layer(layer))
        chosen = select_experts({layer.index: importance}, None, n_per_layer=layer.num_experts - target,
                                limits={layer.index: layer.limits}, criterion="aimer")
        keep[layer.index], counts[layer.index] = chosen.keep[layer.index], layer.num_experts
        record[str(layer.index)] = {"kept": list(chosen.keep[layer.index]),
                                    "chosen_by": "aimer (its weights: the plan does not name the layer)"}
    return ExpertPlan(keep=keep, num_experts=counts, criterion=plan.criterion, ratio=plan.ratio,
                      allocation=plan.allocation, metadata=plan.metadata), record


def _renumbered_ignores(checkpoint: Checkpoint, plan: ExpertPlan) -> dict[str, list[str]]:
    """The source's quantization ignore lists (``modules_to_not_convert``, compressed-tensors' ``ignore``) as the
    pruned checkpoint's config writes them: entries naming single experts renumbered as the plan keeps them
    (`renumbered_ignores`; a pattern it cannot follow refused before anything is written)."""
    quantization = checkpoint.raw_config.get("quantization_config")
    if not isinstance(quantization, dict):
        return {}
    count = getattr(checkpoint.config, "num_hidden_layers", 0)
    return {name: renumbered_ignores(found, plan.keep, count) for name in ("modules_to_not_convert", "ignore")
            if isinstance(found := quantization.get(name), list)}


def _check_stored_routing(skeleton: Skeleton, layers: list[MoELayer]) -> None:
    """Refuse a NaN or inf in a tensor a layer's routing reads, as stored, before anything is written: each layer's
    routing tensors (`MoEFamily.routing_tensors`) are read in alone and checked by `check_routing`, the
    refusal of [`prune_experts`][] on the loaded model, word for word but for the entry point's name."""
    for layer in layers:
        with skeleton.resident_tensors(*(found.name for found in layer.family.routing_tensors(layer))):
            check_routing([layer], "prune_checkpoint")


def _write_manifest(tmp: Path, skeleton: Skeleton, pruned: nn.Module, plan: ExpertPlan, counts: dict[int, int],
                    total: int, tokenizer: list[str], verification: dict[str, Any] | None,
                    card: dict[str, Any] | None, mtp: dict[str, Any],
                    quantized: dict[str, Any] | None) -> dict[str, Any]:
    card, checkpoint = dict(card or {}), skeleton.checkpoint
    extra = {"mtp_layers": mtp} if mtp else {}
    if mtp:  # the plan of the model's layers; the MTP layers' entries are "mtp_layers"
        plan = ExpertPlan(keep={i: ids for i, ids in plan.keep.items() if str(i) not in mtp},
                          num_experts={i: n for i, n in plan.num_experts.items() if str(i) not in mtp},
                          criterion=plan.criterion, ratio=plan.ratio, allocation=plan.allocation,
                          metadata=plan.metadata)
    if checkpoint.quantization is not None:
        extra["quantization"] = {**checkpoint.quantization.record(), "stored_as": "copied from the source"}
    elif quantized is not None:
        extra["quantization"] = quantized
    return write_manifest(tmp, pruned, counts, parameters=sum(p.numel() for p in pruned.parameters()),
                          parameter_bytes=total, dtype=skeleton.dtype, verification=verification,
                          source=card.get("source", str(checkpoint.path)),
                          fingerprint=source_fingerprint(checkpoint.path), plan=plan_record(plan),
                          tokenizer={"origin": "source_dir", "files": tokenizer} if tokenizer else None,
                          parameters_before=sum(p.numel() for p in skeleton.model.parameters()),
                          parameter_bytes_before=checkpoint.total_bytes, command=card.get("command"),
                          written_by="prune_checkpoint", copied_without_model_tensor=sorted(skeleton.unmatched),
                          **extra)
