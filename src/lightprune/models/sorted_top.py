"""Sorted top-k of many short float32 rows, by packed integer keys.

On a CPU, ``torch.topk`` costs about as much per row as per element, which dominates on the [tokens x groups,
group size] rows of group-limited routers. Here each float32's bits are read as an int32 of the same order (a
negative float's bits but the sign flipped), packed above the value's reversed position in its row into one int64
key, and each of the k rounds takes every row's largest key with one vectorised reduction (``amax``) and knocks it
out: the positions come out of the keys, so no index reduction runs. Exact: the values are the rows' own bits,
sorted descending; ties go to the lower position (``torch.topk`` leaves their order unspecified).
"""

from __future__ import annotations

import torch

__all__ = ["sorted_topk", "top_positions"]

_POSITION_BITS = 16
_POSITION_MASK = (1 << _POSITION_BITS) - 1
_KNOCKED_OUT = torch.iinfo(torch.int64).min


def _flip_negatives_(bits: torch.Tensor) -> torch.Tensor:
    """In place: every bit but the sign of each negative int32, flipped (float32 bits <-> order-preserving keys;
    the map is its own inverse). Returns ``bits``."""
    return bits.bitwise_xor_((bits >> 31).bitwise_and_(0x7FFFFFFF))


def top_positions(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest of each row of float32 ``values`` [N, n], sorted descending, and their positions [N, k] (int64);
    equal values in ascending position (-0.0 just below +0.0; a NaN above +inf, or below -inf with its sign bit
    set). k <= n <= 65536.

    Every step but the knock-out is in place: on a CPU a fresh [N, n] buffer costs its page faults."""
    num_rows, n = values.shape
    if not 0 < k <= n or n > _POSITION_MASK + 1:
        raise ValueError(f"top_positions: k={k} of rows of {n} (at most {_POSITION_MASK + 1})")
    # the float's bits as an int32 of the same order, above the reversed position (the lower position wins a tie)
    packed = _flip_negatives_(values.contiguous().view(torch.int32).clone()).to(torch.int64)
    packed.bitwise_left_shift_(_POSITION_BITS).bitwise_or_(torch.arange(n - 1, -1, -1, device=values.device))
    flat, row_start = packed.view(-1), torch.arange(num_rows, device=values.device) * n + (n - 1)
    best = torch.empty(k, num_rows, dtype=torch.int64, device=values.device)
    for step in range(k):
        torch.amax(packed, dim=-1, out=best[step])
        if step + 1 < k:
            flat.index_fill_(0, row_start - (best[step] & _POSITION_MASK), _KNOCKED_OUT)
    best = best.t().contiguous()  # [N, k]: rows of the results are contiguous, as torch.topk's are
    positions = (best & _POSITION_MASK).neg_().add_(n - 1)
    keys = best.bitwise_right_shift_(_POSITION_BITS).to(torch.int32)
    return _flip_negatives_(keys).view(torch.float32), positions


def sorted_topk(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(values, k, dim=-1)`` (sorted) with ties in ascending index: by `top_positions` for float32,
    by ``torch.topk`` for other dtypes (its tie order)."""
    if values.dtype != torch.float32 or values.shape[-1] > _POSITION_MASK + 1:
        top = torch.topk(values, k, dim=-1)
        return top.values, top.indices
    shape = values.shape
    top, positions = top_positions(values.reshape(-1, shape[-1]), k)
    return top.view(*shape[:-1], k), positions.view(*shape[:-1], k)
