"""MWOP path-sparse attention from dense SDPA calls on the kept key spans: `span_path_attention`.

The pruned paths of MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs", Algorithm 1; appendix
D.5's retained key set) remove whole (query modality, key modality) blocks per head, and the modalities are contiguous
runs of the sequence. So the attention splits into dense pieces. The heads are grouped by their kept-path pattern (at
most 8 patterns); each sample's queries split into runs of one modality; for a run of n queries the keys the pattern
keeps are p keys before the run (every query sees all of them) and, when the run's own modality is kept, the run's n own
keys, last. That is SDPA over m = p (+ n) keys with no mask, or with the lower-right causal mask
(``torch.nn.attention.bias.causal_lower_right``: query r sees keys 0 .. m - n + r): both run on fused kernels
(FlashAttention / cuDNN / memory-efficient), unlike a boolean mask. Consecutive runs whose keys extend each other are
one piece (`span_pieces`): a pattern that keeps every path of a sample without padding is one dense causal call;
samples with the same pieces, and patterns with the same piece, share each call (`span_calls`).

The kept keys of a piece are a slice of the key tensor when they are one interval, one gather otherwise (the pruned
keys are never read: a NaN there cannot reach the output). Grouped-query heads read their key/value heads through
SDPA's ``enable_gqa`` when the pattern holds whole groups and no causal mask is needed, else through one gather of
the key/value heads per query head. A query with no retained key outputs zeros, as the other backends.

The pieces are built on the host from the token modality, read once per forward (every layer of a forward sees the
same modality tensor, `sample_runs` keeps its runs), and the calls with their index tensors once per layer and
layout (`prepared_calls`): a call then reads nothing from the device and copies no index to it. On the CPU
half-precision inputs are computed in fp32, as `sdpa_path_attention` does.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import NamedTuple

import torch

from lightprune.width.kernels.intervals import class_table

__all__ = ["SpanCall", "SpanPiece", "head_patterns", "kv_heads_of", "modality_runs", "prepared_calls", "sample_runs",
           "span_calls", "span_path_attention", "span_pieces"]


class SpanPiece(NamedTuple):
    """One dense SDPA call: query rows ``[start, end)`` (query index) over the key ``intervals`` (positions,
    sorted, disjoint, half-open); ``causal``: the last ``end - start`` keys are the rows' own positions, under the
    lower-right causal mask (else every query sees every key)."""

    start: int
    end: int
    intervals: tuple[tuple[int, int], ...]
    causal: bool

    @property
    def rows(self) -> int:
        return self.end - self.start

    @property
    def keys(self) -> int:
        return sum(e - s for s, e in self.intervals)

    @property
    def square(self) -> bool:
        """Causal with no key before the rows: SDPA's own causal mask (``is_causal``)."""
        return self.causal and 1 < self.rows == self.keys

    @property
    def lower_right(self) -> bool:
        """Causal with keys before the rows: the lower-right causal mask, whose kernels take matching heads (GQA
        key/value heads are expanded for it)."""
        return self.causal and 1 < self.rows < self.keys

    @property
    def pairs(self) -> int:
        """(query, key) pairs a fused kernel computes: the prefix fully, the own block's lower triangle."""
        n = self.rows
        return n * self.keys - (n * (n - 1) // 2 if self.causal else 0)


def modality_runs(codes: list[int]) -> list[tuple[int, int, int]]:
    """``[(start, end, code)]``: the maximal runs of equal codes of ``codes``, in order."""
    runs: list[tuple[int, int, int]] = []
    start = 0
    for index in range(1, len(codes) + 1):
        if index == len(codes) or codes[index] != codes[start]:
            runs.append((start, index, codes[start]))
            start = index
    return runs


def _merged(intervals: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for s, e in intervals:
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return tuple((s, e) for s, e in out)


def span_pieces(runs: list[tuple[int, int, int]], q_len: int, allowed) -> list[SpanPiece]:
    """The dense pieces of one sample for one head pattern (module docstring).

    ``runs``: `modality_runs` of the sample's K key codes; the queries are the last ``q_len`` positions;
    ``allowed[query code][key code]`` (4 x 4 of bool, `class_table` of one head). Query runs whose
    kept key set is empty get no piece (their output is zero)."""
    k_len = runs[-1][1] if runs else 0
    offset = k_len - q_len
    pieces: list[SpanPiece] = []
    for run_start, run_end, code in runs:
        if run_end <= offset:
            continue
        first = max(run_start, offset)  # the run's first query position
        prefix = [(max(s, 0), min(e, first)) for s, e, c in runs if s < first and allowed[code][c]]
        own = bool(allowed[code][code])
        intervals = _merged(prefix + ([(first, run_end)] if own else []))
        if not intervals:
            continue
        piece = SpanPiece(first - offset, run_end - offset, intervals, own)
        last = pieces[-1] if pieces else None
        if last is not None and own and last.causal and last.end == piece.start and \
                _merged(list(last.intervals) + [(first, run_end)]) == intervals:
            piece = SpanPiece(last.start, piece.end, intervals, True)  # the same call, extended
            pieces[-1] = piece
        else:
            pieces.append(piece)
    return pieces


_RUNS: dict[str, object] = {}  # the last modality tensor (weakly) and its runs: one host read per forward


def sample_runs(modality: torch.Tensor) -> list[list[tuple[int, int, int]]]:
    """`modality_runs` of each sample of ``modality`` int [B, K]; the last tensor's runs are kept, so the
    layers of one forward (which share the recorded modality tensor) read it to the host once. A tensor written in
    place is read again, except one made under ``torch.inference_mode`` (which keeps no version counter)."""
    ref = _RUNS.get("of")
    version = None if modality.is_inference() else modality._version  # inference tensors keep no version counter
    if ref is not None and ref() is modality and _RUNS.get("version") == version:
        return _RUNS["runs"]  # type: ignore[return-value]
    runs = [modality_runs(row) for row in modality.to("cpu", torch.long).tolist()]
    _RUNS.update(of=weakref.ref(modality), version=version, runs=runs)
    return runs


def head_patterns(keep: torch.Tensor) -> dict[tuple, list[int]]:
    """The heads of ``keep`` bool [H, 3] grouped by their `class_table` row (at most 8 patterns):
    ``{allowed [4][4] as tuples: [heads]}``."""
    table = class_table(keep).cpu().tolist()  # [H][4][4]
    patterns: dict[tuple, list[int]] = {}
    for head, rows in enumerate(table):
        patterns.setdefault(tuple(tuple(row) for row in rows), []).append(head)
    return patterns


class SpanCall(NamedTuple):
    """One SDPA call of `span_path_attention`: ``piece`` for the query ``heads`` (sorted) of the ``samples``."""

    piece: SpanPiece
    heads: tuple[int, ...]
    samples: tuple[int, ...]


def span_calls(runs: list[list[tuple[int, int, int]]], q_len: int, keep: torch.Tensor) -> list[SpanCall]:
    """The calls of `span_path_attention` for the samples' ``runs`` (`sample_runs`), the last ``q_len``
    positions as queries and ``keep`` bool [H, 3]: each head pattern's `span_pieces`, samples with the same
    pieces together, and patterns that share a piece for the same samples in one call."""
    calls: dict[tuple, set[int]] = {}
    for allowed, members in head_patterns(keep).items():
        by_pieces: dict[tuple, list[int]] = {}
        for b, sample in enumerate(runs):
            by_pieces.setdefault(tuple(span_pieces(sample, q_len, allowed)), []).append(b)
        for pieces, samples in by_pieces.items():
            for piece in pieces:
                calls.setdefault((piece, tuple(samples)), set()).update(members)
    return [SpanCall(piece, tuple(sorted(heads)), samples) for (piece, samples), heads in calls.items()]


def _keys(t: torch.Tensor, intervals: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """[.., m, D]: the key positions of ``intervals`` along dim 2 (a slice for one interval, one copy else)."""
    if len(intervals) == 1:
        s, e = intervals[0]
        return t[:, :, s:e]
    return torch.cat([t[:, :, s:e] for s, e in intervals], dim=2)


def _pick(t: torch.Tensor, rows: torch.Tensor | None, heads: torch.Tensor | None) -> torch.Tensor:
    """``t`` [B, H, ..] at the sample ``rows`` and the ``heads`` (None: all of them, no copy)."""
    t = t if rows is None else t.index_select(0, rows)
    return t if heads is None else t.index_select(1, heads)


def kv_heads_of(heads: tuple[int, ...], groups: int, kv_heads: int) -> tuple[tuple[int, ...] | None, bool]:
    """``(kv, gqa)`` for the query ``heads`` (sorted): with whole GQA groups, their key/value heads (None: all) read
    through SDPA's ``enable_gqa``; else one key/value head per query head."""
    kv = sorted({h // groups for h in heads})
    if len(heads) == len(kv) * groups:  # every query head of each of these kv heads, in order
        return (None if len(kv) == kv_heads else tuple(kv)), groups > 1
    return tuple(h // groups for h in heads), False


class _Prepared(NamedTuple):
    """A `SpanCall` with its index tensors on the device (None: every sample / head / key-value head)."""

    piece: SpanPiece
    rows: torch.Tensor | None
    heads: torch.Tensor | None
    kv: torch.Tensor | None
    gqa: bool


_PREPARED: OrderedDict = OrderedDict()  # (keep, layout, shapes, device) -> (weakref to keep, its calls), LRU
_PREPARED_SIZE = 256  # layers x layouts kept


def prepared_calls(runs: list[list[tuple[int, int, int]]], q_len: int, keep: torch.Tensor, heads: int, kv_heads: int,
                   device: torch.device) -> list[_Prepared]:
    """`span_calls` with their index tensors on ``device``, kept per (``keep`` tensor, layout): a layer's keep
    mask is read to the host and its index tensors copied to the device once per layout, not per call (``keep``
    written in place is read again)."""
    version = None if keep.is_inference() else keep._version
    key = (id(keep), version, tuple(tuple(sample) for sample in runs), q_len, heads, kv_heads, str(device))
    entry = _PREPARED.get(key)
    if entry is not None and entry[0]() is keep:
        _PREPARED.move_to_end(key)
        return entry[1]
    groups, batch = heads // kv_heads, len(runs)

    def index(values, every: int) -> torch.Tensor | None:
        return None if len(values) == every else torch.tensor(values, device=device)

    calls = []
    for piece, members, samples in span_calls(runs, q_len, keep):
        kv, gqa = kv_heads_of(members, groups, kv_heads)
        calls.append(_Prepared(piece, index(samples, batch), index(members, heads),
                               None if kv is None else torch.tensor(kv, device=device), gqa))
    _PREPARED[key] = (weakref.ref(keep), calls)
    while len(_PREPARED) > _PREPARED_SIZE:
        _PREPARED.popitem(last=False)
    return calls


def span_path_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, modality: torch.Tensor,
                        keep: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
    """[B, H, Q, D] path-sparse attention (the arguments of
    [`path_sparse_attention`][...path_sparse_attention], checked there) as the dense SDPA calls
    of `span_calls` (module docstring)."""
    from torch.nn.attention.bias import causal_lower_right

    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    upcast = query.device.type == "cpu" and query.dtype in (torch.bfloat16, torch.float16)
    q_all, k_all, v_all = (t.float() for t in (query, key, value)) if upcast else (query, key, value)
    out = torch.zeros(batch, heads, q_len, dim, dtype=q_all.dtype, device=query.device)
    for piece, rows, heads_index, kv_index, gqa in prepared_calls(sample_runs(modality), q_len, keep, heads, kv_heads,
                                                                  query.device):
        q = _pick(q_all[:, :, piece.start:piece.end], rows, heads_index)
        k, v = (_pick(_keys(t, piece.intervals), rows, kv_index) for t in (k_all, v_all))
        mask = causal_lower_right(piece.rows, piece.keys) if piece.lower_right else None
        if mask is not None and gqa:  # the lower-right causal kernels take matching heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        result = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=piece.square,
                                                                  scale=scale, enable_gqa=gqa and mask is None)
        target = out[:, :, piece.start:piece.end]
        if rows is None and heads_index is None:
            target.copy_(result)
        elif rows is None:
            target.index_copy_(1, heads_index, result)
        elif heads_index is None:
            target.index_copy_(0, rows, result)
        else:
            target[rows[:, None], heads_index[None, :]] = result
    return out.to(query.dtype)
