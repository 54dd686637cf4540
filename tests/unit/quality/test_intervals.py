"""Retention and its paired bootstrap interval against explicit loops and exact cases."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from lightprune.quality.intervals import (
    metric_value,
    retention,
    retention_interval,
    task_mean_paired_difference,
    task_mean_retention_interval,
)


def _rows(seed: int, rows: int = 40):
    gen = torch.Generator().manual_seed(seed)
    count = torch.randint(5, 30, (rows,), generator=gen).double()
    nll = count * (2.0 + torch.rand(rows, generator=gen, dtype=torch.float64))
    right = torch.floor(count * torch.rand(rows, generator=gen, dtype=torch.float64))
    return nll, right, count


def test_metric_values_are_ratios_of_sums() -> None:
    nll, right, count = _rows(0)
    assert float(metric_value("ppl", nll, count)) == pytest.approx(math.exp(nll.sum() / count.sum()), rel=1e-12)
    assert float(metric_value("acc", right, count)) == pytest.approx(float(right.sum() / count.sum()), rel=1e-12)
    assert retention("ppl", 20.0, 10.0) == 50.0 and retention("acc", 0.2, 0.4) == 50.0


def test_interval_equals_the_percentiles_of_an_explicit_resampling_loop() -> None:
    nll, right, count = _rows(1)
    _, right2, _ = _rows(2)
    right2 = torch.minimum(right2, count)
    resamples, level = 200, 0.9
    got = retention_interval("acc", (right, count), (right2, count), resamples=resamples, level=level, seed=7)
    index = torch.randint(0, len(count), (resamples, len(count)), generator=torch.Generator().manual_seed(7))
    kept = []
    for draw in index.tolist():
        base = sum(right[i].item() for i in draw) / sum(count[i].item() for i in draw)
        value = sum(right2[i].item() for i in draw) / sum(count[i].item() for i in draw)
        kept.append(100.0 * value / base)
    kept.sort()
    # linear interpolation between order statistics, as torch.quantile and statistics.quantiles(inclusive) take it
    def quantile(q: float) -> float:
        pos = q * (len(kept) - 1)
        lo = math.floor(pos)
        return kept[lo] + (kept[min(lo + 1, len(kept) - 1)] - kept[lo]) * (pos - lo)

    assert got == pytest.approx([quantile(0.05), quantile(0.95)], rel=1e-12)
    assert statistics.quantiles(kept, n=20, method="inclusive")[0] == pytest.approx(quantile(0.05), rel=1e-12)
    point = retention("acc", float(metric_value("acc", right2, count)), float(metric_value("acc", right, count)))
    assert got[0] <= point <= got[1]


def test_a_uniform_shift_gives_a_degenerate_interval_and_identical_models_100() -> None:
    nll, _, count = _rows(3)
    assert retention_interval("ppl", (nll, count), (nll, count)) == pytest.approx([100.0, 100.0], abs=1e-9)
    shifted = nll + 0.25 * count  # every token 0.25 nats worse: ppl x e^0.25 on any resample
    low, high = retention_interval("ppl", (nll, count), (shifted, count))
    assert low == pytest.approx(100 * math.exp(-0.25), rel=1e-12) and high == pytest.approx(low, rel=1e-12)


def test_more_rows_of_the_same_kind_narrow_the_interval() -> None:
    _, right, count = _rows(4)
    _, other, _ = _rows(5)
    other = torch.minimum(other, count)
    narrow = retention_interval("acc", (right.repeat(16), count.repeat(16)), (other.repeat(16), count.repeat(16)))
    wide = retention_interval("acc", (right, count), (other, count))
    ratio = (narrow[1] - narrow[0]) / (wide[1] - wide[0])
    assert 0.15 < ratio < 0.4  # about 1 / sqrt(16)


def test_task_mean_interval_equals_an_explicit_loop_over_resamples_and_tasks() -> None:
    nll, right, count = _rows(8, rows=30)
    _, other, _ = _rows(9, rows=30)
    other = torch.minimum(other, count)
    tasks = torch.arange(30) % 3
    include = torch.tensor([True, True, False])  # task 2: as if its dense score were zero (left out of the ATR)
    got = task_mean_retention_interval("acc", tasks, (right, count), (other, count), include, resamples=100,
                                       level=0.8, seed=3)
    index = torch.randint(0, 30, (100, 30), generator=torch.Generator().manual_seed(3))
    means = []
    for draw in index.tolist():
        kept = []
        for task in (0, 1):
            mine = [i for i in draw if int(tasks[i]) == task]
            if not mine:
                continue
            base = sum(right[i].item() for i in mine) / sum(count[i].item() for i in mine)
            value = sum(other[i].item() for i in mine) / sum(count[i].item() for i in mine)
            kept.append(100.0 * value / base)
        means.append(sum(kept) / len(kept))
    assert got == pytest.approx(statistics.quantiles(means, n=10, method="inclusive")[::8], rel=1e-12)
    ppl = task_mean_retention_interval("ppl", tasks, (nll, count), (nll + 0.5 * count, count))
    assert ppl == pytest.approx([100 * math.exp(-0.5)] * 2, rel=1e-12)


def test_task_mean_paired_difference_equals_an_explicit_loop() -> None:
    """d = the plan's mean-over-tasks retention minus the null plans' mean of theirs, on every row and on each
    resample (the same rows for the dense model, the plan and every null plan), from plain Python sums."""
    rows = 24
    _, right, count = _rows(10, rows=rows)
    plans = [torch.minimum(_rows(11 + i, rows=rows)[1], count) for i in range(4)]  # the plan, then 3 null plans
    tasks = torch.arange(rows) % 3
    include = torch.tensor([True, False, True])

    def task_mean(draw: list[int], other: torch.Tensor) -> float:
        kept = []
        for task in (0, 2):
            mine = [i for i in draw if int(tasks[i]) == task]
            if mine:
                base = sum(right[i].item() for i in mine) / sum(count[i].item() for i in mine)
                kept.append(100.0 * sum(other[i].item() for i in mine) / sum(count[i].item() for i in mine) / base)
        return sum(kept) / len(kept)

    def difference(draw: list[int]) -> float:
        return task_mean(draw, plans[0]) - sum(task_mean(draw, p) for p in plans[1:]) / 3

    d, ci = task_mean_paired_difference("acc", tasks, (right, count), (plans[0], count),
                                        [(p, count) for p in plans[1:]], include, resamples=50, level=0.8, seed=5)
    assert d == pytest.approx(difference(list(range(rows))), rel=1e-12)
    index = torch.randint(0, rows, (50, rows), generator=torch.Generator().manual_seed(5))
    expected = [difference(draw) for draw in index.tolist()]
    assert ci == pytest.approx(statistics.quantiles(expected, n=10, method="inclusive")[::8], rel=1e-9)
    same, same_ci = task_mean_paired_difference("acc", tasks, (right, count), (plans[0], count),
                                                [(plans[0], count)], include, resamples=20)
    assert same == 0.0 and same_ci == [0.0, 0.0]
    with pytest.raises(ValueError, match="at least one null plan"):
        task_mean_paired_difference("acc", tasks, (right, count), (plans[0], count), [])


def test_bad_arguments_are_named() -> None:
    _, right, count = _rows(6)
    with pytest.raises(ValueError, match="level"):
        retention_interval("acc", (right, count), (right, count), level=1.5)
    with pytest.raises(ValueError, match="resamples"):
        retention_interval("acc", (right, count), (right, count), resamples=1)
    with pytest.raises(ValueError, match="same rows"):
        retention_interval("acc", (right, count), (right[:-1], count[:-1]))
