"""Retention of a testbed metric and its paired bootstrap interval over the evaluation rows.

A metric is a ratio of sums over the evaluation rows r: ``value = N / D`` with N = sum_r n_r, D = sum_r d_r
(accuracy: right answers over answers or tokens), or ``exp(N / D)`` for perplexities (``ppl*``: n_r the row's
negative log-likelihood, d_r its tokens). An evaluation that supports intervals returns, beside its metrics, the
per-row sums under `ROW_SUMS`: ``{metric: (n [R], d [R])}``.

Retention (percent; 100 = unchanged, lower is worse for both kinds): ``100 * value / dense`` for accuracies,
``100 * dense / value`` for perplexities. Its interval is the percentile bootstrap (Efron & Tibshirani, "An
Introduction to the Bootstrap", 1993, section 13.3): B resamples of the R rows with replacement, drawn once from
a fixed seed, each giving the dense model's and the pruned model's metric on the same rows (paired), so the
interval reflects which rows were evaluated, not the pruning's own randomness (random plans are reported over
seeds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

__all__ = ["ROW_SUMS", "RESAMPLES", "intervals_of", "metric_value", "paired_difference", "percentile_interval",
           "retention",
           "retention_interval", "seed_interval", "t_quantile", "task_mean_paired_difference",
           "task_mean_retention_interval"]

#: the key of an evaluation's per-row sums ``{metric: (n [R], d [R])}`` (never a metric itself)
ROW_SUMS = "_row_sums"
#: bootstrap resamples per interval
RESAMPLES = 1000


def metric_value(metric: str, numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """N / D over the last dimension's rows (exp of it for ``ppl*``); NaN where D = 0."""
    n, d = numerator.double().sum(dim=-1), denominator.double().sum(dim=-1)
    ratio = n / d
    return ratio.exp() if metric.startswith("ppl") else ratio


def retention(metric: str, value, dense):
    """100 x value / dense for accuracies, 100 x dense / value for perplexities (``ppl*``); floats or tensors (NaN
    for a zero dense accuracy)."""
    if metric.startswith("ppl"):
        return 100.0 * dense / value
    if isinstance(dense, torch.Tensor):
        return 100.0 * value / dense
    return 100.0 * value / dense if dense else float("nan")


def _check(level: float, resamples: int) -> None:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 2:
        raise ValueError(f"resamples must be an int >= 2, got {resamples!r}")


def percentile_interval(kept: torch.Tensor, level: float) -> list[float]:
    """[low, high]: the (1 - level) / 2 and (1 + level) / 2 quantiles of the finite values of ``kept`` (linear
    interpolation), NaN when none is finite."""
    kept = kept[torch.isfinite(kept)]
    if kept.numel() == 0:
        return [math.nan, math.nan]
    tail = (1.0 - level) / 2
    return torch.quantile(kept, torch.tensor([tail, 1.0 - tail], dtype=torch.float64)).tolist()


def _resamples(rows: int, resamples: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, rows, (resamples, rows), generator=generator)


RowSums = tuple[torch.Tensor, torch.Tensor]


def retention_interval(metric: str, dense: RowSums, pruned: RowSums, *, resamples: int = RESAMPLES,
                       level: float = 0.95, seed: int = 0) -> list[float]:
    """[low, high] of ``metric``'s retention (module docstring): the percentile bootstrap of the pruned model's
    row sums ``pruned`` against the dense model's ``dense`` on the same rows, ``resamples`` resamples from
    ``seed`` (the same rows for every call with the same row count and seed)."""
    _check(level, resamples)
    sums = [torch.as_tensor(t, dtype=torch.float64).flatten() for t in (*dense, *pruned)]
    rows = sums[0].numel()
    if rows == 0 or any(t.numel() != rows for t in sums):
        raise ValueError(f"{metric}: the dense and pruned row sums must hold the same rows, got "
                         f"{[t.numel() for t in sums]}")
    index = _resamples(rows, resamples, seed)
    base = metric_value(metric, sums[0][index], sums[1][index])
    value = metric_value(metric, sums[2][index], sums[3][index])
    return percentile_interval(retention(metric, value, base), level)


def _task_means(metric: str, tasks: torch.Tensor, dense: RowSums, plans: list[RowSums],
                include: torch.Tensor | None, index: torch.Tensor | None) -> torch.Tensor:
    """[P, B] (B = 1 without ``index``): each plan's mean over the included tasks of its per-task retention, on the
    rows of each resample of ``index`` [B, R] (None: every row once)."""
    tasks = torch.as_tensor(tasks).long().flatten()
    sums = [torch.as_tensor(t, dtype=torch.float64).flatten() for pair in (dense, *plans) for t in pair]
    rows = tasks.numel()
    if rows == 0 or any(t.numel() != rows for t in sums):
        raise ValueError(f"{metric}: the task ids and every plan's row sums must hold the same rows, got "
                         f"{[rows] + [t.numel() for t in sums]}")
    num_tasks = int(tasks.max()) + 1
    include = torch.ones(num_tasks, dtype=torch.bool) if include is None else torch.as_tensor(include)[:num_tasks]
    index = torch.arange(rows).unsqueeze(0) if index is None else index
    which = tasks[index]                                                   # [B, R]

    def per_task(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
        n = torch.zeros(index.shape[0], num_tasks, dtype=torch.float64).scatter_add_(1, which, num[index])
        d = torch.zeros(index.shape[0], num_tasks, dtype=torch.float64).scatter_add_(1, which, den[index])
        value = n / d
        return value.exp() if metric.startswith("ppl") else value

    base = per_task(sums[0], sums[1])
    means = []
    for i in range(2, len(sums), 2):
        kept = retention(metric, per_task(sums[i], sums[i + 1]), base)
        means.append(kept.masked_fill(~include.unsqueeze(0) | ~torch.isfinite(kept), math.nan).nanmean(dim=1))
    return torch.stack(means)


def task_mean_retention_interval(metric: str, tasks: torch.Tensor, dense: RowSums, pruned: RowSums,
                                 include: torch.Tensor | None = None, *, resamples: int = RESAMPLES,
                                 level: float = 0.95, seed: int = 0) -> list[float]:
    """[low, high] of the mean over tasks of each task's retention (the ATR of MWOP ("MWOP: Modality-aware
    Width-wise Operation Pruning for Efficient MLLMs"), section 6.1): the rows (``tasks`` [R], each row's task id)
    resampled jointly, each resample's per-task metric from its rows' sums. ``include`` [num_tasks] bool: the tasks
    the mean is over (default: every task with rows); a task without rows in a resample leaves that resample's mean
    to the others."""
    _check(level, resamples)
    index = _resamples(torch.as_tensor(tasks).numel(), resamples, seed)
    return percentile_interval(_task_means(metric, tasks, dense, [pruned], include, index)[0], level)


def task_mean_paired_difference(metric: str, tasks: torch.Tensor, dense: RowSums, pruned: RowSums,
                                null: list[RowSums], include: torch.Tensor | None = None, *,
                                resamples: int = RESAMPLES, level: float = 0.95,
                                seed: int = 0) -> tuple[float, list[float]]:
    """(d, [low, high]) as `paired_difference`, for a mean over tasks of each task's retention (MWOP's ATR):
    d = the pruned model's task-mean retention minus the mean of the ``null`` plans', every resample drawing the
    same rows (``tasks`` [R]: each row's task id) for the dense model, the pruned one and each null plan."""
    _check(level, resamples)
    if not null:
        raise ValueError(f"{metric}: task_mean_paired_difference needs at least one null plan")

    def differences(index: torch.Tensor | None) -> torch.Tensor:
        means = _task_means(metric, tasks, dense, [pruned, *null], include, index)
        return means[0] - means[1:].mean(dim=0)

    index = _resamples(torch.as_tensor(tasks).numel(), resamples, seed)
    return float(differences(None)[0]), percentile_interval(differences(index), level)


def intervals_of(dense_sums: Mapping[str, RowSums], sums: Mapping[str, RowSums], **kwargs) -> dict[str, list[float]]:
    """``{metric: [low, high]}`` of every metric with row sums on both sides."""
    return {m: retention_interval(m, dense_sums[m], sums[m], **kwargs) for m in sums if m in dense_sums}


def paired_difference(metric: str, dense: RowSums, pruned: RowSums, null: list[RowSums], *,
                      resamples: int = RESAMPLES, level: float = 0.95, seed: int = 0) -> tuple[float, list[float]]:
    """(d, [low, high]): d = the pruned model's retention of ``metric`` minus the mean retention of the ``null``
    plans (random plans of the same ratio on the same model), on every row; [low, high] its percentile bootstrap
    interval, every resample drawing the same rows for the dense model, the pruned one and each null plan (paired:
    the rows' difficulty cancels, what is left is the plans' difference)."""
    _check(level, resamples)
    if not null:
        raise ValueError(f"{metric}: paired_difference needs at least one null plan")
    sums = [torch.as_tensor(t, dtype=torch.float64).flatten() for pair in (dense, pruned, *null) for t in pair]
    rows = sums[0].numel()
    if rows == 0 or any(t.numel() != rows for t in sums):
        raise ValueError(f"{metric}: the dense, pruned and null row sums must hold the same rows, got "
                         f"{[t.numel() for t in sums]}")

    def differences(index: torch.Tensor | None) -> torch.Tensor:
        pick = (lambda t: t) if index is None else (lambda t: t[index])
        base = metric_value(metric, pick(sums[0]), pick(sums[1]))
        kept = retention(metric, metric_value(metric, pick(sums[2]), pick(sums[3])), base)
        others = torch.stack([retention(metric, metric_value(metric, pick(sums[i]), pick(sums[i + 1])), base)
                              for i in range(4, len(sums), 2)])
        return kept - others.mean(dim=0)

    return float(differences(None)), percentile_interval(differences(_resamples(rows, resamples, seed)), level)


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) by its continued fraction (modified Lentz; "Numerical
    Recipes", 3rd ed., section 6.4), for 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below the mean; use the symmetry above it
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    value = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            value *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * value


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on its distribution function,
    P(T <= t) = 1 - I_{df / (df + t^2)}(df / 2, 1 / 2) / 2 for t >= 0)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p!r}")
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be an int >= 1, got {df!r}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)

    def cdf(t: float) -> float:
        return 1.0 - 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))

    low, high = 0.0, 1.0
    while cdf(high) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def seed_interval(values, level: float = 0.95) -> list[float] | None:
    """[low, high]: the t interval over independently trained testbed seeds of a per-seed figure (mean +- t_{(1 +
    level) / 2, n - 1} s / sqrt(n), s the sample standard deviation); None for fewer than two seeds. The noise it
    measures is the training seed's, which a per-seed bootstrap over the evaluation rows cannot see."""
    values = [float(v) for v in values]
    if len(values) < 2:
        return None
    _check(level, 2)
    n = len(values)
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    return [mean - half, mean + half]
