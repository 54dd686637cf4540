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
        if path.name.startswith(("text-", "mllm-")):
            recomputed += check_seed(path, checker) is not None
    check_claims(results, checker)
    print(f"{checker.checked} figures recomputed from {recomputed} seed files of {len(files)}; "
          f"{len(checker.bad)} disagree")
    for line in checker.bad:
        print("  " + line)
    return 1 if checker.bad else 0


if __name__ == "__main__":
    sys.exit(main())
