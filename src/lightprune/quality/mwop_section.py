"""The MWOP rows on the results page: the quality table (`mwop_markdown`: one row per operating point and
method, random rows over their seeds, Taylor rows with their standing among them) and the ATR-vs-FLOPs figure
(`plot_mwop`), from what `lightprune.quality.width_quality.mwop_quality` returns; the cells' format
(`num_cell`, `spread_cell`) is shared with the recovery table (`lightprune.quality.width_recovery`), and
`num_cell` with an expert-pruning sweep's tables (`lightprune.quality.sweep_tables`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from lightprune.quality.width_quality import DENSE

__all__ = ["mwop_markdown", "num_cell", "plot_mwop", "spread_cell"]


def num_cell(value: float | None, digits: int = 1) -> str:
    """``value`` with ``digits`` decimals; "n/a" for None or NaN."""
    return "n/a" if value is None or value != value else f"{value:.{digits}f}"


def spread_cell(stats: Mapping[str, float | None], digits: int, scale: float = 1.0) -> str:
    """A random row's figure over its seeds: ``mean ± std [min, max]`` (each times ``scale``)."""
    if stats["mean"] is None:
        return "n/a"
    s = lambda v: num_cell(None if v is None else v * scale, digits)  # noqa: E731
    std = f" ± {s(stats['std'])}" if stats["std"] is not None else ""
    return f"{s(stats['mean'])}{std} [{s(stats['min'])}, {s(stats['max'])}]"


def _ratios(ratios: Mapping[str, float]) -> str:
    """An operating point's ratios per unit (``v2v 0.4, t2v 0.6``)."""
    return ", ".join(f"{u} {r:g}" for u, r in ratios.items()) or "-"


def mwop_markdown(result: Mapping[str, Any]) -> str:
    """The quality table in Markdown: one row per (operating point, method); accuracies in %.

    Random rows read ``mean ± std [min, max]`` over the seeds.
    """
    names = list(result["task_names"])
    align = result["align"]
    new = "answer_ppl_atr" in result["rows"][0]  # results measured before the answer loss was recorded lack it
    head = ["operating point", "ratios", "method", f"FLOPs fraction (align {align})"]
    head += ["FLOPs fraction (align 1)", "ATR (%) [95% CI]", "answer-ppl ATR (%) [95% CI]"] if new else ["ATR (%)"]
    head += [f"{n} acc. (%)" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * (len(head) - 3)) + "|"]
    with_ci = lambda value, ci: f"{num_cell(value, 1)} [{num_cell(ci[0], 1)}, {num_cell(ci[1], 1)}]"  # noqa: E731
    for r in result["rows"]:
        label = {"random": f"random ({len(r.get('seeds', []))} seeds)",
                 "taylor_all_tasks": "taylor, All Tasks (min rank)"}.get(r["method"], r["method"])
        cells = [r["operating_point"], _ratios(r["ratios"]), label]
        if r["method"] == "random":
            cells += [spread_cell(r["flops_fraction"], 3)]
            cells += [spread_cell(r["flops_fraction_align_1"], 3), spread_cell(r["atr"], 1),
                      spread_cell(r["answer_ppl_atr"], 1)] if new else [spread_cell(r["atr"], 1)]
            cells += [spread_cell(r["per_task_accuracy"][n], 1, 100.0) for n in names]
        else:
            cells += [num_cell(r["flops_fraction"], 3)]
            cells += [num_cell(r["flops_fraction_align_1"], 3),
                      with_ci(r["atr"], r["atr_interval"]) + _against_null(r, "atr"),
                      with_ci(r["answer_ppl_atr"], r["answer_ppl_atr_interval"]) + _against_null(r, "answer_ppl_atr")
                      ] if new else [num_cell(r["atr"], 1)]
            cells += [num_cell(None if r["per_task_accuracy"][n] is None else 100.0 * r["per_task_accuracy"][n], 1)
                      for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    p = result["profile"]
    rows = result.get("val_rows_per_task")
    lines += ["", f"Training-free (no recovery); metric `{result['metric']}`, end-of-turn markers not counted as "
              "answer tokens; ATR over the tasks with a non-zero dense score; answer-ppl ATR: the mean over the same "
              "tasks of 100 x exp(dense answer loss - plan answer loss), the answer tokens' mean negative "
              "log-likelihood, a continuous score beside the accuracy; [95% CI]: paired bootstrap over the val rows"
              + (f" ({', '.join(f'{n} {c}' for n, c in rows.items())} rows)" if rows else "") + "; All Tasks: every "
              "unit ranked by the minimum over task families of its Taylor rank, each family's scores from its own "
              "calibration samples (appendix A.4); random rows: "
              "mean ± std [min, max] over seeds; p, d: a Taylor row's p-value among the random plans' ATRs and its "
              "paired difference to their mean [95% CI] (lightprune.quality.evidence). FLOPs: decoder prefill at "
              f"(V, T) = ({p['vision_tokens']}, {p['text_tokens']}), FFN channels counted in blocks of {align} and "
              "of 1."]
    return "\n".join(lines) + "\n"


def _against_null(row: Mapping[str, Any], key: str) -> str:
    """A Taylor row's standing among the random plans on ``key``: p-value and paired difference [95% CI]."""
    record = (row.get("standing") or {}).get(key)
    if record is None:
        return ""
    low, high = record["paired_ci"]
    return f"; p {record['p_value']:.3f}, d {record['paired_diff']:+.1f} [{low:+.1f}, {high:+.1f}]"


def plot_mwop(result: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """PNG of ATR against the FLOPs fraction: Taylor points, random means with min-max bars, the dense point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    points = list(dict.fromkeys(r["operating_point"] for r in result["rows"] if r["method"] != DENSE))
    for r in result["rows"]:
        if r["method"] == DENSE:
            ax.scatter([r["flops_fraction"]], [r["atr"]], marker="*", s=160, color="black", zorder=5, label="dense")
            continue
        color = colors[points.index(r["operating_point"]) % len(colors)]
        if r["method"] == "taylor":
            ax.scatter([r["flops_fraction"]], [r["atr"]], marker="o", s=50, color=color, zorder=4,
                       label=f"{r['operating_point']} Taylor")
        elif r["method"] == "taylor_all_tasks":
            ax.scatter([r["flops_fraction"]], [r["atr"]], marker="^", s=50, color=color, zorder=4,
                       label=f"{r['operating_point']} Taylor, All Tasks")
        elif r["atr"]["mean"] is not None:
            x, y = r["flops_fraction"], r["atr"]
            bars = {k: [[max(0.0, v["mean"] - v["min"])], [max(0.0, v["max"] - v["mean"])]]  # a mean of equal
                    for k, v in (("x", x), ("y", y))}                                         # values may round off
            ax.errorbar([x["mean"]], [y["mean"]], yerr=bars["y"], xerr=bars["x"], fmt="s", mfc="none", color=color,
                        capsize=4, zorder=3, label=f"{r['operating_point']} random ({len(r['seeds'])} seeds)")
    ax.axhline(100.0, color="grey", lw=0.8)
    ax.set_xlabel("decoder FLOPs fraction")
    ax.set_ylabel("ATR (%)")
    ax.set_title(f"MWOP training-free ({result['metric']} accuracy)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
