"""Recompute the results page's figures from the per-seed files alone, without lightprune's statistics code.

Every testbed seed's file (docs/results/seeds/<part>-seed<n>.json) keeps its evaluation rows' sums for the dense
model, every criterion's plan and every random plan ("records": float32 arrays, zlib-compressed, base64). This
script reads them with numpy and computes again, for every row of the text and multimodal MoE tables:

- each metric's value from its rows (N / D; exp(N / D) for perplexities) and its retention against the dense model
  (100 x value / dense; 100 x dense / value for perplexities);
- the retention's percentile bootstrap interval (the same resampled rows: torch.randint from the seed the record
  names, its only use of torch);
- against the random plans of the same ratio: the empirical p-values (1 + #{null >= v}) / (1 + N) both ways and
  the paired difference to the null's mean with its paired bootstrap interval; against each named rival the
  paired difference and its interval;
- for every MWOP row (training-free and after recovery; random plans one by one): both ATRs (the mean over task
  families of each family's retention: accuracy from the metric's sums, answer perplexity from nll / tokens) with
  their bootstrap intervals (the rows resampled jointly), and each Taylor row's p-values among the random plans
  and paired difference to their mean;
- over the seeds, each claim's mean difference and its t interval (scipy's Student t),

and compares each with the stored figure (p-values exactly, the rest within 1e-9 relative). It prints what it
checked and every disagreement, and exits 1 if there is one.

    python scripts/recompute_results.py                      # docs/results
    python scripts/recompute_results.py --results /tmp/r/results
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import sys
import warnings
import zlib
from pathlib import Path

import numpy as np

TOLERANCE = 1e-9


def unpack(text: str) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype="<f4").astype(np.float64)


def value(metric: str, n: np.ndarray, d: np.ndarray) -> np.ndarray:
    """N / D over the last axis (exp for perplexities); NaN where D = 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = n.sum(axis=-1) / d.sum(axis=-1)
    return np.exp(ratio) if metric.startswith("ppl") else ratio


def retention(metric: str, v, dense):
    with np.errstate(divide="ignore", invalid="ignore"):
        return 100.0 * dense / v if metric.startswith("ppl") else 100.0 * v / dense


def resample_rows(rows: int, bootstrap: dict) -> np.ndarray:
    import torch

    generator = torch.Generator().manual_seed(int(bootstrap["seed"]))
    return torch.randint(0, rows, (int(bootstrap["resamples"]), rows), generator=generator).numpy()


def percentiles(draws: np.ndarray, level: float) -> list[float]:
    kept = draws[np.isfinite(draws)]
    if kept.size == 0:
        return [math.nan, math.nan]
    tail = (1 - level) / 2
    return [float(x) for x in np.quantile(kept, [tail, 1 - tail])]


class Checker:
    def __init__(self) -> None:
        self.checked, self.bad = 0, []

    def close(self, where: str, mine, stored, exact: bool = False) -> None:
        mine_list = mine if isinstance(mine, (list, tuple)) else [mine]
        stored_list = stored if isinstance(stored, (list, tuple)) else [stored]
        self.checked += 1
        for a, b in zip(mine_list, stored_list):
            a, b = float(a), float("nan") if b is None else float(b)
            same = (math.isnan(a) and math.isnan(b)) or (a == b if exact else
                                                          abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b)))
            if not same:
                self.bad.append(f"{where}: recomputed {mine}, stored {stored}")
                return


def check_seed(path: Path, checker: Checker) -> dict | None:
    tables = json.loads(path.read_text())["tables"]
    records = tables.get("records")
    if records is None:
        print(f"{path.name}: no per-row records (measured before they were kept): skipped")
        return None
    bootstrap, level = records["bootstrap"], float(records["bootstrap"]["level"])
    metrics = {}
    for metric, rec in records["metrics"].items():
        d = unpack(rec["denominator"])
        plans = {key: (unpack(x), d) if isinstance(x, str) else (unpack(x[0]), unpack(x[1]))
                 for key, x in rec["plans"].items()}
        metrics[metric] = {"dense": (unpack(rec["dense"]), d), "plans": plans}
    index_cache: dict[int, np.ndarray] = {}

    def rows_of(n: int) -> np.ndarray:
        if n not in index_cache:
            index_cache[n] = resample_rows(n, bootstrap)
        return index_cache[n]

    def kept(metric: str, plan, index=None):
        dense, mine = metrics[metric]["dense"], plan
        pick = (lambda a: a) if index is None else (lambda a: a[index])
        base = value(metric, pick(dense[0]), pick(dense[1]))
        return retention(metric, value(metric, pick(mine[0]), pick(mine[1])), base)

    def paired(metric: str, plan, others) -> tuple[float, list[float]]:
        index = rows_of(plan[0].size)
        point = kept(metric, plan) - np.mean([kept(metric, o) for o in others])
        draws = kept(metric, plan, index) - np.mean([kept(metric, o, index) for o in others], axis=0)
        return float(point), percentiles(draws, level)

    for row in tables["rows"]:
        key = f"{row['criterion']}@{float(row['ratio']):g}"
        where = f"{path.name} {key}"
        for metric, interval in row.get("intervals", {}).items():
            if metric in metrics and key in metrics[metric]["plans"]:
                plan = metrics[metric]["plans"][key]
                checker.close(f"{where} {metric} value", value(metric, *plan), row["metrics"][metric])
                checker.close(f"{where} {metric} interval",
                              percentiles(kept(metric, plan, rows_of(plan[0].size)), level), interval)
        for metric, stand in row.get("standing", {}).items():
            plan = metrics[metric]["plans"][key]
            null = [p for k, p in metrics[metric]["plans"].items()
                    if k.startswith("random:") and k.endswith(f"@{float(row['ratio']):g}")]
            v, others = float(kept(metric, plan)), [float(kept(metric, o)) for o in null]
            checker.close(f"{where} {metric} null size", len(null), stand["null_size"], exact=True)
            checker.close(f"{where} {metric} p", (1 + sum(x >= v for x in others)) / (1 + len(others)),
                          stand["p_value"], exact=True)
            if "p_value_below" in stand:
                checker.close(f"{where} {metric} p below", (1 + sum(x <= v for x in others)) / (1 + len(others)),
                              stand["p_value_below"], exact=True)
            diff, ci = paired(metric, plan, null)
            checker.close(f"{where} {metric} paired d", diff, stand["paired_diff"])
            checker.close(f"{where} {metric} paired interval", ci, stand["paired_ci"])
        for rival, per_metric in row.get("versus", {}).items():
            other_key = f"{rival}@{float(row['ratio']):g}"
            for metric, record in per_metric.items():
                diff, ci = paired(metric, metrics[metric]["plans"][key], [metrics[metric]["plans"][other_key]])
                checker.close(f"{where} vs {rival} {metric} d", diff, record["paired_diff"])
                checker.close(f"{where} vs {rival} {metric} interval", ci, record["paired_ci"])
    return tables


def task_means(kind: str, tasks: np.ndarray, dense: tuple, plans: list[tuple], include: np.ndarray,
               index: np.ndarray | None = None) -> np.ndarray:
    """[P, B]: each plan's mean over the included tasks of its per-task retention ("acc": 100 x v / dense; "ppl":
    100 x exp(dense loss) / exp(loss)), on the rows of each resample of ``index`` [B, R] (None: every row once)."""
    num_tasks = include.size
    index = np.arange(tasks.size)[None, :] if index is None else index
    cells = tasks.astype(np.int64)[index] + num_tasks * np.arange(index.shape[0])[:, None]

    def per_task(n: np.ndarray, d: np.ndarray) -> np.ndarray:
        size = index.shape[0] * num_tasks
        sums = [np.bincount(cells.ravel(), weights=x[index].ravel(), minlength=size).reshape(-1, num_tasks)
                for x in (n, d)]
        with np.errstate(divide="ignore", invalid="ignore"):
            v = sums[0] / sums[1]
        return np.exp(v) if kind == "ppl" else v

    base = per_task(*dense)
    out = []
    for plan in plans:
        with np.errstate(divide="ignore", invalid="ignore"):
            kept = 100.0 * base / per_task(*plan) if kind == "ppl" else 100.0 * per_task(*plan) / base
        kept = np.where(include[None, :] & np.isfinite(kept), kept, np.nan)
        with warnings.catch_warnings():  # a resample without any included task: NaN, as torch's nanmean
            warnings.simplefilter("ignore", RuntimeWarning)
            out.append(np.nanmean(kept, axis=1))
    return np.stack(out)


def check_width_seed(path: Path, checker: Checker) -> dict | None:
    """An MWOP seed file: every row's ATRs and intervals, training-free and after recovery, from its records."""
    tables = json.loads(path.read_text())["tables"]
    if tables.get("records") is None:
        print(f"{path.name}: no per-row records (measured before they were kept): skipped")
        return None
    num, den = {"token": ("right", "tokens"), "exact": ("exact", "answered"), "prob": ("prob", "tokens")}[
        tables["metric"]]
    num_tasks = len(tables["task_names"])

    def unpacked(records: dict) -> tuple[np.ndarray, dict, dict]:
        fields, tasks = records["fields"], unpack(records["task"])

        def rows(text: str) -> dict:
            return dict(zip(fields, unpack(text).reshape(len(fields), tasks.size)))

        return tasks, rows(records["dense"]), {k: rows(v) for k, v in records["plans"].items()}

    def include(dense: dict, plan: dict, tasks: np.ndarray) -> np.ndarray:
        """The tasks with a defined retention: the dense score finite and non-zero, the plan's finite."""
        scores = [np.bincount(tasks.astype(np.int64), weights=r[num], minlength=num_tasks) /
                  np.bincount(tasks.astype(np.int64), weights=r[den], minlength=num_tasks) for r in (dense, plan)]
        return np.isfinite(scores[0]) & (scores[0] != 0) & np.isfinite(scores[1])

    def check_rows(rows: list, records: dict, where: str, recovered: bool) -> None:
        tasks, before, plans = unpacked(records)
        bootstrap = records["bootstrap"]
        index, level = resample_rows(tasks.size, bootstrap), float(bootstrap["level"])
        pairs = {"atr": ("acc", (num, den)), "answer_ppl_atr": ("ppl", ("nll", "tokens"))}

        def means(key: str, reference: dict, mine: list[dict], keep: np.ndarray, idx=None) -> np.ndarray:
            kind, (n, d) = pairs[key]
            return task_means(kind, tasks, (reference[n], reference[d]), [(p[n], p[d]) for p in mine], keep, idx)

        def figures(row: dict, plan: dict, reference: dict, label: str) -> None:
            keep = include(reference, plan, tasks)
            for key in pairs:
                if row.get(key) is None:
                    continue
                checker.close(f"{label} {key}", means(key, reference, [plan], keep)[0, 0], row[key])
                checker.close(f"{label} {key} interval",
                              percentiles(means(key, reference, [plan], keep, index)[0], level),
                              row[f"{key}_interval"])

        def paired(key: str, plan: dict, null: list[dict], reference: dict, keep: np.ndarray, record: dict,
                   label: str) -> None:
            point = means(key, reference, [plan, *null], keep)[:, 0]
            draws = means(key, reference, [plan, *null], keep, index)
            checker.close(f"{label} {key} paired d", point[0] - point[1:].mean(), record["paired_diff"])
            checker.close(f"{label} {key} paired interval", percentiles(draws[0] - draws[1:].mean(axis=0), level),
                          record["paired_ci"])

        reference = plans.get("dense/dense", before) if recovered else before
        for row in rows:
            point, method = row["operating_point"], row["method"]
            if method == "dense" and not recovered:
                continue  # the dense model against itself: 100 by definition
            if method == "random" and "per_seed" in row:
                entries = row["per_seed"]
            else:
                entries = [row]
            for entry in entries:
                seed = entry.get("seed")
                key = f"{point}/{method}" if seed is None else f"{point}/random:{seed}"
                label = f"{where} {key}"
                figures(entry, plans[key], before if method == "dense" else reference, label)
                null = [p for k, p in plans.items() if k.startswith(f"{point}/random:")]
                stand = entry.get("standing") or {}
                versus = (entry.get("versus") or {}).get("random") or {}
                for metric, record in {**stand, **versus}.items():
                    keep = include(reference, plans[key], tasks)
                    if metric in stand:
                        v = float(means(metric, reference, [plans[key]], keep)[0, 0])
                        others = [float(means(metric, reference, [p], include(reference, p, tasks))[0, 0])
                                  for p in null]
                        checker.close(f"{label} {metric} null size", len(others), record["null_size"], exact=True)
                        checker.close(f"{label} {metric} p", (1 + sum(x >= v for x in others)) / (1 + len(others)),
                                      record["p_value"], exact=True)
                        checker.close(f"{label} {metric} p below",
                                      (1 + sum(x <= v for x in others)) / (1 + len(others)),
                                      record["p_value_below"], exact=True)
                    paired(metric, plans[key], null, reference, keep, record, label)

    check_rows(tables["rows"], tables["records"], path.name, recovered=False)
    if tables.get("recovery"):
        check_rows(tables["recovery"]["rows"], tables["recovery"]["records"], f"{path.name} recovery",
                   recovered=True)
    return tables


def check_claims(results: Path, checker: Checker) -> None:
    """Each claim's mean difference over seeds and its t interval, from the per-seed records the page keeps."""
    from scipy import stats

    page = json.loads((results / "results.json").read_text())
    for claim in page.get("claims") or []:
        over, seeds = claim.get("over_seeds"), claim.get("seeds") or []
        if not over or not seeds:
            continue
        diffs = np.array([s["paired_diff"] for s in seeds], dtype=np.float64)
        where = f"claim {claim['testbed']} {claim['criterion']} vs {claim['rival']} {claim['metric']}"
        checker.close(f"{where} mean", diffs.mean(), over["mean"])
        if len(diffs) > 1:
            half = stats.t.ppf(0.975, len(diffs) - 1) * diffs.std(ddof=1) / math.sqrt(len(diffs))
            checker.close(f"{where} seed interval", [diffs.mean() - half, diffs.mean() + half], over["interval"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="docs/results", help="the folder of results.json and seeds/")
    args = parser.parse_args(argv)
    results = Path(args.results)
    checker = Checker()
    files = sorted((results / "seeds").glob("*-seed*.json"))
    recomputed = 0
    for path in files:
        check = check_width_seed if path.name.startswith("mwop-") else check_seed
        recomputed += check(path, checker) is not None
    check_claims(results, checker)
    print(f"{checker.checked} figures recomputed from {recomputed} seed files of {len(files)}; "
          f"{len(checker.bad)} disagree")
    for line in checker.bad:
        print("  " + line)
    return 1 if checker.bad else 0


if __name__ == "__main__":
    sys.exit(main())
