"""M-SMoE's neuron alignment: permute an expert's intermediate neurons to match a reference expert.

Li et al., "Merge, then Compress: Demystify Efficient SMoE with Hints from Its Routing Policy" (ICLR 2024),
section 3: before experts are averaged, each one's intermediate neurons are reordered to line up with a reference
expert's by weight matching, the linear assignment

    perm = argmax_{pi} sum_i <w_ref[i], w_target[pi(i)]>,

where ``w[i]`` concatenates everything that belongs to intermediate neuron ``i``: its gate row, its up row, its
down column and its gate/up bias entries. Reordering the intermediate neurons (the rows of gate and up, the
columns of down, alike) leaves the expert's function unchanged, because the activation acts on each neuron alone.

Layouts (transformers 5 fused experts, ``I`` the intermediate size): ``gate_up_proj [E, 2I, H]`` and
``down_proj [E, H, I]``, or ``[E, H, 2I]`` and ``[E, I, H]`` when ``is_transposed``; ungated experts (``has_gate``
False) hold ``up_proj`` (``[E, I, H]`` / ``[E, H, I]``) instead. Only the default gating of
``transformers.integrations.moe._default_apply_gate`` is understood: ``gate, up = gate_up.chunk(2, dim=-1)``, i.e.
the gate is the first half of the ``2I`` dimension and up the second, neuron ``i`` being entries ``i`` and
``I + i``. Families with their own ``_apply_gate`` (GPT-OSS interleaves gate and up) are refused.
"""

from __future__ import annotations

import torch
from torch import nn

from lightprune.core.extras import require
from lightprune.core.jsonio import strict_int

__all__ = ["has_standard_layout", "neuron_features", "neuron_permutation", "permuted_expert"]


def has_standard_layout(experts: nn.Module) -> bool:
    """True when ``experts`` is ungated (``has_gate`` False) or gates by transformers' default rule (gate = first
    half of ``gate_up``, up = second half) on concatenated weights."""
    if not getattr(experts, "has_gate", True):
        return True
    from transformers.integrations.moe import _default_apply_gate

    if "_apply_gate" in vars(experts):  # a gate set on the instance overrides the class's
        return False
    if getattr(experts, "is_concatenated", True) is False:  # interleaved gate/up
        return False
    return getattr(type(experts), "_apply_gate", None) is _default_apply_gate


def _check_standard(experts: nn.Module, caller: str) -> None:
    if not has_standard_layout(experts):
        gate = getattr(type(experts), "_apply_gate", None)
        raise ValueError(
            f"{caller}: {type(experts).__name__} does not use transformers' default gated layout (its _apply_gate is "
            f"{getattr(gate, '__qualname__', gate)!r}, is_concatenated="
            f"{getattr(experts, 'is_concatenated', None)!r}); neuron alignment only knows gate = first half, "
            "up = second half of gate_up_proj")


def _tensor(experts: nn.Module, name: str) -> torch.Tensor | None:
    value = getattr(experts, name, None)
    return value if isinstance(value, torch.Tensor) else None


def _layout(experts: nn.Module, caller: str) -> tuple[int, list[tuple[str, int | None, int]]]:
    """``(I, [(name, neuron dimension of one expert's slice or None, halves), ...])`` for the module's per-expert
    tensors: ``halves`` is 2 for ``gate_up`` (gate then up along the neuron dimension), else 1; the neuron
    dimension is None for ``down_proj_bias`` (one entry per output)."""
    _check_standard(experts, caller)
    transposed = bool(getattr(experts, "is_transposed", False))
    gated = bool(getattr(experts, "has_gate", True))
    first = "gate_up_proj" if gated else "up_proj"
    halves = 2 if gated else 1
    for name in (first, "down_proj"):
        tensor = _tensor(experts, name)
        if tensor is None or tensor.dim() != 3:
            raise ValueError(f"{caller}: {type(experts).__name__}.{name} must be a 3-D tensor [E, ., .], got "
                             f"{None if tensor is None else tuple(tensor.shape)}")
    down = _tensor(experts, "down_proj")
    size = down.shape[1] if transposed else down.shape[2]
    entries: list[tuple[str, int | None, int]] = [(first, 1 if transposed else 0, halves),
                                                  ("down_proj", 0 if transposed else 1, 1)]
    if getattr(experts, "has_bias", False):
        for name, dim, parts in ((f"{first}_bias", 0, halves), ("down_proj_bias", None, 1)):
            if _tensor(experts, name) is not None:
                entries.append((name, dim, parts))
    count = down.shape[0]
    for name, dim, parts in entries:
        tensor = _tensor(experts, name)
        if tensor.shape[0] != count:
            raise ValueError(f"{caller}: {type(experts).__name__}.{name} has {tensor.shape[0]} experts, down_proj "
                             f"has {count}")
        if dim is not None and tensor.shape[1 + dim] != parts * size:
            raise ValueError(f"{caller}: {type(experts).__name__}.{name} of shape {tuple(tensor.shape)} does not have "
                             f"{parts} x {size} intermediate neurons along dimension {1 + dim} "
                             f"(down_proj {tuple(down.shape)}, is_transposed={transposed})")
    return size, entries


def _check_index(experts: nn.Module, index: int, what: str) -> None:
    count = _tensor(experts, "down_proj").shape[0]
    if strict_int(index) is None:  # a Python or NumPy int, never a bool or a float
        raise TypeError(f"{what} must be an int expert id, got {index!r} ({type(index).__name__})")
    if not 0 <= index < count:
        raise ValueError(f"{what} must be an expert id in [0, {count}), got {index!r}")


def neuron_features(experts: nn.Module, index: int) -> torch.Tensor:
    """``[I, F]`` float32: row ``i`` concatenates expert ``index``'s gate row, up row (only the up row when
    ungated), down column and gate/up bias entries of intermediate neuron ``i``."""
    size, entries = _layout(experts, "neuron_features")
    _check_index(experts, index, "index")
    pieces = []
    for name, dim, parts in entries:
        if dim is None:  # down_proj_bias: per output, not per neuron
            continue
        block = _tensor(experts, name).detach()[index].movedim(dim, 0).to(torch.float32)  # [parts * I, ...]
        pieces.extend(block.reshape(parts, size, -1))  # gate then up (or up alone)
    return torch.cat(pieces, dim=1)


def neuron_permutation(experts: nn.Module, reference: int, target: int) -> torch.Tensor:
    """``perm [I]`` (long): target's neuron ``perm[i]`` is matched to reference's neuron ``i``, the assignment that
    maximises the summed inner products of the neurons' features (`neuron_features`)."""
    linear_sum_assignment = require("merging", "M-SMoE's neuron alignment (align: true)").linear_sum_assignment
    _check_index(experts, reference, "reference")
    _check_index(experts, target, "target")
    ref = neuron_features(experts, reference).to(torch.float64)
    tgt = neuron_features(experts, target).to(torch.float64)
    score = (ref @ tgt.T).cpu().numpy()
    rows, cols = linear_sum_assignment(score, maximize=True)
    perm = torch.empty(len(rows), dtype=torch.long)
    perm[torch.as_tensor(rows, dtype=torch.long)] = torch.as_tensor(cols, dtype=torch.long)
    return perm


def _check_perm(perm: torch.Tensor, size: int) -> torch.Tensor:
    if not isinstance(perm, torch.Tensor):
        raise TypeError(f"perm must be a torch.Tensor of neuron ids, got {perm!r} ({type(perm).__name__})")
    if perm.dim() != 1 or perm.shape[0] != size:
        raise ValueError(f"perm must be a 1-D permutation of range({size}), got shape {tuple(perm.shape)}"
                         f"{_shown(perm)}")
    if perm.dtype == torch.bool or perm.is_floating_point() or perm.is_complex():
        raise ValueError(f"perm must hold integer neuron ids, got dtype {perm.dtype}{_shown(perm)}")
    perm = perm.detach().to(device="cpu", dtype=torch.long)
    outside = perm[(perm < 0) | (perm >= size)]
    if outside.numel():
        raise ValueError(f"perm must be a permutation of range({size}), got ids outside it: {outside.tolist()[:8]}"
                         f"{_shown(perm)}")
    counts = torch.bincount(perm, minlength=size)
    if bool((counts != 1).any()):
        repeated = torch.nonzero(counts > 1).flatten().tolist()
        raise ValueError(f"perm must be a permutation of range({size}), got repeated ids {repeated[:8]} and missing "
                         f"ids {torch.nonzero(counts == 0).flatten().tolist()[:8]}{_shown(perm)}")
    return perm


def _shown(perm: torch.Tensor, limit: int = 32) -> str:
    """``": [ids]"`` for a short ``perm`` (the whole value in the message), else ``""``."""
    return f": {perm.tolist()}" if perm.numel() <= limit else ""


def permuted_expert(experts: nn.Module, index: int, perm: torch.Tensor) -> dict[str, torch.Tensor]:
    """Expert ``index``'s tensors with its intermediate neurons reordered: new neuron ``i`` is old neuron
    ``perm[i]``.

    Returns ``{name: slice}`` for every per-expert tensor present among ``gate_up_proj`` / ``up_proj``,
    ``down_proj`` and (when ``has_bias``) their biases; the slices are new tensors (no views into the parameters),
    with both halves of ``gate_up`` permuted alike and ``down_proj_bias`` unchanged."""
    size, entries = _layout(experts, "permuted_expert")
    _check_index(experts, index, "index")
    perm = _check_perm(perm, size)
    out: dict[str, torch.Tensor] = {}
    for name, dim, parts in entries:
        block = _tensor(experts, name).detach()[index]
        if dim is None:
            out[name] = block.clone()
            continue
        order = torch.cat([perm + part * size for part in range(parts)]).to(block.device)
        out[name] = block.index_select(dim, order)
    return out
