"""Load a pruned checkpoint: [`load_pruned`][], with clear errors for a broken directory.

Before transformers sees the directory, it is opened and checked exactly as every streamed path checks it
([`Checkpoint`][lightprune.checkpoints.reader.Checkpoint], then the
[`Skeleton`][lightprune.checkpoints.skeleton.Skeleton] built on it, which runs
`check_contents`): the files (which are the weights, the shard index
against the shards, every header against its bytes), config.json (no duplicate key, a ``quantization_config``
only of a format lightprune reads and agreeing with the tensors, layer counts and ``dtype`` against the weights), and
the tensors against the model (all present, none extra, shapes that fit, no integer tensor where the model has a
float one, a possible top-k). The same checkpoint is refused with the same message whichever path reads it. Only
headers are read. A quantized checkpoint (FP8 blocks, MXFP4, compressed-tensors) loads dequantized into the model's
dtype, as the streamed paths read it (the format's ``loading_config``, unless ``quantization_config`` is passed);
the tensors of multi-token-prediction layers the model class does not build are not unexpected ones.

Loading is strict: a checkpoint that would give a model with random or dropped weights raises
``ValueError`` naming the path and the tensors (at most 8, then "and N more"), never a warning.
Transformers' loading report (``output_loading_info=True``, with ``ignore_mismatched_sizes=True``) is checked
again after the load, a second net: missing, unexpected and mis-shaped tensors and its error messages.

A uniform checkpoint loads with the stock transformers class. A non-uniform one
(``config.lightprune_experts_per_layer``) loads with `classes.resizing_class`: the stock
class plus lightprune's resize in ``__init__``, so transformers' own weight conversions (the
per-expert keys on disk fused back into ``gate_up_proj`` / ``down_proj``) still apply. The
checkpoint's ``modeling_lightprune.py`` is executed only with ``trust_remote_code=True``. All
three paths are checked the same way.

Inside Lightning's DeepSpeed ZeRO-3 ``zero.Init`` (a LightningModule's ``configure_model``) the
model is built and loaded with full parameters (`lightprune.core.distributed.outside_zero_init`):
transformers' loader does not know that context and would compare the checkpoint's shapes with
empty partitions. DeepSpeed partitions the loaded model when its engine starts; until then each
rank holds the full weights on the CPU.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
from torch import nn

from lightprune.checkpoints.classes import auto_class, base_class_for_config, resizing_class
from lightprune.checkpoints.directory import check_checkpoint
from lightprune.checkpoints.mtp import mtp_prefixes
from lightprune.checkpoints.reader import Checkpoint
from lightprune.models.resize import experts_per_layer
from lightprune.checkpoints.skeleton import Skeleton
from lightprune.checkpoints.strict import check_loading_info
from lightprune.core.distributed import outside_zero_init
from lightprune.core.suggestions import did_you_mean
from lightprune.export.width_format import ATTENTION_RECORD, WIDTH_PLAN_FILE, attach_width_kernels, read_width_manifest
from lightprune.models.dtypes import LOAD_DTYPES  # the dtypes weights load in (one table for every path)
from lightprune.models.experts_kernel import runnable_experts
from lightprune.width.attention_choice import FALLBACK_BACKEND, recorded_backends
from lightprune.width.kernels import BACKENDS
from lightprune.width.plan import WidthPlan

__all__ = ["load_pruned", "check_checkpoint", "check_dtype", "check_device_map", "LOAD_DTYPES", "DEVICE_MAPS"]

_STRICT_KWARGS = ("output_loading_info", "ignore_mismatched_sizes")
#: the placements accelerate computes (besides a device, a GPU index or a {module: device} dict)
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_dtype(dtype: Any) -> None:
    """Raise ``ValueError`` naming ``dtype`` and the choices unless it is a dtype weights load in (`LOAD_DTYPES`,
    by name or as a ``torch.dtype``), ``"auto"`` or None, or a dict of such per sub-config."""
    _check_dtype(dtype, "load_pruned: dtype")


def _check_dtype(dtype: Any, name: str) -> None:
    if isinstance(dtype, dict):  # composite configs: {sub-config: dtype}
        for key, value in dtype.items():
            _check_dtype(value, f"{name}[{key!r}]")
        return
    if dtype is None or dtype == "auto":
        return
    named = getattr(torch, dtype, None) if isinstance(dtype, str) and not dtype.startswith("_") else dtype
    if isinstance(named, torch.dtype) and named in LOAD_DTYPES.values():
        return
    raise ValueError(f"{name} {dtype!r} is not a dtype weights load in{did_you_mean(dtype, LOAD_DTYPES)}; choose "
                     f"one of 'auto' (what config.json records), {', '.join(map(repr, LOAD_DTYPES))} (or the "
                     "torch.dtype)")


def check_device_map(device_map: Any, name: str = "load_pruned: device_map") -> None:
    """Raise ``ValueError`` naming ``device_map`` and the choices unless transformers can place a model by it: None,
    one of `DEVICE_MAPS`, a device (``"cpu"``, ``"cuda:0"``, a ``torch.device``), a GPU index, or a dict
    {module name: device, GPU index, ``"cpu"`` or ``"disk"``}."""
    choices = (f"choose one of {', '.join(map(repr, DEVICE_MAPS))}, a device ('cpu', 'cuda:0'), a GPU index, or a "
               "dict {module name: device}")
    if device_map is None or isinstance(device_map, torch.device) or device_map in DEVICE_MAPS:
        return
    if isinstance(device_map, dict):
        for key, value in device_map.items():
            if not isinstance(key, str):
                raise ValueError(f"{name} has the key {key!r}, not a module name (a string such as 'model.layers.0' "
                                 "or '' for the whole model)")
            if value != "disk":
                _check_device(value, f"{name}[{key!r}]", "give a device ('cpu', 'cuda:0'), 'disk' or a GPU index")
        return
    _check_device(device_map, name, choices)


def _check_device(value: Any, name: str, choices: str) -> None:
    if isinstance(value, torch.device) or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return
    if isinstance(value, str):
        try:
            torch.device(value)
            return
        except (RuntimeError, ValueError):
            pass
    raise ValueError(f"{name} {value!r} is not a placement transformers takes{did_you_mean(value, DEVICE_MAPS)}; "
                     f"{choices}")


def check_experts_implementation(value: Any, name: str = "load_pruned: experts_implementation") -> None:
    """Raise ``ValueError`` naming ``value`` and transformers' choices unless it is one of its experts kernels."""
    from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    known = ["eager", *sorted(set(ALL_EXPERTS_FUNCTIONS.keys()) | set(ALL_FP8_EXPERTS_FUNCTIONS.keys()))]
    if value not in known:
        raise ValueError(f"{name} {value!r} is not an experts kernel transformers has{did_you_mean(value, known)}; "
                         f"choose one of {', '.join(map(repr, known))}")


def _check_arguments(dtype: Any, attention_backend: Any, kwargs: dict[str, Any]) -> None:
    """load_pruned's arguments, before anything is read: each refusal one line naming the value and the choices."""
    clash = [key for key in _STRICT_KWARGS if key in kwargs]
    if clash:
        raise TypeError(f"load_pruned sets {clash} itself to check transformers' loading report; do not pass them")
    check_dtype(dtype)
    choices = ("auto", *BACKENDS)
    if attention_backend not in choices:
        raise ValueError(f"load_pruned: attention_backend {attention_backend!r} is not a path-attention backend"
                         f"{did_you_mean(attention_backend, choices)}; choose one of "
                         f"{', '.join(map(repr, choices))} (it applies to a width-pruned checkpoint)")
    if "device_map" in kwargs:
        check_device_map(kwargs["device_map"])
    if "experts_implementation" in kwargs:
        check_experts_implementation(kwargs["experts_implementation"])


def load_pruned(path: str | os.PathLike, *, dtype: torch.dtype | str | None = None, trust_remote_code: bool = False,
                attention_backend: str = "auto", **from_pretrained_kwargs: Any) -> nn.Module:
    """Load a checkpoint written by [`save_pruned`][] (or any uniform one), in eval mode.

    Strict (see the module docstring): missing, unexpected, mis-shaped or integer tensors raise
    ``ValueError`` naming the checkpoint and the tensors; nothing in the directory is changed.

    Its arguments are checked before anything is read (`check_dtype`, `check_device_map`, the
    ``attention_backend`` and an ``experts_implementation``): a refusal names the value and the choices.

    Args:
        path: the checkpoint directory.
        dtype: weights dtype (`LOAD_DTYPES`, or ``"auto"``); default: the one recorded in the config.
        trust_remote_code: build the model with the checkpoint's own ``modeling_lightprune.py``
            (transformers' auto class) instead of lightprune's in-process resize.
        attention_backend: for an MWOP width checkpoint (``width_plan.json``): the path-sparse attention
            backend, ``sdpa``, ``span``, ``flex`` or ``triton`` for every layer, or ``auto`` (default): each layer
            runs the backend the export chose for the device it runs on (`lightprune.width.attention_choice`;
            ``sdpa`` on a device type it did not choose for, and for every layer of an export that recorded no
            choice, which was verified with it).
        **from_pretrained_kwargs: passed on (``device_map``, ``attn_implementation``, ...); not
            ``output_loading_info`` nor ``ignore_mismatched_sizes``, which the strict check sets. Without an
            ``experts_implementation``, experts that transformers' default ``grouped_mm`` cannot run (float64)
            run its ``eager`` one (`runnable_experts`).
    """
    _check_arguments(dtype, attention_backend, from_pretrained_kwargs)
    with Checkpoint(path) as checkpoint, outside_zero_init():
        # the checks every path runs (see the module docstring), from the headers
        mtp = mtp_prefixes(Skeleton(checkpoint).mtp_layers, getattr(checkpoint.config, "num_hidden_layers", 0))
        quantization = checkpoint.quantization
    path = checkpoint.path
    width = None  # a width export's plan and alignment, read before the weights (a directory or a dangling link
    if os.path.lexists(path / WIDTH_PLAN_FILE):  # there is said, never loaded as a dense model)
        manifest = read_width_manifest(path)
        backend: Any = attention_backend
        if attention_backend == "auto":  # the export's choice per layer and device, else what it was verified with
            record = manifest.get(ATTENTION_RECORD)
            backend = FALLBACK_BACKEND if record is None else recorded_backends(record, where=str(path))
        width = WidthPlan.load(path / WIDTH_PLAN_FILE), int(manifest["align"]), backend
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    kwargs = {"dtype": dtype if dtype is not None else "auto", "use_safetensors": True, **from_pretrained_kwargs,
              "output_loading_info": True, "ignore_mismatched_sizes": True}
    if quantization is not None:  # dequantized, as every lightprune path reads it (:mod:`.checkpoints.quantized`)
        kwargs.setdefault("quantization_config", quantization.loading_config())
    with outside_zero_init():
        if trust_remote_code:
            cls, kwargs["trust_remote_code"] = auto_class(config), True
        else:
            cls = base_class_for_config(config)
            if experts_per_layer(config):
                cls = resizing_class(cls)
        with warnings.catch_warnings():
            if quantization is not None and "quantization_config" not in from_pretrained_kwargs:
                # transformers' note that the loading config passed here only sets the loading attributes (dequantize)
                warnings.filterwarnings("ignore", message="You passed `quantization_config`", category=UserWarning)
            model, info = cls.from_pretrained(path, config=config, **kwargs)
    if mtp:  # a multi-token-prediction layer, which the model class does not build (checked by the skeleton)
        info = {**info, "unexpected_keys": [key for key in info["unexpected_keys"] if not key.startswith(mtp)]}
    check_loading_info(path, info)  # a second net: transformers' own report
    model.eval()
    if "experts_implementation" not in from_pretrained_kwargs:  # float64 experts: transformers' eager ones
        runnable_experts(model.modules())
    if width is not None:
        attach_width_kernels(model, width[0], align=width[1], attention_backend=width[2])
    return model
