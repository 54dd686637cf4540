"""The callbacks' numeric options take NumPy scalars (kept as Python numbers) and refuse NumPy bools and non-finite
values, in the constructor and in the option specs the command line checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightprune.callbacks import Evaluate, ExpertPruning, ExpertStats, Export, WidthSearch
from lightprune.callbacks.options import OPTIONS


def test_numpy_numbers_are_kept_as_python_numbers() -> None:
    pruning = ExpertPruning(criterion="maep", ratio=np.float32(0.7), alpha=np.float32(0.3))
    assert (pruning.ratio, pruning.alpha, pruning.criterion.alpha) == (0.7, 0.3, 0.3)
    assert type(pruning.ratio) is float and type(pruning.alpha) is float
    counted = ExpertPruning(criterion="aimer", ratio=None, n_per_layer=np.int64(2))
    assert counted.n_per_layer == 2 and type(counted.n_per_layer) is int
    stats = ExpertStats(low_attn_quantile=np.float32(0.1), save_every_n_batches=np.int64(4))
    assert (stats.low_attn_quantile, stats.save_every_n_batches) == (0.1, 4)
    assert Export(atol=np.float32(1e-4)).atol == 1e-4
    evaluate = Evaluate(lm_eval_batch_size=np.int64(4), max_batches=np.int32(2))
    assert (evaluate.lm_eval_batch_size, evaluate.max_batches) == (4, 2) and type(evaluate.max_batches) is int
    search = WidthSearch(grid=[np.float32(0.35)], max_candidates=np.int64(1), flops_profile=(np.int64(5), 7),
                         align=np.int64(8), recovery_epochs=np.int64(1))
    assert search.search.grid == [0.35] and search.flops_profile == [5, 7] and search.align == 8


@pytest.mark.parametrize("callback, option, bad, message", [
    (ExpertPruning, "ratio", np.bool_(False), r"^ratio must be in \[0, 1\), got np.False_: a bool, not a number$"),
    (ExpertPruning, "ratio", np.float32("nan"), r"^ratio must be in \[0, 1\), got np.float32\(nan\)$"),
    (ExpertPruning, "alpha", np.bool_(True), r"^alpha must be in \[0, 1\], got np.True_: a bool, not a number$"),
    (ExpertPruning, "alpha", math.nan, r"^alpha must be in \[0, 1\], got nan$"),
    (ExpertStats, "low_attn_quantile", np.float64(math.inf), r"^low_attn_quantile must be in \(0, 0.5\], got "),
    (ExpertStats, "low_attn_quantile", np.bool_(True),
     r"^low_attn_quantile must be in \(0, 0.5\], got np.True_: a bool, not a number$"),
    (ExpertStats, "save_every_n_batches", np.bool_(True), r"^save_every_n_batches must be a non-negative integer"),
    (Export, "atol", np.float32("nan"), r"^atol must be positive, got np.float32\(nan\)$"),
    (Evaluate, "lm_eval_batch_size", np.bool_(True),
     r"^lm_eval_batch_size must be a positive integer, got np.True_: a bool, not a number$"),
    (Evaluate, "lm_eval_batch_size", 2.5, r"^lm_eval_batch_size must be a positive integer, got 2.5$"),
    (WidthSearch, "flops_profile", (np.bool_(True), 3), r"^flops_profile must be \(vision tokens, text tokens\) >= 0"),
    (WidthSearch, "flops_profile", (math.nan, 3), r"^flops_profile must be \(vision tokens, text tokens\) >= 0"),
])
def test_numpy_bools_and_non_finite_values_are_refused(callback, option, bad, message) -> None:
    with pytest.raises(ValueError, match=message):
        callback(**{option: bad})
    if OPTIONS[callback.__name__].checks[option] is not None:  # the command line's check, before torch loads
        with pytest.raises(ValueError, match=message):
            OPTIONS[callback.__name__].check(option, bad)
