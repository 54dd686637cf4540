"""The dtypes lightprune computes in (`LOAD_DTYPES`, one table for every path), and the check of a model's
parameters against them (`dtype_problem`), which [`lightprune.models.find_moe_layers`][..find_moe_layers] runs on every
model lightprune examines: a model in memory given to any entry point (scores, calibration, pruning, export), and every
model a checkpoint is built into (whose weights dtype the checkpoint reader checks first, naming the checkpoint).

A model cast to another floating dtype (``torch.float8_e4m3fn``, a complex dtype) would otherwise fail deep inside
torch ("neg_cpu" not implemented for 'Float8_e4m3fn'); routed experts holding integer weights (a quantized
model's) would be scored and pruned as numbers they are not.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lightprune.core.errors import listed_text

__all__ = ["LOAD_DTYPES", "dtype_names", "dtype_problem"]

#: the dtypes a model's weights are loaded and computed in, by name
LOAD_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
_LISTED = 3  # parameters named in a refusal, then "and N more"


def dtype_names() -> str:
    """``float32, bfloat16, float16 or float64``: `LOAD_DTYPES` for a sentence."""
    names = list(LOAD_DTYPES)
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _parameters(n: int) -> str:
    return f"{n} parameter" if n == 1 else f"{n} parameters"


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_problem(model: nn.Module, experts: Sequence[nn.Module] = ()) -> str | None:
    """Why ``model`` cannot be computed with, or None: a floating (or complex) parameter in a dtype outside
    `LOAD_DTYPES` (fix: cast the model), or a routed experts module of it (``experts``) with a parameter of any
    other dtype (integer weights: load the model unquantized; integer parameters elsewhere, a 4-bit fine-tuning's
    quantized projections, are left alone). The first such dtype is named, with its parameters."""
    odd: dict[torch.dtype, list[str]] = {}
    count = 0
    for name, param in model.named_parameters():
        count += 1
        if (param.is_floating_point() or param.is_complex()) and param.dtype not in LOAD_DTYPES.values():
            odd.setdefault(param.dtype, []).append(name)
    if odd:
        dtype, names = next(iter(odd.items()))
        which = f"all {count} of its parameters" if len(names) == count else \
            f"{_parameters(len(names))} ({listed_text(names, _LISTED)})"
        return (f"{type(model).__name__} holds {which} in {_short(dtype)}: lightprune computes in {dtype_names()}; "
                "cast the model to one of them first (model.to(torch.bfloat16))")
    if all(param.dtype in LOAD_DTYPES.values() for module in experts for param in module.parameters()):
        return None
    owners = {id(module) for module in experts}
    for prefix, module in model.named_modules():
        if id(module) not in owners:
            continue
        for name, param in module.named_parameters():
            if param.dtype not in LOAD_DTYPES.values():
                odd.setdefault(param.dtype, []).append(f"{prefix}.{name}" if prefix else name)
    if odd:
        dtype, names = next(iter(odd.items()))
        return (f"{type(model).__name__}'s routed experts hold {_parameters(len(names))} in {_short(dtype)} "
                f"({listed_text(names, _LISTED)}): lightprune scores and prunes experts whose weights are "
                f"{dtype_names()}; load the model unquantized")
    return None
