"""Save a structurally pruned model as a verified safetensors checkpoint: [`save_pruned`][].

Before anything is written, every tensor the checkpoint would store is checked finite (`non_finite_tensors`: a NaN or
inf is refused naming the tensor and, in a fused experts tensor, the expert), and so are the reference logits
(`check_reference_finite`: the model's own NaN logits name the model, not the export, as the culprit).

Steps, all inside a staging directory renamed into place only at the end (`staging`):

1. ``save_pretrained`` (safetensors, transformers' on-disk per-expert layout);
2. the tokenizer: the given ``processor`` (``save_pretrained``), or else the tokenizer, processor and
   chat-template files of the source checkpoint directory (``source_dir``, by default
   ``config._name_or_path`` when that is a local directory), copied by name
   (`TOKENIZER_FILES`; never weights, never code; a foreign ``auto_map`` in
   a copied JSON file is dropped with the code it points at); ``generation_config.json`` from the source when
   ``save_pretrained`` wrote none.
   Neither a processor nor tokenizer files: none is invented (the manifest says ``"tokenizer": null``).
   Such a name in the source that is no regular file (a directory, a broken symlink, a special file) is refused
   before anything is written (`resolve_source_dir`), never skipped;
3. config.json: ``architectures`` names the stock transformers class; for a non-uniform model
   (``config.lightprune_experts_per_layer``) the generated ``modeling_lightprune.py`` and its
   ``auto_map`` entry are added (`remote_code`), for a uniform one both are absent. Any other
   ``auto_map`` entry (remote code of the source that is not lightprune's) is dropped: the export
   does not carry that code. Experts transformers' default ``grouped_mm`` kernel cannot run (float64, rows
   off 16 bytes) get ``"experts_implementation": "eager"``, which a plain ``from_pretrained`` reads
   (`finish_config`);
4. verification: reload through [`load_pruned`][] (and, non-uniform, also through transformers'
   ``trust_remote_code=True``), run the probe batch, compare with the reference logits (`verify_reloaded`, the export's
   one `Verification`); a mismatch raises [`ExportVerificationError`][];
5. ``lightprune_export.json`` (`result.write_manifest`): per-layer expert counts, parameter count
   and bytes, bytes on disk, dtype, the verification result, and what the export came from: the source and
   the fingerprint of its safetensors files (name, size, SHA-256 of the header: `source`), the plan, the
   tokenizer's origin, the evaluation, the lightprune version and the command (`card_facts`);
6. ``README.md``: the model card rendered from the manifest (`model_card.model_card`);
7. file modes: every file ``0o666 & ~umask``, every directory ``0o777 & ~umask`` (transformers
   writes the weights ``0o600``).

An output directory that is the source checkpoint directory, or holds it, is refused before
anything is written: replacing it would delete the source. The call returns an
[`ExportResult`][..result.ExportResult] made from the manifest it wrote (``os.PathLike``: the
checkpoint path). [`save_pruned`][] checks its inputs and calls `write_pruned`, which
[`export_pruned`][..pipeline.export_pruned] calls with inputs it has checked itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightprune.checkpoints.staging import staging_dir
from lightprune.core.notices import quiet_progress
from lightprune.core.paths import check_path_text
from lightprune.experts.mask import is_masked
from lightprune.export.card_facts import card_facts
from lightprune.export.config_file import finish_config, weights_dtype
from lightprune.export.result import ExportResult, write_manifest
from lightprune.export.source import check_not_source, resolve_source_dir, source_fingerprint
from lightprune.export.tokenizer_files import copy_generation_config, write_tokenizer
from lightprune.export.verification import (
    Verification,
    check_reference_finite,
    non_finite_tensors,
    verify_reloaded,
)
from lightprune.export.verify import ExportVerificationError, model_logits, non_finite
from lightprune.models import find_moe_layers, get_family

__all__ = ["save_pruned"]

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def parameter_count(model: nn.Module) -> int:
    """Number of parameters (tied parameters counted once)."""
    return sum(p.numel() for p in model.parameters())


def tensor_bytes(model: nn.Module) -> int:
    """Bytes of what a checkpoint stores: parameters and persistent buffers, each tensor once."""
    tensors: dict[int, torch.Tensor] = {id(p): p for p in model.parameters()}
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None and name not in module._non_persistent_buffers_set:
                tensors[id(buf)] = buf
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _device(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def apply_umask(root: Path) -> None:
    """Every file under ``root`` to ``0o666 & ~umask``, every directory (``root`` too) to ``0o777 & ~umask``."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(root, 0o777 & ~umask)
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o777 & ~umask)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o666 & ~umask)


def check_no_pickles(tmp: Path) -> None:
    pickles = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
        raise RuntimeError(f"export wrote pickle files {pickles}; lightprune exports safetensors only")


def save_pruned(model: nn.Module, out_dir: str | os.PathLike, *, probe: Mapping[str, Any] | None = None,
                reference_logits: torch.Tensor | None = None, atol: float | None = None, overwrite: bool = False,
                processor: Any = None, max_shard_size: int | str | None = None,
                source_dir: str | os.PathLike | None = None, card: Mapping[str, Any] | None = None) -> ExportResult:
    """Write ``model`` (already pruned in place) to ``out_dir`` as a verified safetensors checkpoint.

    Args:
        model: a transformers MoE model of a supported family (not inside ``mask_experts``).
        out_dir: the checkpoint directory; must not exist or be empty unless ``overwrite``; never
            the source checkpoint directory nor one holding it (``ValueError``).
        probe: keyword batch for the verification forward (default: [`default_probe`][...verify.default_probe]).
        reference_logits: the logits the reloaded checkpoint must reproduce on ``probe``
            (default: ``model``'s own).
        atol: the absolute term of the tolerance ``atol + rtol * max|reference|`` (default 1e-5 fp32, 1e-2
            bf16/fp16; ``rtol``: `default_rtol`).
        overwrite: replace an existing non-empty ``out_dir`` (only once the new one is verified).
        processor: a tokenizer / processor saved into the checkpoint too (``save_pretrained``);
            without one the tokenizer files are copied from the source directory.
        max_shard_size: passed to ``save_pretrained`` (default: transformers' own).
        source_dir: the local checkpoint directory ``model`` was loaded from: its tokenizer files
            are copied, its safetensors headers fingerprinted (default: ``config._name_or_path``
            when that is an existing directory; none otherwise).
        card: facts for the model card and the manifest, keys `CARD_KEYS`: ``plan``
            (the ExpertPlan the model was pruned with, or its ``to_dict()``), ``source`` (a name
            for the source; default: the source directory or ``config._name_or_path``),
            ``command`` (default: ``" ".join(sys.argv)``), ``evaluation`` (a JSON mapping),
            ``parameters_before`` and ``parameter_bytes_before`` (of the unpruned model).

    The reloaded copies run on ``model``'s device. Returns an [`ExportResult`][...result.ExportResult]
    (the manifest's figures as attributes; ``os.PathLike`` and ``str``: the absolute checkpoint path).
    Raises [`ExportVerificationError`][] (leaving ``out_dir`` untouched) on a mismatch.
    """
    start = time.perf_counter()
    check_path_text(out_dir, "output directory")
    verification = Verification(probe).check_atol(atol)  # NaN would switch verification off: refused
    if is_masked(model):
        raise ValueError("save_pruned got a model inside mask_experts: masking is not saved; "
                         "call prune_experts(model, plan) first (or use export_pruned)")
    source = resolve_source_dir(model, source_dir)
    check_not_source(out_dir, source)
    get_family(model)  # an unsupported model is named before anything else
    counts = {layer.index: layer.num_experts for layer in find_moe_layers(model)}
    facts = card_facts(card, counts)
    return write_pruned(model, out_dir, counts, source=source, facts=facts, fingerprint=source_fingerprint(source),
                        verification=verification, reference_logits=reference_logits, overwrite=overwrite,
                        processor=processor, max_shard_size=max_shard_size, start=start, where="save_pruned")


def write_pruned(model: nn.Module, out_dir: str | os.PathLike, counts: Mapping[int, int], *, source: Path | None,
                 facts: Mapping[str, Any], fingerprint: list[dict[str, Any]] | None, verification: Verification,
                 reference_logits: torch.Tensor | None, overwrite: bool, processor: Any,
                 max_shard_size: int | str | None, start: float, where: str,
                 expert_ids: Mapping[int, Sequence[int]] | None = None,
                 after_verify: Callable[[Path], dict[str, Any]] | None = None) -> ExportResult:
    """Steps 1-7 of the module docstring for ``model`` (pruned, ``counts`` routed experts per layer), its inputs
    checked by the caller: ``source`` (`resolve_source_dir`, not ``out_dir`` nor
    inside it), ``facts`` (`card_facts`), ``fingerprint``
    (`source_fingerprint` of ``source``), ``verification`` (the export's one
    `Verification`: its ``atol`` checked; the probe and the restored fp32
    buffers are its own, built here unless the caller's steps did already). ``where`` (the caller's name) begins each
    error; ``expert_ids`` ({layer: the ids the plan kept}) names a non-finite expert by the id it had before pruning
    (`non_finite_tensors`); ``after_verify(staged directory)``, when given, runs
    once the staged checkpoint is verified and returns the manifest's ``quantization`` entry (a prune-then-quantize
    export). The other arguments are [`save_pruned`][]'s; the result's ``seconds`` count from ``start``
    (``time.perf_counter()``)."""
    get_family(model).set_expert_counts(dict(counts))
    uniform = len(set(counts.values())) == 1
    broken = non_finite_tensors(model, expert_ids)  # one isfinite per tensor, before anything is written
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        raise ValueError(f"{where}: tensor {broken[0]}{more}: the export would carry it (a broken weight); "
                         "nothing was written; restore the weights, or prune the expert that holds it")
    probe = verification.probe_for(model)
    verification.restore_buffers(model)  # cast with .to(bf16): rotary inv_freq back in fp32, as the checkpoint reloads
    if reference_logits is None:
        reference_logits = model_logits(model, probe)
        check_reference_finite(model, reference_logits, where, "the model to be written")
    elif non_finite(reference_logits) is not None:
        raise ExportVerificationError(f"{where}: reference_logits hold {non_finite(reference_logits)}: nothing "
                                      "could be verified against them; nothing was written")
    dtype, device = weights_dtype(model), _device(model)
    with staging_dir(out_dir, overwrite) as tmp:
        with quiet_progress():  # lightprune's own save: the summary reports it
            model.save_pretrained(tmp, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
        tokenizer = write_tokenizer(tmp, processor, source)
        copy_generation_config(source, tmp)
        dropped_mtp = finish_config(tmp, model, uniform)
        check_no_pickles(tmp)
        with quiet_progress():  # the verification's reloads
            diffs = verify_reloaded(tmp, verification, model, reference_logits, dtype, device, not uniform)
        worst = max(diffs.values(), key=lambda c: c.max_abs_diff)
        extra = {"quantization": after_verify(tmp)} if after_verify is not None else {}
        if dropped_mtp:
            extra["mtp_layers"] = ("not written: the model in memory does not hold the source's multi-token-prediction "
                                   "layers (config.json's num_nextn_predict_layers set to 0); lp.prune_checkpoint of "
                                   "the source directory prunes them with the model")
        manifest = write_manifest(
            tmp, model, counts, parameters=parameter_count(model), parameter_bytes=tensor_bytes(model), dtype=dtype,
            verification={**worst.record(), "loaders": {k: v.max_abs_diff for k, v in diffs.items()},
                          "probe_shapes": {k: list(v.shape) for k, v in probe.items() if isinstance(v, torch.Tensor)}},
            source=facts["source"] if facts["source"] is not None else (
                str(source) if source is not None else (getattr(model.config, "_name_or_path", "") or None)),
            fingerprint=fingerprint, plan=facts["plan"], tokenizer=tokenizer, evaluation=facts["evaluation"],
            parameters_before=facts["parameters_before"], parameter_bytes_before=facts["parameter_bytes_before"],
            command=facts["command"], **extra)
        apply_umask(tmp)
    return ExportResult.from_manifest(out_dir, manifest, time.perf_counter() - start)
