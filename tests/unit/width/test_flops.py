"""decoder_flops (MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), appendix D.4)
against the paper's dense totals and a brute-force count on tiny configs."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen2Config

from lightprune.width.flops import decoder_flops
from lightprune.width.paths import PATHS
from lightprune.width.plan import WidthPlan


def _qwen2_7b(vocab: int) -> Qwen2Config:
    return Qwen2Config(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
                       num_hidden_layers=28, vocab_size=vocab)


@pytest.mark.parametrize("vocab, profile, tflops", [(152128, (3215, 19), 44.31), (152064, (485, 38), 6.88)])
def test_paper_dense_totals(vocab, profile, tflops):
    count = decoder_flops(_qwen2_7b(vocab), *profile)
    assert round(count.total / 1e12, 2) == tflops
    assert count.fraction == 1.0


def _tiny() -> Qwen2Config:
    # hidden 24 != heads * head_dim = 32, so the query width is counted separately from the hidden width
    return Qwen2Config(hidden_size=24, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=40,
                       num_hidden_layers=2, vocab_size=50)


def _plan(seed: int) -> WidthPlan:
    gen = torch.Generator().manual_seed(seed)
    return WidthPlan(attn_keep={l: torch.rand(4, 3, generator=gen) > 0.5 for l in range(2)},
                     ffn_keep={l: {"vision": torch.rand(40, generator=gen) > 0.6, "text": torch.rand(40, generator=gen) > 0.3}
                               for l in range(2)},
                     num_heads={0: 4, 1: 4}, intermediate_size={0: 40, 1: 40})


def _brute_force(config, V: int, T: int, plan, align: int) -> float:
    """Enumerate every (query, key) pair and every matrix product of the layout V visual then T text tokens."""
    d, H, dh, Hkv, m = 24, 4, 8, 2, 40
    modality = ["v"] * V + ["t"] * T
    total = 0.0
    for l in range(2):
        macs = (V + T) * (d * H * dh + d * Hkv * dh + d * Hkv * dh + H * dh * d)  # q, k, v, o
        for h in range(H):
            for i in range(V + T):
                for j in range(i + 1):
                    path = {"vv": "v2v", "tv": "t2v", "tt": "t2t"}[modality[i] + modality[j]]
                    if plan is None or plan.attn_keep[l][h, PATHS.index(path)]:
                        macs += 2 * dh  # q.k and a*v
        for i in range(V + T):
            key = "vision" if modality[i] == "v" else "text"
            kept = m if plan is None else int(plan.ffn_keep[l][key].sum())
            width = min(m, align * math.ceil(kept / align))
            macs += 3 * d * width  # gate, up, down
        total += 2 * macs
    return total + 2 * d * 50  # last-token head


@pytest.mark.parametrize("V, T", [(6, 3), (0, 5), (7, 0)])
@pytest.mark.parametrize("align", [1, 8])
def test_tiny_counts_equal_brute_force(V, T, align):
    config = _tiny()
    plan = _plan(V * 10 + T)
    dense = decoder_flops(config, V, T, align=align)
    pruned = decoder_flops(config, V, T, plan=plan, align=align)
    assert dense.total == _brute_force(config, V, T, None, align)
    assert pruned.total == _brute_force(config, V, T, plan, align)
    assert pruned.fraction == pytest.approx(pruned.total / dense.total)
    assert dense.dense_total == pruned.dense_total


def test_an_mllm_config_reads_its_text_config():
    from lightprune.testing.tiny import tiny_config

    outer = tiny_config("qwen3_vl_moe")
    assert decoder_flops(outer, 5, 4).total == decoder_flops(outer.text_config, 5, 4).total


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="-1"):
        decoder_flops(_tiny(), -1, 3)
    with pytest.raises(ValueError, match="align"):
        decoder_flops(_tiny(), 2, 3, align=0)
    bad = WidthPlan(attn_keep={}, ffn_keep={}, num_heads={0: 4, 1: 4, 2: 4}, intermediate_size={})
    bad.attn_keep[2] = torch.ones(4, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"\[2\]"):
        decoder_flops(_tiny(), 2, 3, plan=bad)
