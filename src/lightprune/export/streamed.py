"""Prune a checkpoint directory shard by shard, without loading the model: :func:`prune_checkpoint`.

Which tensors index experts, and along which dimension, is not guessed from names: the plan's surgery
(:func:`lightprune.experts.prune_experts`) runs on the checkpoint's model on the meta device, and the tensors it
reshapes are the ones to cut (router rows and biases, fused expert tensors, a family's per-expert router or block
tensors), in the model's names. Each checkpoint key is mapped to its model tensor through transformers' own
conversion mapping (:class:`~lightprune.checkpoints.skeleton.Skeleton`); then, per key:

- a per-expert key (``...experts.<n>.<name>``, what transformers' ``save_pretrained`` writes) of a pruned layer:
  kept experts are written under their new index (their rank among the kept ones), the others are dropped;
- a fused key (``...experts.gate_up_proj``, a router ``weight``): the kept slices along the experts' dimension,
  read and written one expert at a time when that dimension is the first; a whole fused tensor that transformers
  concatenates with others along a later dimension (Step 3.7's ``gate_proj`` and ``up_proj`` into ``gate_up_proj``)
  the same way, by its own first dimension; a tensor stored transposed (Ergo's router weight, [H, E]) along the
  stored tensor's experts' dimension;
- anything else, and any key the model has no tensor for (a DeepSeek-V3 multi-token-prediction layer): copied
  unchanged.

Each output shard keeps its source's name; its header is written first and its tensors follow one at a time
(:class:`~lightprune.checkpoints.writer.SafetensorsWriter`), so memory holds a tensor (an expert of a fused one), never
a shard. config.json comes from the pruned meta model (the expert counts, ``lightprune_experts_per_layer`` and the
generated ``modeling_lightprune.py`` when they differ per layer, as :func:`save_pruned` writes them), the shard
index is rewritten, the tokenizer / processor / chat-template files and ``generation_config.json`` come along.
Before anything is written, every tensor a layer's routing reads (router rows and biases, correction biases,
per-expert scales, a router's norm) is read in alone and refused when it holds a NaN or inf, as
:func:`~lightprune.experts.prune_experts` refuses it in memory; every tensor is checked finite as it is written (a
NaN or inf refused naming the tensor and the expert). Everything is written into a staging directory renamed
into place only after verification
(:mod:`lightprune.export.streamed_verify`): a failure or a kill leaves a previous ``out_dir`` as it was.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from lightprune.checkpoints.directory import SAFE_INDEX, checkpoint_directory
from lightprune.checkpoints.reader import Checkpoint
from lightprune.checkpoints.skeleton import EXPERT_INDEX, Skeleton
from lightprune.checkpoints.staging import staging_dir
from lightprune.checkpoints.writer import SafetensorsWriter
from lightprune.core.checks import check_atol, check_non_negative_int, check_positive_int
from lightprune.core.paths import check_path_text
from lightprune.experts.plan import ExpertPlan
from lightprune.experts.plan_base import check_plan_kind
from lightprune.experts.prune import check_routing, prune_experts
from lightprune.export.result import ExportResult, write_manifest
from lightprune.export.save import (
    GENERATION_FILE,
    apply_umask,
    check_no_pickles,
    check_not_source,
    copy_tokenizer_files,
    finish_config,
    plan_record,
    source_fingerprint,
)
from lightprune.export.streamed_verify import verify_pruned_checkpoint
from lightprune.export.verify import check_written_finite
from lightprune.models import MoELayer, find_moe_layers

__all__ = ["prune_checkpoint", "expert_dims", "KeyRule"]


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


def key_rules(skeleton: Skeleton, dims: dict[str, int], plan: ExpertPlan) -> dict[str, KeyRule]:
    """{checkpoint key: :class:`KeyRule`} for every key of the skeleton's checkpoint (see the module docstring)."""
    checkpoint, layers = skeleton.checkpoint, find_moe_layers(skeleton.model)
    own = skeleton.model.state_dict(keep_vars=True)
    rules = {}
    for key in checkpoint.keys():
        target, pattern = skeleton.targets.get(key, (None, None))
        if target not in dims:
            rules[key] = KeyRule(key)
            continue
        keep = tuple(plan.keep[_layer_of(target, layers).index])
        match = EXPERT_INDEX.search(key)
        if pattern is not None and "*" in pattern and match is not None:  # one expert's tensor
            index = int(match.group(1))
            rules[key] = KeyRule(key[:match.start(1)] + str(keep.index(index)) + key[match.end(1):]
                                 if index in keep else None)
        elif checkpoint.shape(key) == tuple(own[target].shape):  # the model's tensor as it is
            rules[key] = KeyRule(key, dims[target], keep)
        elif dims[target] == 0 and skeleton.concatenated_fused(key):  # a piece of a fused tensor (Step 3.7's gate)
            rules[key] = KeyRule(key, 0, keep)
        elif (stored := skeleton.stored_dim(key, dims[target], tuple(own[target].shape))) is not None:
            rules[key] = KeyRule(key, stored, keep)  # stored transposed (Ergo's router weight [H, E])
        else:
            raise ValueError(f"checkpoint {str(checkpoint.path)!r}: tensor {key!r} {list(checkpoint.shape(key))} "
                             f"becomes the model's {target} {list(own[target].shape)} through a conversion that is "
                             "not a per-expert merge: it cannot be pruned shard by shard")
    return rules


def _out_shape(checkpoint: Checkpoint, key: str, rule: KeyRule) -> tuple[int, ...]:
    shape = list(checkpoint.shape(key))
    if rule.dim is not None:
        shape[rule.dim] = len(rule.keep)
    return tuple(shape)


def _write_shard(checkpoint: Checkpoint, file: Path, rules: dict[str, KeyRule], out: Path) -> dict[str, int]:
    """Write one output shard; returns {output key: bytes}. Each piece is checked finite as it is written
    (:func:`~lightprune.export.verify.check_written_finite`: a NaN or inf is refused naming the tensor, the expert)."""
    keys = [key for key in checkpoint.keys_in(file) if rules[key].out_key is not None]
    entries = [(rules[k].out_key, checkpoint.dtype(k), _out_shape(checkpoint, k, rules[k])) for k in keys]
    sizes = {}
    where = f"prune_checkpoint of {str(checkpoint.path)!r}"
    with SafetensorsWriter(out / file.name, entries, metadata=checkpoint.metadata.get(file.name)) as writer:
        for key, (name, dtype, shape) in zip(keys, entries, strict=True):
            rule = rules[key]
            if rule.dim is None:
                tensor = checkpoint.tensor(key)
                check_written_finite(repr(key), tensor, where)
                writer.write(name, tensor)
            elif rule.dim == 0:  # one kept slice at a time
                for index in rule.keep:
                    rows = checkpoint.rows(key, index, index + 1)
                    check_written_finite(f"{key!r} (expert {index})", rows[0] if rows.dim() > 1 else rows, where)
                    writer.write(name, rows)
            else:
                tensor = checkpoint.tensor(key).index_select(rule.dim, torch.tensor(rule.keep))
                check_written_finite(f"{key!r} (the kept experts {list(rule.keep)} along dimension {rule.dim})",
                                     tensor, where)
                writer.write(name, tensor)
            sizes[name] = torch.empty((), dtype=dtype).element_size() * int(torch.Size(shape).numel())
    return sizes


def prune_checkpoint(src_dir: str | os.PathLike, plan: ExpertPlan, out_dir: str | os.PathLike, *,
                     overwrite: bool = False, verify: bool = True, atol: float | None = None,
                     probe_tokens: int = 16, seed: int = 0, progress: bool = True,
                     card: dict[str, Any] | None = None) -> ExportResult:
    """Write the checkpoint at ``src_dir`` with the experts ``plan`` prunes removed to ``out_dir``, shard by
    shard (see the module docstring); returns an :class:`~lightprune.export.result.ExportResult` (the manifest's
    figures as attributes; ``os.PathLike`` and ``str``: the absolute output path, as the ``Path`` this returned
    before 0.2, whose other behaviour is deprecated there).

    ``verify``: check the result layer by layer and with a sequential forward against the masked source
    (:func:`lightprune.export.streamed_verify.verify_pruned_checkpoint`, tolerance ``atol + rtol * max|reference|``,
    ``atol`` default 1e-5 fp32, 1e-2 bf16/fp16, ``probe_tokens`` per probe, ``seed``); a mismatch raises
    ``ExportVerificationError`` and writes nothing. A NaN or inf in a tensor it would write is refused naming it.
    ``overwrite``: replace an existing non-empty ``out_dir`` once the new one is complete. ``card``: extra manifest
    facts (``source``, ``command``). The output loads with ``lp.load_pruned`` (and with plain ``from_pretrained``
    when every layer keeps the same number of experts).
    """
    start = time.perf_counter()
    # the numbers before anything is read (NumPy's too; a bool, NaN or a fraction of a token refused)
    atol, seed = check_atol(atol), check_non_negative_int("seed", seed)
    probe_tokens = check_positive_int("probe_tokens", probe_tokens)
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
        skeleton = Skeleton(checkpoint)
        layers = find_moe_layers(skeleton.model)
        plan.check_layers(layers)  # every MoE layer, counts and floors: before anything is written
        _check_stored_routing(skeleton, layers)
        pruned = prune_experts(copy.deepcopy(skeleton.model), plan)
        counts = {layer.index: layer.num_experts for layer in find_moe_layers(pruned)}
        rules = key_rules(skeleton, expert_dims(skeleton.model, pruned), plan)
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
            pruned.config.save_pretrained(tmp)
            finish_config(tmp, pruned, len(set(counts.values())) == 1)
            tokenizer = copy_tokenizer_files(src, tmp)
            if (src / GENERATION_FILE).is_file():
                shutil.copyfile(src / GENERATION_FILE, tmp / GENERATION_FILE)
            check_no_pickles(tmp)
            verification = verify_pruned_checkpoint(checkpoint, plan, tmp, atol=atol, probe_tokens=probe_tokens,
                                                    seed=seed, progress=progress) if verify else None
            manifest = _write_manifest(tmp, skeleton, pruned, plan, counts, total, tokenizer, verification, card)
            apply_umask(tmp)
    return ExportResult.from_manifest(out_dir, manifest, time.perf_counter() - start)


def _check_stored_routing(skeleton: Skeleton, layers: list[MoELayer]) -> None:
    """Refuse a NaN or inf in a tensor a layer's routing reads, as stored, before anything is written: each layer's
    routing tensors (:meth:`MoEFamily.routing_tensors`) are read in alone and checked by :func:`check_routing`, the
    refusal of :func:`prune_experts` on the loaded model, word for word but for the entry point's name."""
    for layer in layers:
        with skeleton.resident_tensors(*(found.name for found in layer.family.routing_tensors(layer))):
            check_routing([layer], "prune_checkpoint")


def _write_manifest(tmp: Path, skeleton: Skeleton, pruned: nn.Module, plan: ExpertPlan, counts: dict[int, int],
                    total: int, tokenizer: list[str], verification: dict[str, Any] | None,
                    card: dict[str, Any] | None) -> dict[str, Any]:
    card, checkpoint = dict(card or {}), skeleton.checkpoint
    return write_manifest(tmp, pruned, counts, parameters=sum(p.numel() for p in pruned.parameters()),
                          parameter_bytes=total, dtype=skeleton.dtype, verification=verification,
                          source=card.get("source", str(checkpoint.path)),
                          fingerprint=source_fingerprint(checkpoint.path), plan=plan_record(plan),
                          tokenizer={"origin": "source_dir", "files": tokenizer} if tokenizer else None,
                          parameters_before=sum(p.numel() for p in skeleton.model.parameters()),
                          parameter_bytes_before=checkpoint.total_bytes, command=card.get("command"),
                          written_by="prune_checkpoint", copied_without_model_tensor=sorted(skeleton.unmatched))
