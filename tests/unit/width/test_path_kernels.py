"""Path-sparse attention kernels (lightprune.width.kernels) against independent computations.

Every backend is compared with an fp64 softmax over the retained keys written out below (the path rule
spelled out again here, independently of the library's ``path_masks``), and with the masked-SDPA
backend; the interval table with a brute-force scan. The Triton kernel runs under its CPU interpreter in
a child pytest of this file (``test_triton_interpreter``): triton picks the interpreter when it is
imported, so ``TRITON_INTERPRET=1`` is set in the child's environment and never in this process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from lightprune.width.kernels import (
    BACKENDS,
    check_backend,
    class_bits,
    key_intervals,
    path_block_mask,
    path_keep_mask,
    path_sparse_attention,
)

S, V, T, P = 0, 1, 2, 3  # SYSTEM, VISION, TEXT, PAD
K_LEN, D, BLOCK = 70, 16, 16
_CHILD_VAR = "LIGHTPRUNE_TRITON_INTERPRET_CHILD"
_CHILD = os.environ.get(_CHILD_VAR) == "1"


def _layout(*spans: tuple[int, int]) -> list[int]:
    return [code for code, n in spans for _ in range(n)]


# spans chosen so that block boundaries (multiples of 16) fall inside modality runs
LAYOUTS = {
    "system_vision_text": _layout((S, 5), (V, 37), (T, 28)),
    "two_vision_spans": _layout((S, 3), (V, 20), (T, 9), (V, 25), (T, 13)),
    "text_only": _layout((T, 70)),
    "vision_only": _layout((V, 70)),
    "pad_left": _layout((P, 9), (S, 4), (V, 30), (T, 27)),
    "pad_right": _layout((S, 2), (V, 33), (T, 24), (P, 11)),
}
# columns v2v, t2v, t2t; two plans cover every family: all kept, each path pruned alone, all pruned, pairs
KEEPS = {
    "singles": [[1, 1, 1], [0, 1, 1], [1, 0, 1], [1, 1, 0]],
    "pairs_and_none": [[0, 0, 0], [0, 0, 1], [1, 0, 0], [0, 1, 0]],
}


def _modality() -> torch.Tensor:
    return torch.tensor(list(LAYOUTS.values()), dtype=torch.int8)


def _keep(name: str) -> torch.Tensor:
    return torch.tensor(KEEPS[name], dtype=torch.bool)


def _reference_mask(modality: torch.Tensor, keep: torch.Tensor, q_len: int) -> torch.Tensor:
    """bool [B, H, Q, K], the rule written out: causal, no PAD key, V2V / T2V / T2T dropped per head."""
    k_len = modality.shape[1]
    qm = modality[:, k_len - q_len:, None].long()[:, None]  # [B, 1, Q, 1]
    km = modality[:, None, :].long()[:, None]  # [B, 1, 1, K]
    kp = keep[None, :, :, None, None]  # [1, H, 3, 1, 1]
    pruned = ((qm == V) & (km == V) & ~kp[:, :, 0]) | ((qm == T) & (km == V) & ~kp[:, :, 1]) \
        | ((qm == T) & (km == T) & ~kp[:, :, 2])
    pos = torch.arange(k_len, device=modality.device)
    causal = pos[None, :] <= pos[k_len - q_len:, None]
    return causal & (km != P) & ~pruned


def _reference(q, k, v, modality, keep) -> torch.Tensor:
    """fp64: softmax over the retained keys only; a query without one is zero."""
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    mask = _reference_mask(modality, keep, q.shape[2])
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    top = scores.amax(dim=-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    weights = torch.exp(scores - top)  # exactly 0 on removed keys
    total = weights.sum(dim=-1, keepdim=True)
    return (weights / total.clamp_min(1e-300)) @ v


def _inputs(q_len: int, dtype: torch.dtype, heads: int = 4, kv_heads: int = 2, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    batch = len(LAYOUTS)
    q = torch.randn(batch, heads, K_LEN, D, generator=gen)[:, :, K_LEN - q_len:]
    k = torch.randn(batch, kv_heads, K_LEN, D, generator=gen)
    v = torch.randn(batch, kv_heads, K_LEN, D, generator=gen)
    return q.to(dtype).contiguous(), k.to(dtype), v.to(dtype)


# ---------------------------------------------------------------- the reference itself is not vacuous
def test_reference_mask_matches_library_rule_and_prunes():
    modality = _modality()
    for name in KEEPS:
        keep = _keep(name)
        for q_len in (K_LEN, 23):
            assert torch.equal(_reference_mask(modality, keep, q_len), path_keep_mask(modality, keep, q_len))
    mask = _reference_mask(modality, _keep("singles"), K_LEN)
    assert (mask[:, 0].sum() > mask[:, 1].sum()) and (mask[:, 0].sum() > mask[:, 3].sum())
    empty = ~_reference_mask(modality, _keep("pairs_and_none"), K_LEN).any(-1)
    assert empty[3, 0].all()  # vision-only sample, V2V pruned: no query keeps a key
    assert empty[4, :, :9].all() and not empty[0, 0, :5].any()  # left PAD queries; SYSTEM queries keep keys


# ---------------------------------------------------------------- interval table
def _brute_intervals(mask: torch.Tensor, block: int) -> list:
    """[b][h][n] -> list of (start, end): runs of the union of the block's rows, by a plain scan."""
    batch, heads, q_len, k_len = mask.shape
    out = []
    for b in range(batch):
        out.append([])
        for h in range(heads):
            out[b].append([])
            for n0 in range(0, q_len, block):
                union = mask[b, h, n0:n0 + block].any(0).tolist()
                runs, start = [], None
                for j in range(k_len + 1):
                    inside = j < k_len and union[j]
                    if inside and start is None:
                        start = j
                    if not inside and start is not None:
                        runs.append((start, j))
                        start = None
                out[b][h].append(runs)
    return out


@pytest.mark.parametrize("block", [16, 32])
@pytest.mark.parametrize("q_len", [K_LEN, 23, 1])
@pytest.mark.parametrize("keep_name", sorted(KEEPS))
def test_key_intervals_match_brute_force(keep_name, q_len, block):
    modality, keep = _modality(), _keep(keep_name)
    table = key_intervals(modality, keep, q_len, block)
    expected = _brute_intervals(_reference_mask(modality, keep, q_len), block)
    n_blocks = -(-q_len // block)
    assert table.dtype == torch.int32 and tuple(table.shape[:3]) == (len(LAYOUTS), 4, n_blocks)
    assert table.shape[3] == max(len(r) for rows in expected for per_h in rows for r in per_h)
    for b, rows in enumerate(expected):
        for h, per_h in enumerate(rows):
            for n, runs in enumerate(per_h):
                got = [tuple(x) for x in table[b, h, n].tolist()]
                assert got[:len(runs)] == runs, (b, h, n)
                assert all(x == (0, 0) for x in got[len(runs):]), (b, h, n)


def test_class_bits_pack_the_rule():
    keep = _keep("singles")
    bits = class_bits(keep)
    rows = _reference_mask(torch.tensor([[S, V, T, P] * 4]), keep, 16)  # any query code against any key code
    for h in range(4):
        for qc in range(4):
            for kc in range(4):
                # query qc at position 12 + qc sees key kc at position kc (causal) iff the bit is set
                assert bool(bits[h] >> (qc * 4 + kc) & 1) == bool(rows[0, h, 12 + qc, kc]), (h, qc, kc)


def test_key_intervals_skip_pruned_spans():
    # T2T pruned head, last block of the text-only sample: nothing remains; V2V pruned: vision block sees
    # only the system prefix
    modality, keep = _modality(), _keep("singles")
    table = key_intervals(modality, keep, K_LEN, BLOCK)
    assert table[2, 3, -1].tolist() == [[0, 0]] * table.shape[3]
    assert table[0, 1, 1, 0].tolist() == [0, 5]


# ---------------------------------------------------------------- backends against the fp64 reference
def _check(backend: str, q_len: int, dtype: torch.dtype, keep_name: str):
    modality, keep = _modality(), _keep(keep_name)
    q, k, v = _inputs(q_len, dtype)
    want = _reference(q, k, v, modality, keep)
    got = path_sparse_attention(q, k, v, modality, keep, backend=backend)
    sdpa = path_sparse_attention(q, k, v, modality, keep, backend="sdpa")
    assert got.dtype == dtype and got.shape == q.shape
    if dtype == torch.float32:
        atol = 2e-5
    else:
        # inputs are exact in bf16 (the reference uses the same rounded values); the output is a convex
        # combination of v rounded once to bf16 (relative 2^-9) and, on GPU, P rounded to bf16 before PV:
        # |error| <= 2 * 2^-8 * max|v|
        atol = 2 * 2.0 ** -8 * float(v.abs().max())
    torch.testing.assert_close(got.double(), want, rtol=0, atol=atol)
    torch.testing.assert_close(got.double(), sdpa.double(), rtol=0, atol=atol)
    empty = ~_reference_mask(modality, keep, q_len).any(-1)
    assert torch.equal(got[empty], torch.zeros_like(got[empty]))
    return empty


@pytest.mark.parametrize("keep_name", sorted(KEEPS))
@pytest.mark.parametrize("q_len", [K_LEN, 23])
@pytest.mark.parametrize("backend", ["sdpa", "flex", "span"])
def test_torch_backends_match_reference(backend, q_len, keep_name):
    _check(backend, q_len, torch.float32, keep_name)


@pytest.mark.parametrize("backend", ["sdpa", "flex", "span"])
def test_torch_backends_bf16(backend):
    _check(backend, K_LEN, torch.bfloat16, "singles")


@pytest.mark.parametrize("backend", ["sdpa", "flex", "span"])
def test_torch_backends_single_query(backend):
    _check(backend, 1, torch.float32, "pairs_and_none")  # decode: the last position only


def _check_never_reads_pruned_keys(backend: str) -> None:
    """V2V and T2V pruned on every head: no query retains a vision key. Their K / V are NaN: a dense computation
    (SDPA) turns NaN, ``backend`` stays exact because it never reads them into a product."""
    modality = torch.tensor([_layout((S, 5), (V, 40), (T, 25))] * 2, dtype=torch.int8)
    keep = torch.tensor([[0, 0, 1]] * 4, dtype=torch.bool)
    q, k, v = _inputs(K_LEN, torch.float32, seed=2)
    q, k, v = q[:2], k[:2].clone(), v[:2].clone()
    want = _reference(q, k, v, modality, keep)
    k[:, :, 5:45], v[:, :, 5:45] = float("nan"), float("nan")
    assert path_sparse_attention(q, k, v, modality, keep, backend="sdpa").isnan().any()
    got = path_sparse_attention(q, k, v, modality, keep, backend=backend)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)


if _CHILD:  # the Triton tests exist only in the TRITON_INTERPRET=1 subprocess (see test_triton_interpreter)

    @pytest.mark.parametrize("keep_name", sorted(KEEPS))
    @pytest.mark.parametrize("q_len", [K_LEN, 23])
    def test_interp_triton_matches_reference(q_len, keep_name):
        empty = _check("triton", q_len, torch.float32, keep_name)
        if keep_name == "pairs_and_none":
            assert empty.any()  # the zero-row case is exercised

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_interp_triton_half_precision(dtype):
        _check("triton", K_LEN, dtype, "singles")

    def test_interp_triton_mha_and_block_sizes():
        from lightprune.width.kernels.path_attention_triton import interpreting, triton_path_attention

        assert interpreting()
        rows = [0, 1, 4]  # system + vision + text, two vision spans, left padding: enough for the options
        modality, keep = _modality()[rows], _keep("singles")
        q, k, v = (t[rows] for t in _inputs(K_LEN, torch.float32, heads=4, kv_heads=4, seed=1))
        want = _reference(q, k, v, modality, keep)
        got = triton_path_attention(q, k, v, modality, keep, block_m=32, block_n=16, scale=D ** -0.5)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)
        intervals = key_intervals(modality, keep, K_LEN, 16)
        again = triton_path_attention(q, k, v, modality, keep, block_m=16, intervals=intervals,
                                      bits=class_bits(keep))
        torch.testing.assert_close(again.double(), want, rtol=0, atol=2e-5)
        q1 = q[:, :, -1:].contiguous()  # decode: one query, the last position
        one = triton_path_attention(q1, k, v, modality, keep)
        torch.testing.assert_close(one.double(), want[:, :, -1:], rtol=0, atol=2e-5)
        with pytest.raises(ValueError, match="intervals must be"):
            triton_path_attention(q, k, v, modality, keep, block_m=32, intervals=intervals)

    def test_interp_triton_never_reads_pruned_keys():
        _check_never_reads_pruned_keys("triton")

else:

    @pytest.mark.exhaustive
    def test_triton_interpreter():
        """The Triton tests above, in a child pytest with TRITON_INTERPRET=1 set before triton is imported."""
        env = {**os.environ, "TRITON_INTERPRET": "1", _CHILD_VAR: "1"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "test_interp_"]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        tail = (done.stdout[-6000:] + done.stderr[-2000:])
        assert done.returncode == 0, tail
        assert re.search(r"\b8 passed\b", done.stdout) and "skipped" not in done.stdout, tail


def test_span_backend_never_reads_pruned_keys_and_runs_mha():
    """V2V and T2V pruned on every head: the span backend gathers no vision key, so NaN vision keys and values
    leave it exact (masked SDPA turns NaN); one head per key/value head (MHA) and mixed patterns too."""
    _check_never_reads_pruned_keys("span")
    q, k, v = _inputs(K_LEN, torch.float32, heads=4, kv_heads=4, seed=3)
    keep = torch.tensor([[1, 1, 1], [0, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    got = path_sparse_attention(q, k, v, _modality(), keep, backend="span")
    torch.testing.assert_close(got.double(), _reference(q, k, v, _modality(), keep), rtol=0, atol=2e-5)


def test_modality_runs_are_the_maximal_runs():
    from lightprune.width.kernels.span_attention import modality_runs

    assert modality_runs([0, 0, 1, 1, 1, 2, 1]) == [(0, 2, 0), (2, 5, 1), (5, 6, 2), (6, 7, 1)]
    assert modality_runs([2]) == [(0, 1, 2)]
    assert modality_runs([]) == []


# runs of length 1 everywhere, a one-token image between text, and a padded sample: the pieces' edge cases
SHORT_RUNS = [_layout((S, 1), (V, 1), (T, 1), (V, 30), (T, 1), (V, 1), (T, 35)),
              _layout((P, 1), (S, 1), (T, 1), (V, 1), (T, 66)),
              _layout((V, 1), (T, 69))]


def _pieces_mask(pieces, q_len: int, k_len: int) -> torch.Tensor:
    """bool [Q, K] that the pieces attend: each piece's rows see its keys, the last n under the lower-right
    causal rule (written out here: row r of n sees keys 0 .. m - n + r of its m)."""
    mask = torch.zeros(q_len, k_len, dtype=torch.bool)
    for piece in pieces:
        keys = [j for s, e in piece.intervals for j in range(s, e)]
        n, m = piece.end - piece.start, len(keys)
        for r in range(n):
            seen = keys[:m - n + r + 1] if piece.causal else keys
            mask[piece.start + r, seen] = True
    return mask


@pytest.mark.parametrize("q_len", [K_LEN, 23, 1])
def test_span_pieces_cover_exactly_the_retained_keys(q_len):
    """Every head pattern of both plans on every layout: the keys the pieces attend are the reference rule's,
    query by query; an all-kept pattern on an unpadded sample is one causal call over every key."""
    from lightprune.width.kernels import class_table
    from lightprune.width.kernels.span_attention import modality_runs, span_pieces

    layouts = list(LAYOUTS.values()) + SHORT_RUNS
    modality = torch.tensor(layouts, dtype=torch.int8)
    for name in KEEPS:
        keep = _keep(name)
        want = _reference_mask(modality, keep, q_len)
        table = class_table(keep).tolist()
        for b, codes in enumerate(layouts):
            for h in range(keep.shape[0]):
                pieces = span_pieces(modality_runs(codes), q_len, table[h])
                assert torch.equal(_pieces_mask(pieces, q_len, K_LEN), want[b, h]), (name, b, h)
                if keep[h].all() and P not in codes:
                    assert pieces == [(0, q_len, ((0, K_LEN),), True)]


@pytest.mark.parametrize("q_len", [K_LEN, 23, 1])
@pytest.mark.parametrize("heads,kv_heads,rows", [
    (4, 2, [[1, 1, 0], [1, 1, 0], [0, 1, 1], [0, 1, 1]]),  # patterns of whole GQA groups (enable_gqa)
    (4, 2, [[1, 1, 1]] * 4),  # every head kept: one dense causal call, GQA heads expanded for the causal mask
    (6, 2, [[1, 1, 1], [0, 0, 1], [1, 1, 1], [1, 0, 1], [0, 0, 0], [1, 0, 1]]),  # groups split across patterns
    (3, 3, [[0, 1, 1], [1, 1, 1], [0, 1, 0]]),  # MHA
])
def test_span_backend_on_short_runs_and_head_groupings(heads, kv_heads, rows, q_len):
    """Against the fp64 reference and the masked SDPA backend, with samples that share their pieces (one batched
    call) and samples that do not."""
    layouts = SHORT_RUNS + [SHORT_RUNS[0], list(LAYOUTS.values())[0]]
    modality = torch.tensor(layouts, dtype=torch.int8)
    keep = torch.tensor(rows, dtype=torch.bool)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(len(layouts), heads, K_LEN, D, generator=gen)[:, :, K_LEN - q_len:].contiguous()
    k, v = (torch.randn(len(layouts), kv_heads, K_LEN, D, generator=gen) for _ in range(2))
    got = path_sparse_attention(q, k, v, modality, keep, backend="span")
    torch.testing.assert_close(got.double(), _reference(q, k, v, modality, keep), rtol=0, atol=2e-5)
    sdpa = path_sparse_attention(q, k, v, modality, keep, backend="sdpa")
    torch.testing.assert_close(got, sdpa, rtol=0, atol=2e-5)
    empty = ~_reference_mask(modality, keep, q_len).any(-1)
    assert torch.equal(got[empty], torch.zeros_like(got[empty]))


def test_span_calls_are_planned_once_per_layer_and_layout(monkeypatch):
    """The calls and their index tensors are made once per keep mask and layout: a second forward over the same
    layout reads nothing to plan; another keep mask, one written in place, or another layout is planned again."""
    from lightprune.width.kernels import span_attention

    planned = []
    real = span_attention.span_calls
    monkeypatch.setattr(span_attention, "span_calls", lambda *a: planned.append(1) or real(*a))
    q, k, v = _inputs(K_LEN, torch.float32)
    keep = _keep("singles").clone()
    first = path_sparse_attention(q, k, v, _modality(), keep, backend="span")
    path_sparse_attention(q, k, v, _modality(), keep, backend="span")  # a new modality tensor, the same layout
    assert len(planned) == 1
    other = _keep("pairs_and_none")
    path_sparse_attention(q, k, v, _modality(), other, backend="span")
    assert len(planned) == 2
    keep[0, 0] = False  # in place: planned again, and the result follows
    changed = path_sparse_attention(q, k, v, _modality(), keep, backend="span")
    assert len(planned) == 3
    torch.testing.assert_close(changed.double(), _reference(q, k, v, _modality(), keep), rtol=0, atol=2e-5)
    assert not torch.equal(changed, first)
    q23 = q[:, :, K_LEN - 23:].contiguous()
    path_sparse_attention(q23, k, v, _modality(), keep, backend="span")  # other queries: another layout
    assert len(planned) == 4


def test_span_runs_are_read_once_per_modality_tensor(monkeypatch):
    """The layers of one forward share the recorded modality tensor: its runs are read to the host once, and a
    changed tensor (another object, or the same one written in place) is read again."""
    from lightprune.width.kernels import span_attention

    calls = []
    real = span_attention.modality_runs
    monkeypatch.setattr(span_attention, "modality_runs", lambda codes: calls.append(1) or real(codes))
    modality = _modality()
    q, k, v = _inputs(K_LEN, torch.float32)
    keep = _keep("singles")
    first = path_sparse_attention(q, k, v, modality, keep, backend="span")
    path_sparse_attention(q, k, v, modality, keep, backend="span")
    assert len(calls) == modality.shape[0]
    modality[0, :5] = T  # in place: read again, and the result follows
    again = path_sparse_attention(q, k, v, modality, keep, backend="span")
    assert len(calls) == 2 * modality.shape[0]
    torch.testing.assert_close(again.double(), _reference(q, k, v, modality, keep), rtol=0, atol=2e-5)
    assert not torch.equal(again[0], first[0])


def test_block_mask_skips_pruned_blocks():
    modality, keep = _modality(), _keep("singles")
    got = path_block_mask(modality, keep, 4, 23, block_size=16).to_dense().bool()  # [B, H, nq, nk]
    mask = _reference_mask(modality, keep, 23)
    pad_q, pad_k = -(-23 // 16) * 16 - 23, -(-K_LEN // 16) * 16 - K_LEN
    mask = torch.nn.functional.pad(mask, (0, pad_k, 0, pad_q))
    blocks = mask.unflatten(2, (-1, 16)).unflatten(4, (-1, 16)).any(dim=5).any(dim=3)
    assert torch.equal(got, blocks)
    assert blocks[:, 1].sum() < blocks[:, 0].sum()  # V2V pruned: fewer key blocks than all kept


@pytest.mark.skipif(_CHILD or bool(os.environ.get("TRITON_INTERPRET")), reason="the compiled kernel only")
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_triton_kernel_compiles_for_cuda(dtype):
    """Compile (no launch, no GPU needed) the kernel to a cubin for sm_90 at a 7B-like head shape."""
    pytest.importorskip("triton")
    from triton import compile as triton_compile
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lightprune.width.kernels.path_attention_triton import _path_attention_fwd

    names = _path_attention_fwd.arg_names
    pointers = {"Q": dtype, "K": dtype, "V": dtype, "Out": dtype, "Mod": "i8", "Bits": "i32", "Iv": "i32"}
    const = dict(HEAD_DIM=128, BLOCK_M=64, BLOCK_N=64, BLOCK_D=128, NUM_CODES=4, UPCAST=False,
                 PRECISION="ieee" if dtype == "fp32" else "tf32")
    sig = {n: "*" + pointers[n] if n in pointers else "constexpr" if n in const else "fp32" if n == "qk_scale"
           else "i32" for n in names}
    src = ASTSource(_path_attention_fwd, sig, constexprs={(names.index(k),): v for k, v in const.items()})
    kernel = triton_compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
    assert "cubin" in kernel.asm and "tt.dot" in kernel.asm["ttir"]
    dots = [line for line in kernel.asm["ttir"].splitlines() if "tt.dot" in line]
    assert len(dots) == 2  # Q·K and P·V
    if dtype == "fp32":  # both in IEEE fp32: a TF32 product was 0.87e-3 off on an H200 (the GPU test's 2e-5)
        assert not any("tf32" in line for line in dots), dots


# ---------------------------------------------------------------- errors and laziness
def test_check_backend_errors(monkeypatch):
    with pytest.raises(ValueError, match=r"'cuda_graph'.*\['triton', 'flex', 'span', 'sdpa'\]"):
        check_backend("cuda_graph", torch.device("cpu"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="'triton' on cpu.*TRITON_INTERPRET=1"):
        check_backend("triton", torch.device("cpu"))
    with pytest.raises(RuntimeError, match="'flex' on meta"):
        check_backend("flex", torch.device("meta"))
    check_backend("sdpa", torch.device("cpu"))
    check_backend("span", torch.device("cpu"))
    assert BACKENDS == ("triton", "flex", "span", "sdpa")


def test_input_errors():
    modality = _modality()
    q, k, v = _inputs(K_LEN, torch.float32, heads=3, kv_heads=2)
    with pytest.raises(ValueError, match="multiple of key/value heads 2"):
        path_sparse_attention(q, k, v, modality, torch.ones(3, 3, dtype=torch.bool))
    q, k, v = _inputs(K_LEN, torch.float32)
    with pytest.raises(ValueError, match=r"keep must be bool \[H=4, 3\]"):
        path_sparse_attention(q, k, v, modality, torch.ones(4, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"modality must be \[B, K\]"):
        path_sparse_attention(q, k, v, modality[:, 1:], torch.ones(4, 3, dtype=torch.bool))


def test_import_is_lazy_and_late_interpreter_is_refused():
    # one child process: importing lightprune.width.kernels does not import triton; TRITON_INTERPRET=1 set after
    # triton's import is a clear error (the interpreter is chosen at import), not an obscure kernel failure
    code = (
        "import os, sys, lightprune, lightprune.width.kernels as kn\n"
        "assert 'triton' not in sys.modules, 'triton imported'\n"
        "import triton\n"
        "os.environ['TRITON_INTERPRET'] = '1'\n"
        "try:\n"
        "    kn.check_backend('triton', 'cpu')\n"
        "except RuntimeError as err:\n"
        "    print(err)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "TRITON_INTERPRET=1 was set after triton was imported" in done.stdout, done.stdout


# ---------------------------------------------------------------- GPU: the compiled kernel at a larger shape
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.skipif(_CHILD or bool(os.environ.get("TRITON_INTERPRET")), reason="the compiled kernel only")
def test_gpu_backends_match_reference():
    gen = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, k_len, dim = 2, 28, 4, 1100, 128
    rows = [_layout((S, 18), (V, 900), (T, 182)), _layout((S, 11), (V, 300), (T, 40), (V, 500), (T, 149), (P, 100))]
    modality = torch.tensor(rows, dtype=torch.int8).cuda()
    keep = (torch.rand(heads, 3, generator=gen) < 0.6).cuda()
    keep[0] = False
    q, k, v = (torch.randn(batch, h, k_len, dim, generator=gen).cuda().to(torch.bfloat16)
               for h in (heads, kv_heads, kv_heads))
    want = _reference(q, k, v, modality, keep)  # fp64 on the GPU, from the bf16 inputs
    bf16_tol = 2 * 2.0 ** -8 * float(v.abs().max())
    for backend in ("triton", "flex", "sdpa"):
        got = path_sparse_attention(q, k, v, modality, keep, backend=backend)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.double(), want, rtol=0, atol=bf16_tol, msg=lambda m: f"{backend}: {m}")
    fp32 = path_sparse_attention(q.float(), k.float(), v.float(), modality, keep, backend="triton")
    torch.testing.assert_close(fp32.double(), want, rtol=0, atol=2e-5)  # IEEE fp32 dots, not TF32
