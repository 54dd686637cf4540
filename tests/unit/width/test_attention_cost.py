"""The attention cost model (lightprune.width.kernels.attention_cost): its work counts against brute force, and its
choice on shapes whose answer is known."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lightprune.width.kernels import path_block_mask, path_keep_mask
from lightprune.width.kernels.attention_cost import (
    CANDIDATES,
    PROFILES,
    KernelProfile,
    attention_costs,
    choose_attention,
    layout_runs,
)

S, V, T = 0, 1, 2
LAYOUT = [("system", 5), ("vision", 150), ("text", 23), ("vision", 40), ("text", 30)]
# v2v, t2v, t2t per head: every pattern family, two kv groups of four
KEEP = torch.tensor([[1, 1, 1], [0, 1, 1], [1, 0, 1], [1, 1, 0], [0, 0, 0], [0, 0, 1], [1, 0, 0], [1, 1, 1]],
                    dtype=torch.bool)


def _codes(layout) -> torch.Tensor:
    names = {"system": S, "vision": V, "text": T}
    return torch.tensor([[names[name] for name, n in layout for _ in range(n)]], dtype=torch.int8)


def _only(**rates) -> KernelProfile:
    """A profile charging only the named terms (every other one zero), 1 s per unit."""
    zero = {f.name: 0.0 for f in dataclasses.fields(KernelProfile) if f.name not in ("device", "flex_block", "overlap")}
    return KernelProfile(device="test", **{**zero, **rates}, flex_block=16)


def test_span_work_is_the_retained_pairs_and_flex_the_visited_blocks():
    """With only the pair rates charged, span costs exactly the retained (query, key) pairs of the rule (counted on
    the dense keep mask), masked SDPA every pair, FlexAttention every pair of the BlockMask's visited blocks."""
    codes, dim = _codes(LAYOUT), 8
    n, heads = codes.shape[1], KEEP.shape[0]
    retained = int(path_keep_mask(codes, KEEP).sum())
    blocks = int(path_block_mask(codes, KEEP, heads, block_size=16).to_dense().sum())
    costs = attention_costs(LAYOUT, KEEP, kv_heads=2, head_dim=dim,
                            device=_only(fused_pair_s=1.0, masked_pair_s=1.0, flex_pair_s=1.0))
    assert costs == {"sdpa": heads * n * n * dim, "span": retained * dim, "flex": blocks * 16 * 16 * dim}
    assert retained < blocks * 256 < heads * n * n  # the three differ: the test can tell them apart


def test_mask_and_block_mask_terms_scale_with_every_element():
    n = sum(length for _, length in LAYOUT)
    costs = attention_costs(LAYOUT, KEEP, kv_heads=2, head_dim=8,
                            device=_only(mask_element_s=1.0, block_mask_element_s=10.0))
    assert costs == {"sdpa": 8 * n * n, "span": 0.0, "flex": 10.0 * 8 * n * n}


def test_overlap_takes_the_larger_of_host_and_device():
    base = _only(call_s=1.0, fused_pair_s=1e-9)
    summed = attention_costs(LAYOUT, KEEP, kv_heads=2, head_dim=8, device=base)["span"]
    overlapped = attention_costs(LAYOUT, KEEP, kv_heads=2, head_dim=8,
                                 device=dataclasses.replace(base, overlap=True))["span"]
    ops = round(summed)  # the host part: one second per op
    assert overlapped == pytest.approx(ops) and summed == pytest.approx(ops + (summed - ops))
    assert summed > overlapped


@pytest.mark.parametrize("device", sorted(PROFILES))
def test_nearly_every_path_kept_on_a_long_prompt_span_beats_masked_sdpa(device):
    """Fused calls over half the pairs, no mask to build: the span backend costs less than half of masked SDPA on
    every device, and on the CPU (where FlexAttention runs eager) it is the choice."""
    keep = torch.ones(8, 3, dtype=torch.bool)
    keep[0, 0] = False  # one pruned path, so the layer is exported with a path-sparse backend
    layout = [("system", 16), ("vision", 6000), ("text", 200)]
    name, costs = choose_attention(layout, keep, kv_heads=2, head_dim=64, device=device)
    assert costs["span"] < costs["sdpa"] / 2
    assert name == "span" or device != "cpu"


def test_a_handful_of_tokens_over_many_patterns_chooses_masked_sdpa_on_the_cpu():
    """A few tokens: the work is nothing, the calls are everything; masked SDPA makes the fewest."""
    name, costs = choose_attention([("system", 1), ("vision", 2), ("text", 2)], KEEP, kv_heads=2, head_dim=8,
                                   device="cpu")
    assert name == "sdpa" and costs["span"] > costs["sdpa"]


def test_the_cheapest_candidate_is_chosen():
    profile = _only(fused_pair_s=1.0, masked_pair_s=1.0, flex_pair_s=1e-6)
    name, costs = choose_attention(LAYOUT, KEEP, kv_heads=2, head_dim=8, device=profile)
    assert name == "flex" == min(CANDIDATES, key=costs.__getitem__)


def test_layouts_and_bad_inputs_are_named():
    assert layout_runs([("system", 2), ("vision", 0), ("text", 1)]) == [(0, 2, S), (2, 3, T)]
    assert layout_runs([V, V, T]) == [(0, 2, V), (2, 3, T)]
    with pytest.raises(ValueError, match="unknown modality 'image'"):
        layout_runs([("image", 3)])
    with pytest.raises(ValueError, match="length of 'text' must be an int >= 0, got -1"):
        layout_runs([("text", -1)])
    with pytest.raises(ValueError, match="holds no token"):
        layout_runs([("text", 0)])
    with pytest.raises(ValueError, match="keep must be a bool"):
        attention_costs(LAYOUT, KEEP.int(), kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="divides them, got 3"):
        attention_costs(LAYOUT, KEEP, kv_heads=3, head_dim=8)
    with pytest.raises(ValueError, match="no attention cost profile for device 'mps'"):
        attention_costs(LAYOUT, KEEP, kv_heads=2, head_dim=8, device="mps")


def test_a_profile_measured_here_is_positive_and_usable():
    from lightprune.width.kernels.attention_cost import measure_profile

    profile = measure_profile("cpu", tokens=96, heads=2, head_dim=16, repeats=1)
    values = dataclasses.asdict(profile)
    assert profile.device == "cpu" and profile.overlap is False and profile.flex_block == 128
    rates = {k: v for k, v in values.items() if k.endswith("_s")}
    assert len(rates) == 7 and all(0 < v < 1 for v in rates.values()), rates
    name, costs = choose_attention(LAYOUT, KEEP, kv_heads=2, head_dim=8, device=profile)
    assert name in CANDIDATES and all(c > 0 for c in costs.values())
