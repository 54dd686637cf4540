"""Which path-sparse attention backend a layer runs: a cost model over the work each one does (MWOP export).

MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs", appendix D.5) exports kernels that must
make prefill faster, and the fastest kernel depends on the layer's kept paths and the prompt's modality spans. For one
layer (``keep`` bool [H, 3]) and a token layout (the modality runs of one prompt) `attention_costs` estimates each
candidate's seconds from the work it does, with per-device constants (`KernelProfile`):

- ``"sdpa"`` (masked SDPA): build the [H, Q, K] keep mask (``mask_element_s`` per element), expand the GQA key/value
  heads, and compute every (query, key) pair of every head with an explicit mask (``masked_pair_s`` per pair and
  head-dimension element: no fused kernel takes an arbitrary mask, none skips the causal half);
- ``"span"`` (`span_attention`): per head pattern and `SpanPiece`, one fused SDPA call
  (``call_s`` per tensor op, ``fused_pair_s`` per computed pair and element: the prefix fully, the own block's lower
  triangle) plus the gathers it copies (``copy_byte_s`` per byte written);
- ``"flex"``: build the BlockMask (``block_mask_element_s`` per element) and compute every pair of each visited
  ``flex_block`` x ``flex_block`` block (``flex_pair_s``).

On the CPU a candidate's seconds are the sum of its host dispatch (``call_s`` per tensor op) and its work; on a GPU,
which runs the ops asynchronously, the larger of the two (`KernelProfile.total`). `choose_attention`
takes the cheapest. The Triton kernel is not a candidate: on the one GPU it was timed on
(an H200) its best configuration ran at 2.08x SDPA, and the other three cover what it does.

The constants are estimates, not fits: ``"cpu"``'s were timed on a 2-core x86 machine, one thread, fp32;
``"cuda"``'s are derived from an H200's dense causal SDPA (187 us for 28 heads x 3,252 tokens x 128 dims, bf16) and
its memory bandwidth. ``scripts/bench_prefill.py`` prints each candidate's measured time beside the choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from lightprune.width.kernels.span_attention import head_patterns, kv_heads_of, modality_runs, span_calls
from lightprune.width.paths import MODALITY_NAMES

__all__ = ["CANDIDATES", "FALLBACK_BACKEND", "KernelProfile", "PROFILES", "attention_costs", "choose_attention",
           "layout_runs", "measure_profile", "record_costs"]

#: the backends the cost model chooses from (the Triton kernel is never chosen: module docstring)
CANDIDATES = ("sdpa", "span", "flex")
#: what a layer whose export chose per device type runs on a device type the choice does not name (runs everywhere)
FALLBACK_BACKEND = "sdpa"
_CODES = {name: code for code, name in MODALITY_NAMES.items()}


@dataclass(frozen=True)
class KernelProfile:
    """Seconds per unit of work of each cost term, for one device type (module docstring)."""

    device: str
    call_s: float
    fused_pair_s: float
    masked_pair_s: float
    mask_element_s: float
    flex_pair_s: float
    block_mask_element_s: float
    copy_byte_s: float
    flex_block: int = 128
    overlap: bool = False

    def total(self, ops: int, work_s: float) -> float:
        """Seconds of ``ops`` tensor operations doing ``work_s`` of device work: their sum, or on a device that runs
        asynchronously (``overlap``) the larger of the host's dispatch time and the device's time."""
        host = ops * self.call_s
        return max(host, work_s) if self.overlap else host + work_s

    def record(self) -> dict:
        return asdict(self)


#: per device type; see the module docstring for where each number comes from
PROFILES: dict[str, KernelProfile] = {
    "cpu": KernelProfile(device="cpu", call_s=1.5e-5, fused_pair_s=6e-11, masked_pair_s=1.2e-10, mask_element_s=4e-9,
                         flex_pair_s=1.4e-9, block_mask_element_s=1.2e-8, copy_byte_s=1.4e-10),
    "cuda": KernelProfile(device="cuda", call_s=1e-5, fused_pair_s=1e-14, masked_pair_s=3e-14, mask_element_s=4e-12,
                          flex_pair_s=2e-14, block_mask_element_s=3e-13, copy_byte_s=4e-13, overlap=True),
}


def measure_profile(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, *,
                    tokens: int | None = None, heads: int = 8, head_dim: int = 64, repeats: int = 3) -> KernelProfile:
    """A `KernelProfile` timed on ``device`` (best of ``repeats`` after a warm-up, one shape per term): the
    host dispatch of a tiny SDPA call, dense causal SDPA per computed pair, masked SDPA per pair, the keep mask and
    the BlockMask per element, FlexAttention per visited pair (compiled on CUDA, eager elsewhere, as the backend runs
    it), and a gather per byte. ``tokens`` defaults to 512 on the CPU and 4,096 on a GPU."""
    import time

    from lightprune.width.kernels.path_attention import flex_path_attention, path_block_mask, path_keep_mask

    device = torch.device(device)
    cuda = device.type == "cuda"
    n = tokens or (4096 if cuda else 512)

    def seconds(fn, calls: int = 1) -> float:
        fn()
        best = float("inf")
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            if cuda:
                torch.cuda.synchronize(device)
            best = min(best, (time.perf_counter() - start) / calls)
        return best

    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, head_dim, generator=gen).to(device, dtype) for _ in range(3))
    tiny = [t[:, :1, :1, :8].contiguous() for t in (q, k, v)]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls = 50
    if cuda:  # the host's time to issue one call, not the device's
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            sdpa(*tiny)
        call_s = (time.perf_counter() - start) / calls
    else:
        call_s = seconds(lambda: sdpa(*tiny), calls)
    elements = heads * n * n
    fused = seconds(lambda: sdpa(q, k, v, is_causal=True)) / (heads * n * (n + 1) / 2 * head_dim)
    random_mask = torch.rand(1, heads, n, n, generator=gen).to(device) < 0.7
    masked = seconds(lambda: sdpa(q, k, v, attn_mask=random_mask)) / (elements * head_dim)
    thirds = [0] * (n // 3) + [1] * (n // 3) + [2] * (n - 2 * (n // 3))
    modality = torch.tensor([thirds], dtype=torch.int8, device=device)
    keep = (torch.rand(heads, 3, generator=gen) < 0.5).to(device)
    mask_element = seconds(lambda: path_keep_mask(modality, keep, n)) / elements
    index = torch.arange(0, n, 2, device=device)
    copy_byte = seconds(lambda: q.index_select(2, index)) / (heads * index.numel() * head_dim * q.element_size())
    block_mask = path_block_mask(modality, keep, heads, n)
    block_element = seconds(lambda: path_block_mask(modality, keep, heads, n), 1) / elements
    visited = int(block_mask.to_dense().sum()) * 128 * 128
    flex = seconds(lambda: flex_path_attention(q, k, v, modality, keep, block_mask=block_mask)) / (visited * head_dim)
    return KernelProfile(device=device.type, call_s=call_s, fused_pair_s=fused, masked_pair_s=masked,
                         mask_element_s=mask_element, flex_pair_s=flex, block_mask_element_s=block_element,
                         copy_byte_s=copy_byte, overlap=cuda)


def layout_runs(layout: Sequence) -> list[tuple[int, int, int]]:
    """The modality runs ``[(start, end, code)]`` of a token layout given as ``[(modality, length), ...]``
    (``modality`` a name of `MODALITY_NAMES` or its code) or as a flat sequence of
    codes; a bad entry is refused by name."""
    items = list(layout)
    if not items:
        raise ValueError("the token layout is empty: give [(modality, length), ...] with at least one token")
    codes: list[int] = []
    if all(isinstance(item, (list, tuple)) for item in items):
        for item in items:
            if len(item) != 2:
                raise ValueError(f"a layout entry must be (modality, length), got {item!r}")
            name, length = item
            code = _CODES.get(name, name)
            if code not in MODALITY_NAMES or isinstance(code, bool):
                raise ValueError(f"unknown modality {name!r} in the layout; use one of {sorted(_CODES)}")
            if isinstance(length, bool) or not isinstance(length, int) or length < 0:
                raise ValueError(f"the length of {name!r} must be an int >= 0, got {length!r}")
            codes += [int(code)] * length
    else:
        for code in items:
            if isinstance(code, bool) or not isinstance(code, int) or code not in MODALITY_NAMES:
                raise ValueError(f"layout codes must be ints in {sorted(MODALITY_NAMES)}, got {code!r}")
        codes = [int(code) for code in items]
    if not codes:
        raise ValueError("the token layout holds no token")
    return modality_runs(codes)


def _visited_blocks(runs, allowed: torch.Tensor, block: int) -> int:
    """Blocks of ``block`` x ``block`` (query, key) pairs holding a retained pair, for one head's ``allowed`` [4, 4]
    bool; the queries are every position (prefill). Below the diagonal a block is visited when a query code and a
    key code it holds are allowed; a diagonal block is checked pair by pair; above it none is."""
    codes = torch.tensor([c for s, e, c in runs for _ in range(e - s)])
    n = codes.numel()
    blocks = -(-n // block)
    present = torch.zeros(blocks, 4, dtype=torch.bool)
    present[torch.arange(n) // block, codes] = True
    below = (present.double() @ allowed.double() @ present.double().T > 0).tril(-1)
    padded = torch.nn.functional.pad(codes, (0, blocks * block - n)).view(blocks, block)
    valid = (torch.arange(blocks * block) < n).view(blocks, block)
    pairs = allowed[padded[:, :, None], padded[:, None, :]] & valid[:, :, None] & valid[:, None, :]
    diagonal = pairs.tril().flatten(1).any(dim=1)
    return int(below.sum()) + int(diagonal.sum())


def attention_costs(layout: Sequence, keep: torch.Tensor, *, kv_heads: int, head_dim: int,
                    element_bytes: int = 2, device: str | KernelProfile = "cuda") -> dict[str, float]:
    """Estimated seconds of each of `CANDIDATES` for one prefill of ``layout`` (`layout_runs`) through a
    layer with ``keep`` bool [H, 3] (v2v, t2v, t2t), ``kv_heads`` key/value heads of ``head_dim``, on ``device``'s
    `PROFILES` entry (or a `KernelProfile`)."""
    profile = _profile(device)
    runs = layout_runs(layout)
    keep = _check_keep(keep)
    heads = keep.shape[0]
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"{heads} query heads need a key/value head count that divides them, got {kv_heads}")
    groups = heads // kv_heads
    n = runs[-1][1]
    elements, row_bytes = heads * n * n, head_dim * element_bytes
    p = profile
    # masked SDPA: the keep mask, the GQA expansion, every pair of every head, the keyless rows zeroed
    sdpa_s = (p.mask_element_s * elements + p.masked_pair_s * elements * head_dim
              + p.copy_byte_s * ((2 * heads * n * row_bytes if groups > 1 else 0) + heads * n * row_bytes))
    span_ops, span_s = 2, p.copy_byte_s * heads * n * row_bytes  # the zeroed output and its cast
    for piece, members, _ in span_calls([runs], n, keep):
        h, rows_n, m = len(members), piece.rows, piece.keys
        kv, gqa = kv_heads_of(members, groups, kv_heads)
        kv_h = kv_heads if kv is None else len(kv)
        span_ops += 2  # SDPA and the output write
        span_s += p.fused_pair_s * h * piece.pairs * head_dim + p.copy_byte_s * h * rows_n * row_bytes
        if h < heads:
            span_ops += 1
            span_s += p.copy_byte_s * h * rows_n * row_bytes
        if len(piece.intervals) > 1:
            span_ops += 2
            span_s += p.copy_byte_s * 2 * kv_heads * m * row_bytes
        if kv is not None:
            span_ops += 2
            span_s += p.copy_byte_s * 2 * kv_h * m * row_bytes
        if piece.lower_right and gqa:  # key/value heads expanded
            span_ops += 2
            span_s += p.copy_byte_s * 2 * h * m * row_bytes
    flex_s = p.block_mask_element_s * elements
    for allowed, members in head_patterns(keep).items():
        visited = _visited_blocks(runs, torch.tensor(allowed, dtype=torch.bool), p.flex_block)
        flex_s += p.flex_pair_s * len(members) * visited * p.flex_block ** 2 * head_dim
    sdpa, span, flex = (p.total(ops, work) for ops, work in ((12, sdpa_s), (span_ops, span_s), (2, flex_s)))
    return {"sdpa": sdpa, "span": span, "flex": flex}


def choose_attention(layout: Sequence, keep: torch.Tensor, *, kv_heads: int, head_dim: int,
                     element_bytes: int = 2, device: str | KernelProfile = "cuda") -> tuple[str, dict[str, float]]:
    """``(backend, costs)``: the cheapest of `attention_costs` (ties go to the earlier of `CANDIDATES`)."""
    costs = attention_costs(layout, keep, kv_heads=kv_heads, head_dim=head_dim, element_bytes=element_bytes,
                            device=device)
    return min(CANDIDATES, key=lambda name: costs[name]), costs


def _profile(device: str | KernelProfile) -> KernelProfile:
    if isinstance(device, KernelProfile):
        return device
    kind = torch.device(device).type if isinstance(device, (str, torch.device)) else device
    if kind not in PROFILES:
        raise ValueError(f"no attention cost profile for device {device!r}; profiles: {sorted(PROFILES)} (or pass a "
                         f"KernelProfile)")
    return PROFILES[kind]


def _check_keep(keep) -> torch.Tensor:
    if not isinstance(keep, torch.Tensor) or keep.dtype != torch.bool or keep.dim() != 2 or keep.shape[1] != 3 \
            or not keep.shape[0]:
        got = f"{keep.dtype} {tuple(keep.shape)}" if isinstance(keep, torch.Tensor) else type(keep).__name__
        raise ValueError(f"keep must be a bool [H, 3] tensor (v2v, t2v, t2t per head), got {got}")
    return keep.cpu()


def record_costs(costs: Mapping[str, float]) -> dict[str, float]:
    """The costs as the export records them (seconds, 4 significant digits)."""
    return {name: float(f"{costs[name]:.4g}") for name in CANDIDATES}
