"""The exports' numeric options take NumPy scalars as the Python numbers and refuse bools, NaN and fractions of a
token before anything is read."""

from __future__ import annotations

import math

import numpy as np
import pytest

import lightprune as lp


def test_a_streamed_export_with_numpy_options_verifies_as_with_python_ones(tiny, tmp_path) -> None:
    model = tiny("qwen3_moe", seed=2)
    model.save_pretrained(tmp_path / "src")
    plan = lp.select_experts(lp.score_weights(model, "aimer"), ratio=np.float32(0.5))
    want = lp.prune_checkpoint(tmp_path / "src", plan, tmp_path / "python", atol=1e-4, probe_tokens=8, seed=3,
                               progress=False)
    got = lp.prune_checkpoint(tmp_path / "src", plan, tmp_path / "numpy", atol=np.float32(1e-4),
                              probe_tokens=np.int64(8), seed=np.uint8(3), progress=False)
    assert got.verification == want.verification and got.verification["probe_shapes"] == {"input_ids": [2, 8]}


@pytest.mark.parametrize("option, bad, message", [
    ("probe_tokens", np.bool_(True), r"^probe_tokens must be a positive integer, got np.True_: a bool, not a number$"),
    ("probe_tokens", 2.5, r"^probe_tokens must be a positive integer, got 2.5$"),
    ("seed", np.float64(math.nan), r"^seed must be a non-negative integer, got np.float64\(nan\)$"),
    ("atol", np.float32(math.nan), r"^atol must be positive, got np.float32\(nan\)$"),
])
def test_a_bad_number_is_refused_before_the_checkpoint_is_read(tmp_path, option, bad, message) -> None:
    plan = lp.ExpertPlan(keep={0: [0, 1]}, num_experts={0: 4})
    with pytest.raises(ValueError, match=message):  # the checkpoint does not even exist
        lp.prune_checkpoint(tmp_path / "missing", plan, tmp_path / "out", progress=False, **{option: bad})
    assert not (tmp_path / "out").exists()
