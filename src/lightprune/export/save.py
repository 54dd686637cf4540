"""Save a structurally pruned model as a verified safetensors checkpoint: :func:`save_pruned`.

Before anything is written, every tensor the checkpoint would store is checked finite (:func:`non_finite_tensors`:
a NaN or inf is refused naming the tensor and, in a fused experts tensor, the expert), and so are the reference
logits (:func:`check_reference_finite`: the model's own NaN logits name the model, not the export, as the culprit).

Steps, all inside a staging directory renamed into place only at the end (:mod:`.staging`):

1. ``save_pretrained`` (safetensors, transformers' on-disk per-expert layout);
2. the tokenizer: the given ``processor`` (``save_pretrained``), or else the tokenizer, processor and
   chat-template files of the source checkpoint directory (``source_dir``, by default
   ``config._name_or_path`` when that is a local directory), copied by name (:data:`TOKENIZER_FILES`;
   never weights, never code; a foreign ``auto_map`` in a copied JSON file is dropped with the code
   it points at); ``generation_config.json`` from the source when ``save_pretrained`` wrote none.
   Neither a processor nor tokenizer files: none is invented (the manifest says ``"tokenizer": null``).
   Such a name in the source that is no regular file (a directory, a broken symlink, a special file) is refused
   before anything is written (:func:`resolve_source_dir`), never skipped;
3. config.json: ``architectures`` names the stock transformers class; for a non-uniform model
   (``config.lightprune_experts_per_layer``) the generated ``modeling_lightprune.py`` and its
   ``auto_map`` entry are added (:mod:`.remote_code`), for a uniform one both are absent. Any other
   ``auto_map`` entry (remote code of the source that is not lightprune's) is dropped: the export
   does not carry that code. Experts transformers' default ``grouped_mm`` kernel cannot run (float64, rows
   off 16 bytes) get ``"experts_implementation": "eager"``, which a plain ``from_pretrained`` reads
   (:func:`~lightprune.export.config_file.finish_config`);
4. verification: reload through :func:`load_pruned` (and, non-uniform, also through
   transformers' ``trust_remote_code=True``), run the probe batch, compare with the reference
   logits (:mod:`.verify`); a mismatch raises :class:`ExportVerificationError`;
5. ``lightprune_export.json`` (:func:`.result.write_manifest`): per-layer expert counts, parameter count
   and bytes, bytes on disk, dtype, the verification result, and what the export came from: the source and
   the fingerprint of its safetensors files (name, size, SHA-256 of the header), the plan, the
   tokenizer's origin, the evaluation, the lightprune version and the command;
6. ``README.md``: the model card rendered from the manifest (:func:`.model_card.model_card`);
7. file modes: every file ``0o666 & ~umask``, every directory ``0o777 & ~umask`` (transformers
   writes the weights ``0o600``).

An output directory that is the source checkpoint directory, or holds it, is refused before
anything is written: replacing it would delete the source. The call returns an
:class:`~lightprune.export.result.ExportResult` made from the manifest it wrote (``os.PathLike``: the
checkpoint path). :func:`save_pruned` checks its inputs and calls :func:`write_pruned`, which
:func:`~lightprune.export.export_pruned` calls with inputs it has checked itself.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightprune.checkpoints.directory import GENERATION_FILE, TOKENIZER_FILES, copied_files, weight_files
from lightprune.checkpoints.header import header_bytes
from lightprune.checkpoints.staging import TMP_TAG, staging_dir
from lightprune.core.checks import check_atol, check_utf8
from lightprune.core.paths import check_path_text
from lightprune.core.jsonio import parse_json
from lightprune.core.notices import quiet_progress
from lightprune.experts.mask import is_masked
from lightprune.experts.plan import ExpertPlan
from lightprune.export.config_file import finish_config, weights_dtype
from lightprune.export.load import load_pruned
from lightprune.export.result import MANIFEST_FILE, ExportResult, write_manifest
from lightprune.export.verify import (
    BROKEN_SOURCE,
    Comparison,
    ExportVerificationError,
    compare,
    default_atol,
    default_probe,
    default_rtol,
    model_logits,
    non_finite,
    restore_fp32_buffers,
)
from lightprune.models import find_moe_layers, get_family

__all__ = ["save_pruned", "write_pruned", "parameter_count", "tensor_bytes", "MANIFEST_FILE", "TOKENIZER_FILES",
           "CARD_KEYS", "resolve_source_dir", "check_not_source", "source_fingerprint", "card_facts", "plan_record",
           "copy_tokenizer_files", "apply_umask", "check_no_pickles", "GENERATION_FILE",
           "write_manifest", "non_finite_tensors", "check_reference_finite"]

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")

#: the keys ``save_pruned(card=...)`` accepts
CARD_KEYS = ("plan", "source", "command", "evaluation", "parameters_before", "parameter_bytes_before")


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


# ----------------------------------------------------------------------------------- source checkpoint
def resolve_source_dir(model: nn.Module, source_dir: str | os.PathLike | None) -> Path | None:
    """The source checkpoint directory: ``source_dir`` (must be a directory), else ``config._name_or_path``
    when that is an existing local directory, else ``None``. A file the export would copy from it that is no regular
    file (a directory, a broken symlink, a special file) is refused here, before anything is written
    (:func:`~lightprune.checkpoints.directory.copied_files`)."""
    path = None
    if source_dir is not None:
        check_path_text(source_dir, "source_dir")
        path = Path(source_dir).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"source_dir {str(source_dir)!r} does not exist")
        if not path.is_dir():
            raise NotADirectoryError(f"source_dir {str(source_dir)!r} is not a directory")
    else:
        name = str(getattr(model.config, "_name_or_path", "") or "")
        if name and Path(name).expanduser().is_dir():
            check_path_text(name, "the source checkpoint directory (the model's config._name_or_path)")
            path = Path(name).expanduser()
    if path is None:
        return None
    copied_files(path)
    return path.absolute()


def check_not_source(out_dir: str | os.PathLike, source: Path | None) -> None:
    """Raise ``ValueError`` naming both paths when ``out_dir`` is the source directory or holds it."""
    if source is None:
        return
    out, src = (Path(os.path.realpath(Path(path).expanduser())) for path in (out_dir, source))  # loops: as they are
    if out == src or out in src.parents:
        where = "is" if out == src else "holds"
        raise ValueError(f"refusing to export into {str(out)!r}: it {where} the source checkpoint {str(src)!r}, "
                         "which replacing it would delete; choose another output directory")


def _header_fingerprint(file: Path, name: str) -> dict[str, Any]:
    return {"name": name, "size": file.stat().st_size, "header_sha256": hashlib.sha256(header_bytes(file)).hexdigest()}


def source_fingerprint(source: Path | None) -> list[dict[str, Any]] | None:
    """Per safetensors file of ``source``: name, size and SHA-256 of its header (the first 8 + header-length
    bytes, not the whole file); ``None`` without a local source directory."""
    if source is None:
        return None
    try:
        files = weight_files(source)
    except FileNotFoundError:  # a source folder without safetensors weights: nothing to fingerprint
        return []
    return [_header_fingerprint(f, f.relative_to(source).as_posix()) for f in files]


def _copy_dropping_auto_map(src: Path, dst: Path) -> None:
    if src.suffix == ".json":
        try:
            data = parse_json(src.read_text(), f"source file {str(src)!r}")
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"source file {str(src)!r} is not valid JSON: {err}") from None
        if isinstance(data, dict) and "auto_map" in data:  # points at source code the export does not carry
            data.pop("auto_map")
            dst.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
            return
    shutil.copyfile(src, dst)


def copy_tokenizer_files(source: Path, tmp: Path) -> list[str]:
    """Copy the tokenizer, processor and chat-template files of ``source`` (:data:`TOKENIZER_FILES`, the templates of
    ``additional_chat_templates``) into ``tmp``; their names. One that is no regular file is refused
    (:func:`~lightprune.checkpoints.directory.copied_files`), never skipped."""
    names = [name for name in copied_files(source) if name != GENERATION_FILE]
    for name in names:
        (tmp / name).parent.mkdir(exist_ok=True)
        _copy_dropping_auto_map(source / name, tmp / name)
    return sorted(names)


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _write_tokenizer(tmp: Path, processor: Any, source: Path | None) -> dict[str, Any] | None:
    """Save ``processor`` or copy the source's tokenizer files; the manifest's ``tokenizer`` entry."""
    if processor is not None:
        before = _files(tmp)
        processor.save_pretrained(tmp)
        return {"origin": "processor", "class": type(processor).__name__, "files": sorted(_files(tmp) - before)}
    copied = copy_tokenizer_files(source, tmp) if source is not None else []
    return {"origin": "source_dir", "files": copied} if copied else None


def plan_record(plan: ExpertPlan) -> dict[str, Any]:
    """``plan`` as the manifest records it: its ``to_dict()`` as :meth:`ExpertPlan.save` writes it."""
    return json.loads(json.dumps(plan.to_dict(), default=str))


def card_facts(card: Mapping[str, Any] | None, counts: Mapping[int, int]) -> dict[str, Any]:
    """Validate ``save_pruned(card=...)``; returns every :data:`CARD_KEYS` key (``None`` when not given), the plan
    as :func:`plan_record` (an ExpertPlan converted once; a ``to_dict()`` mapping parsed once, which checks it).

    ``counts``: the pruned model's {layer: routed experts}, which the plan's kept counts must equal (a plan of
    another model, or one that leaves out MoE layers, is a ``ValueError``).
    """
    card = dict(card or {})
    unknown = sorted(set(card) - set(CARD_KEYS))
    if unknown:
        raise ValueError(f"card has unknown keys {unknown}; allowed: {list(CARD_KEYS)}")
    facts = {key: card.get(key) for key in CARD_KEYS}
    plan = facts["plan"]
    if plan is not None:
        if isinstance(plan, Mapping):
            plan = ExpertPlan.from_dict(dict(plan))
        if not isinstance(plan, ExpertPlan):
            raise TypeError(f"card['plan'] must be an ExpertPlan or its to_dict(), got {type(plan).__name__}")
        if plan.kept_counts() != dict(counts):
            raise ValueError(f"card['plan'] keeps {plan.kept_counts()} experts per layer, the model has "
                             f"{dict(counts)}: not the plan this model was pruned with")
        facts["plan"] = plan_record(plan)
    for key in ("parameters_before", "parameter_bytes_before"):
        if facts[key] is not None and (isinstance(facts[key], bool) or not isinstance(facts[key], int)):
            raise TypeError(f"card[{key!r}] must be an int, got {facts[key]!r}")
    if facts["evaluation"] is not None:
        if not isinstance(facts["evaluation"], Mapping):
            raise TypeError(f"card['evaluation'] must be a mapping, got {type(facts['evaluation']).__name__}")
        try:
            facts["evaluation"] = json.loads(json.dumps(dict(facts["evaluation"])))
        except (TypeError, ValueError) as err:
            raise TypeError(f"card['evaluation'] must be JSON-serialisable: {err}") from None
    if facts["command"] is not None and not isinstance(facts["command"], str):
        raise TypeError(f"card['command'] must be a string, got {facts['command']!r}")
    if facts["source"] is not None:
        facts["source"] = os.fspath(facts["source"])
    check_utf8({key: value for key, value in facts.items() if key != "plan"}, "the export's manifest and model card "
               "(UTF-8)", path="card")  # the plan checks its own
    return facts


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


def _forget_remote_module(checkpoint: Path) -> None:
    """Drop transformers' cached copy of a staged directory's remote code (its name is unique to this export)."""
    try:
        from transformers.dynamic_module_utils import (
            HF_MODULES_CACHE,
            TRANSFORMERS_DYNAMIC_MODULE_NAME,
            _sanitize_module_name,
        )
    except ImportError:
        return
    if TMP_TAG not in checkpoint.name:
        return
    name = _sanitize_module_name(checkpoint.name)
    shutil.rmtree(Path(HF_MODULES_CACHE) / TRANSFORMERS_DYNAMIC_MODULE_NAME / name, ignore_errors=True)
    prefix = f"{TRANSFORMERS_DYNAMIC_MODULE_NAME}.{name}"
    for module in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[module]


def _reload_logits(checkpoint: Path, probe: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                   trust_remote_code: bool) -> torch.Tensor:
    alive = None
    try:
        reloaded = load_pruned(checkpoint, dtype=dtype, trust_remote_code=trust_remote_code)
        alive = weakref.ref(reloaded)
        if device.type != "cpu":
            reloaded.to(device)
        return model_logits(reloaded, probe)
    finally:
        reloaded = None
        if alive is not None and alive() is not None:  # held by a reference cycle: free it before the next load
            gc.collect()
        if trust_remote_code:
            _forget_remote_module(checkpoint)


def _verify(checkpoint: Path, probe: Mapping[str, Any], reference: torch.Tensor, dtype: torch.dtype,
            device: torch.device, remote: bool, atol: float, rtol: float) -> dict[str, Comparison]:
    loaders = {"load_pruned": False}
    if remote:
        loaders["trust_remote_code"] = True
    diffs: dict[str, Comparison] = {}
    for what, trust in loaders.items():
        logits = _reload_logits(checkpoint, probe, dtype, device, trust)
        diffs[what] = compare(logits, reference, atol, rtol, what=f"checkpoint reloaded with {what}")
    worst = max(diffs, key=lambda what: diffs[what].max_abs_diff)
    if not diffs[worst].ok:
        each = {k: v.max_abs_diff for k, v in diffs.items()}
        raise ExportVerificationError(
            f"checkpoint reloaded with {worst} gives logits that differ from the reference by up to "
            f"{diffs[worst].describe()} ({each}); nothing was written", diffs[worst].max_abs_diff, atol,
            tolerance=diffs[worst].tolerance)
    return diffs


def non_finite_tensors(model: nn.Module, expert_ids: Mapping[int, Sequence[int]] | None = None) -> list[str]:
    """Each tensor a checkpoint of ``model`` stores (parameters, persistent buffers) that holds a NaN or inf, as
    ``"<name> (expert <i>) holds 1 NaN (first at [0, 3])"`` (a fused experts tensor: its first such expert, ``i``
    its position there, or ``expert_ids[layer][position]`` for a layer in ``expert_ids``: the ids a plan kept)."""
    try:
        experts = {id(layer.experts): layer for layer in find_moe_layers(model)}
    except ValueError:  # not a supported family: each tensor named whole
        experts = {}
    found = []
    for owner_name, owner in model.named_modules():
        tensors = {**owner._parameters, **{k: v for k, v in owner._buffers.items()
                                           if k not in owner._non_persistent_buffers_set}}
        for key, tensor in tensors.items():
            if tensor is None or non_finite(tensor) is None:
                continue
            name = f"{owner_name}.{key}" if owner_name else key
            layer = experts.get(id(owner))
            if layer is not None and tensor.dim() >= 2 and tensor.shape[0] == layer.num_experts:
                position = int((~torch.isfinite(tensor.float())).flatten(1).any(1).nonzero()[0])
                expert = (expert_ids or {}).get(layer.index, range(layer.num_experts))[position]
                found.append(f"{name} (expert {expert}) holds {non_finite(tensor[position])}")
            else:
                found.append(f"{name} holds {non_finite(tensor)}")
    return found


def check_reference_finite(model: nn.Module, reference: torch.Tensor, where: str, when: str,
                           after: str = "nothing was written") -> None:
    """Refuse NaN or inf reference logits, the model's own on the verification probe (``when``: how they were
    computed; ``after``: what became of the model and the output, for the message), naming the model's non-finite
    tensors when it has some: the model is broken, not the export."""
    found = non_finite(reference)
    if found is None:
        return
    tensors = non_finite_tensors(model)
    more = f" (and {len(tensors) - 1} more)" if len(tensors) > 1 else ""
    cause = f"its tensor {tensors[0]}{more}" if tensors else "its weights are finite"
    raise ExportVerificationError(f"{where}: the model's own logits on the verification probe ({when}) hold "
                                  f"{found}, {cause}: {BROKEN_SOURCE}; {after}")


def save_pruned(model: nn.Module, out_dir: str | os.PathLike, *, probe: Mapping[str, Any] | None = None,
                reference_logits: torch.Tensor | None = None, atol: float | None = None, overwrite: bool = False,
                processor: Any = None, max_shard_size: int | str | None = None,
                source_dir: str | os.PathLike | None = None, card: Mapping[str, Any] | None = None) -> ExportResult:
    """Write ``model`` (already pruned in place) to ``out_dir`` as a verified safetensors checkpoint.

    Args:
        model: a transformers MoE model of a supported family (not inside ``mask_experts``).
        out_dir: the checkpoint directory; must not exist or be empty unless ``overwrite``; never
            the source checkpoint directory nor one holding it (``ValueError``).
        probe: keyword batch for the verification forward (default: :func:`default_probe`).
        reference_logits: the logits the reloaded checkpoint must reproduce on ``probe``
            (default: ``model``'s own).
        atol: the absolute term of the tolerance ``atol + rtol * max|reference|`` (default 1e-5 fp32, 1e-2
            bf16/fp16; ``rtol``: :func:`~lightprune.export.verify.default_rtol`).
        overwrite: replace an existing non-empty ``out_dir`` (only once the new one is verified).
        processor: a tokenizer / processor saved into the checkpoint too (``save_pretrained``);
            without one the tokenizer files are copied from the source directory.
        max_shard_size: passed to ``save_pretrained`` (default: transformers' own).
        source_dir: the local checkpoint directory ``model`` was loaded from: its tokenizer files
            are copied, its safetensors headers fingerprinted (default: ``config._name_or_path``
            when that is an existing directory; none otherwise).
        card: facts for the model card and the manifest, keys :data:`CARD_KEYS`: ``plan``
            (the ExpertPlan the model was pruned with, or its ``to_dict()``), ``source`` (a name
            for the source; default: the source directory or ``config._name_or_path``),
            ``command`` (default: ``" ".join(sys.argv)``), ``evaluation`` (a JSON mapping),
            ``parameters_before`` and ``parameter_bytes_before`` (of the unpruned model).

    The reloaded copies run on ``model``'s device. Returns an :class:`~lightprune.export.result.ExportResult`
    (the manifest's figures as attributes; ``os.PathLike`` and ``str``: the absolute checkpoint path).
    Raises :class:`ExportVerificationError` (leaving ``out_dir`` untouched) on a mismatch.
    """
    start = time.perf_counter()
    check_path_text(out_dir, "output directory")
    if is_masked(model):
        raise ValueError("save_pruned got a model inside mask_experts: masking is not saved; "
                         "call prune_experts(model, plan) first (or use export_pruned)")
    source = resolve_source_dir(model, source_dir)
    check_not_source(out_dir, source)
    get_family(model)  # an unsupported model is named before anything else
    counts = {layer.index: layer.num_experts for layer in find_moe_layers(model)}
    facts = card_facts(card, counts)
    return write_pruned(model, out_dir, counts, source=source, facts=facts, fingerprint=source_fingerprint(source),
                        probe=probe, reference_logits=reference_logits, atol=atol, overwrite=overwrite,
                        processor=processor, max_shard_size=max_shard_size, start=start, where="save_pruned")


def write_pruned(model: nn.Module, out_dir: str | os.PathLike, counts: Mapping[int, int], *, source: Path | None,
                 facts: Mapping[str, Any], fingerprint: list[dict[str, Any]] | None,
                 probe: Mapping[str, Any] | None, reference_logits: torch.Tensor | None, atol: float | None,
                 overwrite: bool, processor: Any, max_shard_size: int | str | None, start: float, where: str,
                 expert_ids: Mapping[int, Sequence[int]] | None = None,
                 after_verify: Callable[[Path], dict[str, Any]] | None = None) -> ExportResult:
    """Steps 1-7 of the module docstring for ``model`` (pruned, ``counts`` routed experts per layer), its inputs
    checked by the caller: ``source`` (:func:`resolve_source_dir`, not ``out_dir`` nor inside it), ``facts``
    (:func:`card_facts`), ``fingerprint`` (:func:`source_fingerprint` of ``source``). ``where`` (the caller's name)
    begins each error; ``expert_ids`` ({layer: the ids the plan kept}) names a non-finite expert by the id it had
    before pruning (:func:`non_finite_tensors`); ``after_verify(staged directory)``, when given, runs once the
    staged checkpoint is verified and returns the manifest's ``quantization`` entry (a prune-then-quantize export).
    The other arguments are :func:`save_pruned`'s; the result's ``seconds`` count from ``start``
    (``time.perf_counter()``)."""
    get_family(model).set_expert_counts(dict(counts))
    uniform = len(set(counts.values())) == 1
    broken = non_finite_tensors(model, expert_ids)  # one isfinite per tensor, before anything is written
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        raise ValueError(f"{where}: tensor {broken[0]}{more}: the export would carry it (a broken weight); "
                         "nothing was written; restore the weights, or prune the expert that holds it")
    probe = dict(probe) if probe is not None else default_probe(model)
    restore_fp32_buffers(model)  # cast with .to(bf16): rotary inv_freq back in fp32, as the checkpoint reloads
    if reference_logits is None:
        reference_logits = model_logits(model, probe)
        check_reference_finite(model, reference_logits, where, "the model to be written")
    elif non_finite(reference_logits) is not None:
        raise ExportVerificationError(f"{where}: reference_logits hold {non_finite(reference_logits)}: nothing "
                                      "could be verified against them; nothing was written")
    atol = check_atol(atol)  # NaN would switch verification off: refused
    atol, rtol = default_atol(model) if atol is None else atol, default_rtol(model)
    dtype, device = weights_dtype(model), _device(model)
    with staging_dir(out_dir, overwrite) as tmp:
        with quiet_progress():  # lightprune's own save: the summary reports it
            model.save_pretrained(tmp, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
        tokenizer = _write_tokenizer(tmp, processor, source)
        if source is not None and not (tmp / GENERATION_FILE).exists() and (source / GENERATION_FILE).is_file():
            shutil.copyfile(source / GENERATION_FILE, tmp / GENERATION_FILE)
        dropped_mtp = finish_config(tmp, model, uniform)
        check_no_pickles(tmp)
        with quiet_progress():  # the verification's reloads
            diffs = _verify(tmp, probe, reference_logits, dtype, device, not uniform, atol, rtol)
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
