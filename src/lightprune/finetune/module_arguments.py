"""MoECausalLM's arguments, checked when the module is constructed, before anything is built or imported for it: a
bad one is a ValueError naming it and what it accepts (`check_module_arguments`).
"""

from __future__ import annotations

import math
from typing import Any

from lightprune.core.checks import real_number
from lightprune.core.jsonio import strict_int
from lightprune.core.sources import check_checkpoint_name
from lightprune.core.suggestions import did_you_mean
from lightprune.export.load import LOAD_DTYPES, check_device_map
from lightprune.finetune.adapters import AdapterSpec
from lightprune.finetune.optim import OPTIMIZERS, SCHEDULERS, check_choice
from lightprune.finetune.quantize import _bnb
from lightprune.testing.tiny import check_tiny_family, check_tiny_overrides

__all__ = ["check_module_arguments"]


def check_module_arguments(*, checkpoint: str | None, tiny: str | None, tiny_overrides: dict | None, dtype: str,
                           learning_rate: float, adapter: AdapterSpec | dict | None, optimizer: str,
                           weight_decay: float, warmup_steps: int, scheduler: str, load_in_4bit: bool,
                           router_aux_loss_coef: float, aux_loss: str, loss_mean: str,
                           device_map: str | dict[str, Any] | None, max_memory: dict[str, Any] | None,
                           offload_folder: str | None, sequential: bool, batches_per_pass: int,
                           stream_device: str | None) -> tuple[AdapterSpec | None, int]:
    """Check `MoECausalLM`'s arguments (as its constructor takes them);
    (``adapter`` as an [`AdapterSpec`][...adapters.AdapterSpec] where a mapping was given,
    ``batches_per_pass`` as an int)."""
    if isinstance(adapter, dict):
        adapter = AdapterSpec(**adapter)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_choice("scheduler", scheduler, SCHEDULERS)
    # numbers (NumPy's too), finite: NaN, inf, bools and strings are refused
    rate, decay, warmup, coef = (real_number(v) if real_number(v) is not None else math.nan
                                 for v in (learning_rate, weight_decay, warmup_steps, router_aux_loss_coef))
    if not 0 < rate < math.inf:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
    if not (0 <= decay < math.inf and 0 <= warmup < math.inf):
        raise ValueError(f"weight_decay and warmup_steps must be >= 0, got {weight_decay}, {warmup_steps}")
    check_choice("loss_mean", loss_mean, ("token", "row"))
    check_choice("aux_loss", aux_loss, ("model", "per_layer"))
    if not 0 <= coef < math.inf:
        raise ValueError(f"router_aux_loss_coef must be >= 0, got {router_aux_loss_coef}")
    if load_in_4bit:
        _bnb()
    if (checkpoint is None) == (tiny is None):
        raise ValueError("give exactly one of checkpoint= (a local directory) or tiny= (a family name); "
                         f"got checkpoint={checkpoint!r}, tiny={tiny!r}")
    if dtype not in LOAD_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(LOAD_DTYPES)}, got {dtype!r}"
                         f"{did_you_mean(dtype, LOAD_DTYPES)}")
    if load_in_4bit and dtype == "float64":
        raise ValueError("load_in_4bit computes in float32, bfloat16 or float16 (bitsandbytes), got dtype "
                         "'float64'")
    if checkpoint is not None:
        check_checkpoint_name(checkpoint)  # a known source name (built on first use, in configure_model) or a folder
    placement = {k: v for k, v in (("device_map", device_map), ("max_memory", max_memory),
                                   ("offload_folder", offload_folder)) if v is not None}
    if placement and checkpoint is None:
        raise ValueError(f"{sorted(placement)} apply to checkpoint=, not to a tiny model (tiny={tiny!r})")
    check_device_map(device_map, "device_map")  # before the model is built
    if sequential:
        clash = [name for name, on in (("tiny", tiny is not None), ("adapter", adapter is not None),
                                       ("load_in_4bit", load_in_4bit), *((k, True) for k in placement)) if on]
        if clash:
            raise ValueError(f"sequential=True streams a checkpoint one decoder layer at a time; it does not go "
                             f"with {clash}")
    count = strict_int(batches_per_pass)  # a Python or NumPy int, never a bool or a float
    if count is None or count < 1:
        raise ValueError(f"batches_per_pass must be an int >= 1, got {batches_per_pass!r}")
    batches_per_pass = count
    if stream_device is not None:
        if not sequential:
            raise ValueError(f"stream_device={stream_device!r} applies to sequential=True (a streamed checkpoint); "
                             "a model in memory goes where the trainer puts it (--trainer.accelerator)")
        from lightprune.checkpoints.device import streaming_device

        streaming_device(stream_device)  # a device this machine has, said now
    if tiny is not None:
        check_tiny_family(tiny, "tiny")
    if tiny_overrides and tiny is not None:  # a mistyped field would be kept by transformers and read by nothing
        check_tiny_overrides(tiny, tiny_overrides, "tiny_overrides")
    return adapter, batches_per_pass
