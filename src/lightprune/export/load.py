"""Load a pruned checkpoint: :func:`load_pruned`, with clear errors for a broken directory.

Before transformers sees the directory, :func:`check_checkpoint` names what is wrong with it:
no directory, no (or unreadable) config.json, no ``.safetensors`` weights (pickle ``.bin`` /
``.pt`` files are never loaded), a shard index naming a missing shard, or a safetensors file whose
header is corrupt or whose size disagrees with its header (truncated). Only headers are read.

Loading is strict: a checkpoint that would give a model with random or dropped weights raises
``ValueError`` naming the path and the tensors (at most 8, then "and N more"), never a warning.

- From the headers, before any data is read: a ``quantization_config`` in config.json, or a tensor
  stored as an integer (neither floating point nor bool) that is not an integer tensor of the model
  (a float parameter, or no tensor of that name; the model is then built on the ``meta`` device for
  its dtypes): transformers would cast int8 to float silently. Integer buffers (position ids) load.
- Transformers' loading report (``output_loading_info=True``, with ``ignore_mismatched_sizes=True``
  so that shape mismatches come back named instead of as a bare ``RuntimeError``): missing,
  unexpected and mis-shaped tensors, and its error messages, in the model's parameter names (into
  which transformers fuses the per-expert tensors on disk). Legitimately absent tensors are not in
  that report: tied weights (``lm_head.weight`` with ``tie_word_embeddings``), the class's
  ``_keys_to_ignore_on_load_missing`` / ``_unexpected`` patterns (plus ``rotary_emb.inv_freq`` and
  ``position_ids``), non-persistent buffers (never in a state dict).
- Per-expert tensors on disk (``...experts.<i>.<name>``) that cannot be fused (an expert lacking a
  name its layer's other experts have, or a shape differing from theirs), in the names on disk:
  raised when transformers' conversion fails on them, or after a clean report.

A uniform checkpoint loads with the stock transformers class. A non-uniform one
(``config.lightprune_experts_per_layer``) loads with :func:`.classes.resizing_class`: the stock
class plus lightprune's resize in ``__init__``, so transformers' own weight conversions (the
per-expert keys on disk fused back into ``gate_up_proj`` / ``down_proj``) still apply. The
checkpoint's ``modeling_lightprune.py`` is executed only with ``trust_remote_code=True``. All
three paths are checked the same way.

Inside Lightning's DeepSpeed ZeRO-3 ``zero.Init`` (a LightningModule's ``configure_model``) the
model is built and loaded with full parameters (:func:`lightprune.distributed.outside_zero_init`):
transformers' loader does not know that context and would compare the checkpoint's shapes with
empty partitions. DeepSpeed partitions the loaded model when its engine starts; until then each
rank holds the full weights on the CPU.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightprune.distributed import outside_zero_init
from lightprune.export.classes import auto_class, base_class_for_config, resizing_class
from lightprune.export.remote_resize import experts_per_layer
from lightprune.export.width_format import WIDTH_PLAN_FILE, attach_width_kernels, read_width_manifest
from lightprune.width.plan import WidthPlan

__all__ = ["load_pruned", "check_checkpoint", "check_safetensors", "weight_files", "header_bytes", "read_header",
           "SAFE_INDEX"]

_HEADER_LIMIT = 100 * 1024 * 1024
SAFE_INDEX = "model.safetensors.index.json"
SAFE_WEIGHTS = "model.safetensors"
_SHOWN = 8
_FLOAT_ONLY = "lightprune loads float checkpoints; quantized or integer weights are not supported"
_DISK_NAMES = "tensor names as stored in the safetensors files"
_MODEL_NAMES = "tensor names are the model's parameters, into which transformers fuses the per-expert tensors on disk"
_FIX = "re-export it or restore the files"
_EXPERT_KEY = re.compile(r"^(?P<prefix>(?:.+\.)?experts)\.(?P<index>\d+)\.(?P<rest>.+)$")
_STRICT_KWARGS = ("output_loading_info", "ignore_mismatched_sizes")


def _raw_header(file: Path, size: int) -> bytes:
    """The first 8 + header-length bytes of a safetensors file (a bare ``ValueError`` when they cannot be)."""
    with open(file, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes, shorter than a safetensors header")
        length = int.from_bytes(head, "little")
        if length > min(size - 8, _HEADER_LIMIT):
            raise ValueError(f"header length {length} does not fit in the file of {size} bytes")
        return head + handle.read(length)


def header_bytes(file: str | os.PathLike) -> bytes:
    """The raw header (length prefix included) of a safetensors file; ``ValueError`` naming it when truncated."""
    file = Path(file)
    try:
        return _raw_header(file, file.stat().st_size)
    except ValueError as err:
        raise ValueError(f"safetensors file {str(file)!r} is corrupt or truncated: {err}") from None


def read_header(file: Path) -> dict[str, Any]:
    """The header of a safetensors file, validated against the file's size (``ValueError`` naming it)."""
    size = file.stat().st_size
    try:
        raw = _raw_header(file, size)
        length = len(raw) - 8
        header = json.loads(raw[8:])
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        end = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, stop = info["data_offsets"]
            if not 0 <= begin <= stop:
                raise ValueError(f"tensor {name!r} has bad data offsets {info['data_offsets']}")
            end = max(end, int(stop))
    except ValueError as err:
        raise ValueError(f"safetensors file {str(file)!r} is corrupt or truncated: {err}") from None
    except (KeyError, TypeError, UnicodeDecodeError) as err:
        raise ValueError(f"safetensors file {str(file)!r} has a corrupt header: {err!r}") from None
    if 8 + length + end != size:
        raise ValueError(f"safetensors file {str(file)!r} is corrupt or truncated: its header describes "
                         f"{8 + length + end} bytes, the file has {size}")
    return header


def check_safetensors(file: str | os.PathLike) -> None:
    """Raise ``ValueError`` naming ``file`` when its header is unreadable or its size disagrees with it."""
    read_header(Path(file))


def weight_files(path: str | os.PathLike) -> list[Path]:
    """The ``.safetensors`` files of a checkpoint directory (through its shard index when there is one)."""
    path = Path(path)
    index = path / SAFE_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"shard index {str(index)!r} is not valid: {err!r}") from None
        files = sorted({path / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"checkpoint {str(path)!r}: shard index names missing files {missing}")
        return files
    return sorted(path.glob("*.safetensors"))


def check_checkpoint(path: str | os.PathLike) -> Path:
    """Validate a checkpoint directory before loading; returns it as a ``Path``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} does not exist")
    if not path.is_dir():
        raise NotADirectoryError(f"checkpoint path {str(path)!r} is not a directory")
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} has no config.json")
    try:
        json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"config.json in {str(path)!r} is not valid JSON: {err}") from None
    files = weight_files(path)
    if not files:
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        hint = f" (found {pickles}; lightprune loads safetensors only)" if pickles else ""
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} has no .safetensors weights{hint}")
    for file in files:
        check_safetensors(file)
    return path


def _listed(items: Iterable[str]) -> str:
    """At most :data:`_SHOWN` items, then ``and N more``."""
    items = list(items)
    shown = ", ".join(items[:_SHOWN])
    return shown + (f", and {len(items) - _SHOWN} more" if len(items) > _SHOWN else "")


def _tensors(n: int) -> str:
    return f"{n} tensor" if n == 1 else f"{n} tensors"


def _disk_entries(path: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """``{name: (file, header entry)}`` of the safetensors files transformers loads from ``path``."""
    files = weight_files(path) if (path / SAFE_INDEX).is_file() else [path / SAFE_WEIGHTS]
    return {name: (file, info) for file in files if file.is_file()
            for name, info in read_header(file).items() if name != "__metadata__"}


def _is_integer(dtype: str) -> bool:
    """A safetensors dtype (``F32``, ``BF16``, ``F8_E4M3``, ``I8``, ``U8``, ``BOOL``, ...) neither float nor bool."""
    return not (dtype.startswith("F") or dtype in ("BF16", "BOOL"))


def _check_not_quantized(path: Path) -> None:
    quantization = json.loads((path / "config.json").read_text()).get("quantization_config")
    if quantization is not None:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization
        raise ValueError(f"checkpoint {str(path)!r} is quantized (config.json has a quantization_config, "
                         f"quant_method {method!r}): {_FLOAT_ONLY}")


def _check_integer_tensors(path: Path, entries: dict[str, tuple[Path, dict[str, Any]]],
                           build: Callable[[], nn.Module]) -> None:
    """Refuse integer tensors on disk unless the model's tensor of that name is an integer one too.

    Only when the headers hold integer tensors is the model built, on the ``meta`` device, for its dtypes.
    """
    integers = {name: (file, info["dtype"]) for name, (file, info) in entries.items() if _is_integer(info["dtype"])}
    if not integers:
        return
    with torch.device("meta"):
        skeleton = build()
    own = {**dict(skeleton.named_parameters(remove_duplicate=False)),
           **dict(skeleton.named_buffers(remove_duplicate=False))}
    prefix = f"{skeleton.base_model_prefix}." if skeleton.base_model_prefix else ""
    bad = []
    for name, (file, dtype) in sorted(integers.items()):
        found = [n for n in (name, prefix + name, name.removeprefix(prefix) if prefix else name) if n in own]
        tensor = own[found[0]] if found else None
        if tensor is not None and not tensor.is_floating_point():
            continue
        role = (f"the model's {found[0]} is {str(tensor.dtype).removeprefix('torch.')}" if tensor is not None
                else "the model has no integer tensor of that name")
        bad.append(f"{name}: {dtype} in {file.name}, {role}")
    if bad:
        raise ValueError(f"checkpoint {str(path)!r} stores {_tensors(len(bad))} as integers ({_listed(bad)}; "
                         f"{_DISK_NAMES}): {_FLOAT_ONLY}")


def _expert_layout_error(path: Path, entries: dict[str, tuple[Path, dict[str, Any]]]) -> ValueError | None:
    """The error for per-expert tensors on disk that transformers cannot fuse, or ``None``.

    Each must exist under every tensor name of its kind of layer, for every expert index, in one shape.
    The kind of layer is the path with its numbers wildcarded (``model.layers.#.mlp.experts``): each of its
    layers must hold the same per-expert names (``gate_proj.weight``, ...) for experts ``0 .. n-1``.
    """
    layers: dict[str, dict[str, dict[int, tuple[int, ...]]]] = defaultdict(lambda: defaultdict(dict))
    for name, (_, info) in entries.items():
        match = _EXPERT_KEY.match(name)
        if match:
            layers[match["prefix"]][match["rest"]][int(match["index"])] = tuple(info["shape"])
    kinds: dict[str, set[str]] = defaultdict(set)
    for prefix, by_name in layers.items():
        kinds[re.sub(r"\.\d+\.", ".#.", prefix)].update(by_name)
    missing, odd = [], []
    for prefix, by_name in sorted(layers.items()):
        count = 1 + max(i for shapes in by_name.values() for i in shapes)
        for rest in sorted(kinds[re.sub(r"\.\d+\.", ".#.", prefix)]):
            shapes = by_name.get(rest, {})
            missing += [f"{prefix}.{i}.{rest}" for i in range(count) if i not in shapes]
            if shapes:
                common = Counter(shapes.values()).most_common(1)[0][0]
                odd += [f"{prefix}.{i}.{rest} {list(shape)} (its other experts {list(common)})"
                        for i, shape in sorted(shapes.items()) if shape != common]
    parts = []
    if missing:
        parts.append(f"lacks {_tensors(len(missing))} of experts whose other tensors it has ({_listed(missing)})")
    if odd:
        parts.append(f"has {_tensors(len(odd))} of another shape than the same tensor of the layer's other "
                     f"experts ({_listed(odd)})")
    if not parts:
        return None
    return ValueError(f"checkpoint {str(path)!r} {'; '.join(parts)}: its per-expert tensors cannot be fused "
                      f"into the model's parameters; {_FIX} ({_DISK_NAMES})")


def _check_loading_info(path: Path, info: dict[str, Any]) -> None:
    """Raise ``ValueError`` for anything transformers' loading report lists."""
    missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
    mismatched, errors = sorted(info["mismatched_keys"], key=lambda item: item[0]), list(info["error_msgs"])
    parts, effects = [], []
    if missing:
        parts.append(f"is missing {_tensors(len(missing))} the model needs ({_listed(missing)})")
    if mismatched:
        parts.append(f"has {_tensors(len(mismatched))} of another shape than the model's ("
                     + _listed(f"{name} {list(disk)} on disk, {list(want)} in the model"
                               for name, disk, want in mismatched) + ")")
    if missing or mismatched:
        effects.append("it would load with random weights")
    if unexpected:
        parts.append(f"has {_tensors(len(unexpected))} the model does not have ({_listed(unexpected)})")
        effects.append("the extra ones would be ignored")
    if errors:
        parts.append(f"failed to load ({'; '.join(errors)})")
    if parts:
        effect = f": {' and '.join(effects)}" if effects else ""
        raise ValueError(f"checkpoint {str(path)!r} {'; '.join(parts)}{effect}; {_FIX} ({_MODEL_NAMES})")


def load_pruned(path: str | os.PathLike, *, dtype: torch.dtype | str | None = None, trust_remote_code: bool = False,
                attention_backend: str = "sdpa", **from_pretrained_kwargs: Any) -> nn.Module:
    """Load a checkpoint written by :func:`save_pruned` (or any uniform one), in eval mode.

    Strict (see the module docstring): missing, unexpected, mis-shaped or integer tensors raise
    ``ValueError`` naming the checkpoint and the tensors; nothing in the directory is changed.

    Args:
        path: the checkpoint directory.
        dtype: weights dtype; default: the one recorded in the config.
        trust_remote_code: build the model with the checkpoint's own ``modeling_lightprune.py``
            (transformers' auto class) instead of lightprune's in-process resize.
        attention_backend: for an MWOP width checkpoint (``width_plan.json``): the path-sparse attention
            backend, ``sdpa``, ``flex`` or ``triton`` (:mod:`lightprune.export.width`).
        **from_pretrained_kwargs: passed on (``device_map``, ``attn_implementation``, ...); not
            ``output_loading_info`` nor ``ignore_mismatched_sizes``, which the strict check sets.
    """
    clash = [key for key in _STRICT_KWARGS if key in from_pretrained_kwargs]
    if clash:
        raise TypeError(f"load_pruned sets {clash} itself to check transformers' loading report; do not pass them")
    path = check_checkpoint(path)
    _check_not_quantized(path)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    kwargs = {"dtype": dtype if dtype is not None else "auto", "use_safetensors": True, **from_pretrained_kwargs,
              "output_loading_info": True, "ignore_mismatched_sizes": True}
    entries = _disk_entries(path)
    with outside_zero_init():
        if trust_remote_code:
            cls, kwargs["trust_remote_code"] = auto_class(config), True
        else:
            cls = base_class_for_config(config)
            if experts_per_layer(config):
                cls = resizing_class(cls)

        def build() -> nn.Module:
            return cls.from_config(config, trust_remote_code=True) if trust_remote_code else cls(config)

        _check_integer_tensors(path, entries, build)
        layout_error = _expert_layout_error(path, entries)
        try:
            model, info = cls.from_pretrained(path, config=config, **kwargs)
        except RuntimeError as err:  # transformers' conversion failed: the per-expert tensors say why
            if layout_error is None:
                raise
            raise layout_error from err
    _check_loading_info(path, info)  # names every missing tensor when transformers got that far
    if layout_error is not None:
        raise layout_error
    model.eval()
    if (path / WIDTH_PLAN_FILE).is_file():
        plan = WidthPlan.load(path / WIDTH_PLAN_FILE)
        attach_width_kernels(model, plan, align=int(read_width_manifest(path)["align"]),
                             attention_backend=attention_backend)
    return model
