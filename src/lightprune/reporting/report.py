"""Run reports: report.json, a PNG of kept experts per layer, and the printed summary table."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lightprune.core.jsonio import parse_json, write_json
from lightprune.core.paths import write_atomically
from lightprune.experts.plan import ExpertPlan

__all__ = ["write_report", "merge_report", "plot_kept_experts", "summary_table", "print_summary"]


def write_report(report: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``report`` as JSON atomically (`lightprune.core.jsonio.write_json`, indent 2)."""
    return write_json(report, path, indent=2)


def _deep_merge(base: dict[str, Any], updates: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in updates.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def merge_report(updates: dict[str, Any], path: str | os.PathLike) -> dict[str, Any]:
    """Merge ``updates`` into the JSON report at ``path`` (nested dicts merged key by key, other values
    replaced; what ``updates`` does not name is kept), written atomically; returns the merged report.

    A file that is not a JSON object is an error naming it (never silently replaced)."""
    path = Path(path)
    current: dict[str, Any] = {}
    if path.is_file():
        try:
            current = parse_json(path.read_text(), str(path))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON ({err}); refusing to overwrite it") from None
        if not isinstance(current, dict):
            raise ValueError(f"{path} holds a JSON {type(current).__name__}, not an object; refusing to overwrite it")
    merged = _deep_merge(current, updates)
    write_report(merged, path)
    return merged


def plot_kept_experts(plan: ExpertPlan, path: str | os.PathLike) -> Path:
    """Bar chart of kept vs pruned experts per MoE layer, written atomically (a temporary file beside ``path`` renamed
    over it: a failure leaves the previous PNG whole, and names the file)."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = list(plan.keep)
    kept = [len(plan.keep[l]) for l in layers]
    pruned = [plan.num_experts[l] - k for l, k in zip(layers, kept)]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.4 * len(layers) + 2), 3.2))
    x = range(len(layers))
    ax.bar(x, kept, label="kept", color="#3b7dd8")
    ax.bar(x, pruned, bottom=kept, label="pruned", color="#d9d9d9")
    ax.set_xticks(list(x), [str(l) for l in layers])
    ax.set_xlabel("MoE layer")
    ax.set_ylabel("experts")
    ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_title(f"{plan.criterion}: {plan.allocation}, ratio {plan.ratio}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    try:
        return write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"), "the plot")
    finally:
        plt.close(fig)


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.2f} MiB"


def summary_table(report: dict[str, Any], evaluation: dict[str, Any] | None = None):
    """A rich Table of the headline figures of a run; with ``evaluation`` (Evaluate's ``before`` / ``after``), its
    perplexity on the held-out split before and after, and the retention before / after in percent."""
    from rich.table import Table

    table = Table(title=f"lightprune: {report['criterion']} on {report['source']}")
    table.add_column("", style="bold")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    table.add_row("routed experts", str(report["experts_before"]), str(report["experts_after"]))
    table.add_row("parameters", f"{report['params_before']:,}", f"{report['params_after']:,}")
    table.add_row("checkpoint bytes", _mib(report.get("checkpoint_bytes_before")), _mib(report["checkpoint_bytes_after"]))
    table.add_row("kept per layer", "", " ".join(f"{l}:{k}" for l, k in report["kept_per_layer"].items()))
    table.add_row("verified max |logit diff|", "", f"{report['max_abs_diff']:.2e}")
    before, after = ((evaluation or {}).get(k, {}).get("perplexity") for k in ("before", "after"))
    if before is not None or after is not None:
        split = (evaluation or {}).get("split", "held-out")
        table.add_row(f"perplexity ({split})", "-" if before is None else f"{before:.4g}",
                      "-" if after is None else f"{after:.4g}")
        if before is not None and after is not None:
            table.add_row("perplexity retention (before / after)", "", f"{100 * before / after:.1f}%")
    table.add_row("seconds (score+select / export)", "",
                  f"{report['seconds_scoring']:.2f} / {report['seconds_export']:.2f}")
    return table


def print_summary(report: dict[str, Any], evaluation: dict[str, Any] | None = None) -> None:
    from rich.console import Console

    Console().print(summary_table(report, evaluation))
