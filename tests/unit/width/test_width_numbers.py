"""NumPy scalars and 0-d tensors wherever MWOP takes a number: the same plan as the Python number; NumPy bools,
strings and non-finite values refused with the argument named."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import Qwen2Config

from lightprune.width.flops import decoder_flops
from lightprune.width.plan import WidthPlan
from lightprune.width.search import StagedSearch
from lightprune.width.select import select_channels, select_paths

HEADS = {0: 5, 1: 5}  # 10 units per path: 0.35 of them rounds to 4, numpy.float32(0.35) widened (0.3499999) to 3
WIDTH = {0: 5, 1: 5}
GEN = torch.Generator().manual_seed(0)
ATTN = {l: torch.rand(h, 3, generator=GEN, dtype=torch.float64) for l, h in HEADS.items()}
FFN = {l: {"vision": torch.rand(m, generator=GEN, dtype=torch.float64),
           "text": torch.rand(m, generator=GEN, dtype=torch.float64)} for l, m in WIDTH.items()}
RATIOS = [np.float32(0.35), np.float16(0.35), np.array(0.35, dtype=np.float32), torch.tensor(0.35), np.float64(0.35)]


def _dense() -> WidthPlan:
    return WidthPlan(attn_keep={l: torch.ones(h, 3, dtype=torch.bool) for l, h in HEADS.items()},
                     ffn_keep={l: {"vision": torch.ones(m, dtype=torch.bool), "text": torch.ones(m, dtype=torch.bool)}
                               for l, m in WIDTH.items()}, num_heads=HEADS, intermediate_size=WIDTH)


@pytest.mark.parametrize("ratio", RATIOS, ids=repr)
def test_numpy_ratios_select_what_the_python_float_selects(ratio) -> None:
    want = select_paths(ATTN, {"v2v": 0.35}, _dense())
    assert want.pruned_fraction("v2v") == 0.4
    assert select_paths(ATTN, {"v2v": float(np.float32(0.35))}, _dense()).pruned_fraction("v2v") == 0.3
    got = select_paths(ATTN, {"v2v": ratio}, _dense())
    assert all(torch.equal(got.attn_keep[l], want.attn_keep[l]) for l in HEADS)
    want = select_channels(FFN, {"vision": 0.35}, _dense())
    got = select_channels(FFN, {"vision": ratio}, _dense())
    assert all(torch.equal(got.ffn_keep[l]["vision"], want.ffn_keep[l]["vision"]) for l in WIDTH)


@pytest.mark.parametrize("ratio", [np.bool_(True), True, np.float32("nan"), "0.35", torch.tensor(False)], ids=repr)
def test_bools_strings_and_nan_ratios_are_refused(ratio) -> None:
    with pytest.raises(ValueError, match=r"^ratio for 'v2v' must be in \[0, 1\], got "):
        select_paths(ATTN, {"v2v": ratio}, _dense())
    with pytest.raises(ValueError, match=r"^ratio for 'text' must be in \[0, 1\], got "):
        select_channels(FFN, {"text": ratio}, _dense())


def test_flops_take_numpy_token_counts() -> None:
    config = Qwen2Config(hidden_size=24, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         intermediate_size=40, num_hidden_layers=2, vocab_size=50)
    want = decoder_flops(config, 30, 10, align=8)
    assert decoder_flops(config, np.int64(30), torch.tensor(10), align=np.int32(8)).total == want.total
    for bad in (np.bool_(True), np.float64(math.nan), 2.5):
        with pytest.raises(ValueError, match="^vision_tokens and text_tokens must be integers >= 0, got "):
            decoder_flops(config, bad, 10)


def test_the_staged_search_takes_numpy_numbers() -> None:
    search = StagedSearch(grid=[np.float32(0.7), np.float64(0.3)], min_retention=np.float32(85.5),
                          max_candidates=np.int64(2), expand_above=math.inf)
    assert search.grid == [0.3, 0.7] and search.min_retention == 85.5 and search.max_candidates == 2
    assert all(type(v) is float for v in (*search.grid, search.min_retention, search.expand_above))
    with pytest.raises(ValueError, match=r"^grid ratios must be in \[0, 1\] and non-empty, got \[nan\]$"):
        StagedSearch(grid=[math.nan])
    with pytest.raises(ValueError, match=r"^grid ratios must be in \[0, 1\] and non-empty, got \[np.True_\]$"):
        StagedSearch(grid=[np.bool_(True)])
    with pytest.raises(ValueError, match=r"^min_retention must be a finite number, got np.float32\(nan\)$"):
        StagedSearch(min_retention=np.float32("nan"))
    with pytest.raises(ValueError, match=r"^expand_above must be in \[-inf, inf\], got nan$"):
        StagedSearch(expand_above=math.nan)
    with pytest.raises(ValueError, match=r"^max_candidates must be a positive integer, got np.True_: a bool, not a "
                                         r"number$"):
        StagedSearch(max_candidates=np.bool_(True))
