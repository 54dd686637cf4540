"""An expert-pruning sweep's result (a row per criterion and ratio, the dense model, random selection's seeds) as
the results page shows it: tables of the metrics and their retention, a summary sentence per ratio, the proxies'
rank correlations and the plots. Retention is ``100 * metric / dense`` for accuracies and ``100 * dense / metric``
for perplexities (`lightprune.quality.intervals.retention`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightprune.core.checks import ratio_count
from lightprune.quality.expert_quality import summarise
from lightprune.quality.intervals import RESAMPLES, retention
from lightprune.quality.mwop_section import num_cell

__all__ = ["metric_table", "percent", "plot_pruned_per_layer", "plot_retention", "retention_summary", "retention_table",
           "rho_table", "stability_table"]


def percent(ratio: float) -> int:
    """``ratio`` as a whole percent, exactly (0.29 is 29, where ``int(0.29 * 100)`` is 28)."""
    return ratio_count(ratio, 100)


def _by_criterion(result: Mapping[str, Any]) -> dict[str, dict[float, Mapping[str, Any]]]:
    """{criterion: {ratio: its row}} of a sweep's result."""
    out: dict[str, dict[float, Mapping[str, Any]]] = {}
    for row in result["rows"]:
        out.setdefault(row["criterion"], {})[float(row["ratio"])] = row
    return out


def _ratios(result: Mapping[str, Any]) -> list[float]:
    """The pruning ratios a sweep measured, ascending."""
    return sorted({float(r["ratio"]) for r in result["rows"]})


def _random_cell(result, ratio: float, metric: str, digits: int) -> str:
    """Random selection's ``metric`` at ``ratio``: mean ± std [min, max] over its seeds."""
    s = summarise(result["random"][str(ratio)]["seeds"])[metric]
    mean, std, low, high = (num_cell(s[k], digits) for k in ("mean", "std", "min", "max"))
    return f"{mean} ± {std} [{low}, {high}]"


def metric_table(result: Mapping[str, Any], columns: list[tuple[str, str, int]]) -> str:
    """One row per criterion; per ratio and column (metric, header, digits) its value; random last."""
    ratios = _ratios(result)
    head = ["criterion", "allocation"] + [f"{h} @{percent(r)}%" for r in ratios for _, h, _ in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    dense = result["dense"]
    lines.append("| dense | - | " + " | ".join(num_cell(dense[m], d) for _ in ratios for m, _, d in columns) + " |")
    for name, by_ratio in _by_criterion(result).items():
        alloc = next(iter(by_ratio.values()))["allocation"]
        cells = [num_cell(by_ratio[r]["metrics"][m], d) for r in ratios for m, _, d in columns]
        lines.append(f"| {name} | {alloc} | " + " | ".join(cells) + " |")
    n = len(next(iter(result["random"].values()))["seeds"])
    cells = [_random_cell(result, r, m, d) for r in ratios for m, _, d in columns]
    lines.append(f"| random ({n} seeds: mean ± std [min, max]) | uniform | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _retention_cell(row: Mapping[str, Any], metric: str, dense: float) -> str:
    """The row's retention of ``metric``, with its bootstrap interval when it was measured with one."""
    cell = num_cell(retention(metric, row["metrics"][metric], dense))
    interval = row.get("intervals", {}).get(metric)
    return f"{cell} [{num_cell(interval[0])}, {num_cell(interval[1])}]" if interval else cell


def retention_table(result: Mapping[str, Any], metrics: list[str]) -> str:
    """One row per criterion: retention per ratio and metric (with its 95% bootstrap interval when measured);
    random last, as mean [min, max] over its seeds."""
    ratios = _ratios(result)
    head = ["criterion"] + [f"{m} retention @{percent(r)}%" for r in ratios for m in metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    dense = result["dense"]
    for name, by_ratio in _by_criterion(result).items():
        cells = [_retention_cell(by_ratio[r], m, dense[m]) for r in ratios for m in metrics]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    cells = []
    for r in ratios:
        for m in metrics:
            vals = [retention(m, s[m], dense[m]) for s in result["random"][str(r)]["seeds"]]
            cells.append(f"{num_cell(sum(vals) / len(vals))} [{num_cell(min(vals))}, {num_cell(max(vals))}]")
    lines.append("| random (mean [min, max]) | " + " | ".join(cells) + " |")
    if any("intervals" in row for row in result["rows"]):
        lines += ["", f"[low, high] after a criterion: the 95% paired bootstrap interval of its retention over the "
                  f"evaluation rows ({RESAMPLES} resamples, the same for every row: lightprune.quality.intervals); "
                  "random's brackets are its min and max over seeds."]
    return "\n".join(lines)


def retention_summary(result: Mapping[str, Any], metric: str) -> str:
    """One sentence per ratio: the best and worst criterion against random's spread (from the numbers)."""
    dense = result["dense"][metric]
    out = []
    for r in _ratios(result):
        kept = {name: retention(metric, by[r]["metrics"][metric], dense) for name, by in _by_criterion(result).items()
                if not name.startswith("anti_")}
        vals = [retention(metric, s[metric], dense) for s in result["random"][str(r)]["seeds"]]
        best = max(kept, key=kept.get)
        worst = min(kept, key=kept.get)
        above = sorted(n for n, v in kept.items() if v > max(vals))
        out.append(f"At {percent(r)}%: best {best} {kept[best]:.1f}, worst {worst} {kept[worst]:.1f}, random "
                   f"{sum(vals) / len(vals):.1f} [{min(vals):.1f}, {max(vals):.1f}]; above random's maximum: "
                   f"{', '.join(above) if above else 'none'}.")
    return f"{metric} retention (%): " + " ".join(out)


def rho_table(proxy_rho: Mapping[str, Any]) -> str:
    """Each proxy's rank correlation with the criterion it stands for, per token subset (mean and per layer)."""
    lines = ["| token subset | proxy | mean rho | per layer |", "|---|---|---|---|"]
    for subset, proxies in proxy_rho.items():
        for proxy, r in proxies.items():
            per = ", ".join(f"{l}: {num_cell(v, 2)}" for l, v in r["per_layer"].items())
            lines.append(f"| {subset} | {proxy} | {num_cell(r['mean'], 3)} | {per} |")
    return "\n".join(lines)


def stability_table(stab: Mapping[str, Any]) -> str:
    """Each criterion's rank correlation between two calibration sets, per token subset (mean and per layer)."""
    a, b = stab["pair"]
    lines = [f"| criterion | token subset | mean rho ({a} vs {b}) | per layer |", "|---|---|---|---|"]
    for criterion, subsets in stab["criteria"].items():
        for subset, r in subsets.items():
            per = ", ".join(f"{l}: {num_cell(v, 2)}" for l, v in r["per_layer"].items())
            lines.append(f"| {criterion} | {subset} | {num_cell(r['mean'], 3)} | {per} |")
    return "\n".join(lines)


def plot_retention(result: Mapping[str, Any], metric: str, path: Path, title: str) -> None:
    """Retention of ``metric`` vs pruning ratio, one line per criterion, random's min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = _ratios(result)
    dense = result["dense"][metric]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.get_cmap("tab20").colors
    for i, (name, by_ratio) in enumerate(_by_criterion(result).items()):
        ys = [100.0] + [retention(metric, by_ratio[r]["metrics"][metric], dense) for r in ratios]
        ax.plot([0.0, *ratios], ys, marker="o", label=name, color=colors[i % len(colors)],
                linestyle="--" if name == "anti_reap" else "-")
    lo, hi = [100.0], [100.0]
    for r in ratios:
        vals = [retention(metric, s[metric], dense) for s in result["random"][str(r)]["seeds"]]
        lo.append(min(vals))
        hi.append(max(vals))
    ax.fill_between([0.0, *ratios], lo, hi, color="grey", alpha=0.3, label="random (min-max)")
    ax.set_xlabel("fraction of routed experts pruned")
    ax.set_ylabel(f"{metric} retention (%)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_pruned_per_layer(result: Mapping[str, Any], path: Path, title: str) -> bool:
    """Bars of experts pruned per layer for the global allocations; False when there is none."""
    rows = [r for r in result["rows"] if r["allocation"] == "global"]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        layers = sorted(row["pruned_per_layer"], key=int)
        ax.bar([int(l) + i * width for l in layers], [row["pruned_per_layer"][l] for l in layers], width,
               label=f"{row['criterion']} @{percent(row['ratio'])}%")
    ax.set_xlabel("layer")
    ax.set_ylabel("experts pruned")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
