"""The run's report page: one self-contained Markdown file, ``report.md``, with PNG plots written beside it.

`write_report_page` reads the JSON files a run leaves in its directory and writes what they hold, so it
works during the run (the `ReportPage` callback, at the end of the job) and after the fact::

    python -m lightprune.reporting.page RUN_DIR

What it reads (each optional, at least one needed):

- ``report.json``: [`Export`][lightprune.callbacks.export.Export] (experts, parameters, checkpoint bytes, verification,
  timings), [`WidthExport`][lightprune.callbacks.width_export.WidthExport] (MWOP: pruned fractions, ATR, FLOPs,
  verification) and
  [`Evaluate`][lightprune.callbacks.evaluate.Evaluate] (``evaluation``: perplexity and accuracies before / after / test,
  lm-eval results);
- ``plan.json`` and ``scores.json`` (expert runs): kept experts per layer (``kept_experts.png``, drawn by
  `lightprune.reporting.report.plot_kept_experts`) and a heat map of each criterion's importance per layer x expert
  (``scores_<criterion>.png``, pruned experts crossed);
- ``merge_plan.json`` (HC-SMoE, M-SMoE): each layer's clusters of merged experts, with their dominants;
- ``search.json`` and ``width_plan.json`` (MWOP, [`WidthSearch`][lightprune.callbacks.width_search.WidthSearch]): every
  recovered candidate's training-free and recovered retention (ATR) against its ratio, per stage
  (``retention_vs_ratio.png``), the anchors, the chosen candidate, its plan's pruned fractions and FLOPs fraction.

Numbers in the tables are printed with `fmt` (integers exact, floats to 6 significant digits). Images are
referenced by relative names, so the folder can be moved or archived and read offline. Plots use matplotlib's
Agg backend (no display needed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

from lightprune.core.checks import check_utf8
from lightprune.core.jsonio import parse_json
from lightprune.core.paths import file_problem, write_atomically
from lightprune.experts.merging import MergePlan
from lightprune.experts.plan import ExpertPlan
from lightprune.reporting.report import plot_kept_experts

__all__ = ["write_report_page", "fmt", "main", "RUN_FILES"]

RUN_FILES = ("report.json", "plan.json", "merge_plan.json", "scores.json", "search.json", "width_plan.json")


def fmt(value: Any) -> str:
    """A table cell: ``-`` for None / NaN, integers exact with thousands separators (3,876,224), floats to 4
    significant digits (4.292e-06, 0.0123)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _read(run_dir: Path, name: str) -> Any:
    """The run file ``name`` (None when there is none); a name there that is not a regular file, not UTF-8 JSON, or
    holding a string the page (UTF-8) cannot hold is an error naming it."""
    path = run_dir / name
    problem = file_problem(path)
    if problem is not None:
        cls, why = problem
        raise cls(f"run file {str(path)!r} {why}; cannot write the report page: restore it, or move it away")
    if not path.is_file():
        return None
    try:
        data = parse_json(path.read_text(encoding="utf-8"), str(path))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); cannot write the report page") from None
    try:
        check_utf8(data, "report.md (UTF-8)")
    except ValueError as err:
        raise ValueError(f"{path}: {err}; cannot write the report page") from None
    return data


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------------------------------------- experts
def _merge_section(merge: dict | None) -> list[str]:
    """The merged clusters per layer (members, the dominant first in bold), from merge_plan.json."""
    if not merge:
        return []
    plan = MergePlan.from_dict(merge)

    def shown(members: list[int], dominant: int) -> str:
        return " ".join(f"**{e}**" if e == dominant else str(e) for e in members)

    rows = [[l, plan.num_experts[l], len(groups),
             ", ".join(shown(m, d) for m, d in zip(groups, plan.dominant[l]) if len(m) > 1) or "-"]
            for l, groups in plan.clusters.items()]
    return ["## Merged experts per layer", "", f"Method `{plan.method}`, router `{plan.router}`, aligned "
            f"{'yes' if plan.align else 'no'}; each merged expert (its dominant in bold) takes the dominant's place.",
            "", _table(["layer", "experts", "merged experts", "clusters of more than one"], rows), ""]


def _expert_section(run_dir: Path, report: dict | None, plan: dict | None, scores: dict | None) -> list[str]:
    out: list[str] = []
    if report and "experts_before" in report:
        heading = "## Merging" if report.get("merge") else "## Pruning"
        out += [heading, "", f"Criterion `{report.get('criterion')}`, ratio {fmt(report.get('ratio'))}, "
                f"allocation `{report.get('allocation')}`; source `{report.get('source')}`.", "",
                _table(["", "before", "after"], [
                    ["routed experts", report["experts_before"], report["experts_after"]],
                    ["parameters", report.get("params_before"), report.get("params_after")],
                    ["checkpoint bytes", report.get("checkpoint_bytes_before"), report.get("checkpoint_bytes_after")],
                ]), "",
                _table(["verification max abs logit diff", "seconds scoring", "seconds export", "checkpoint"],
                       [[report.get("max_abs_diff"), report.get("seconds_scoring"), report.get("seconds_export"),
                         report.get("checkpoint_dir")]]), ""]
    if plan:
        expert_plan = ExpertPlan.from_dict(plan)
        plot_kept_experts(expert_plan, run_dir / "kept_experts.png")
        pruned = expert_plan.pruned()
        out += ["## Kept experts per layer", "", "![kept experts per layer](kept_experts.png)", "",
                _table(["layer", "experts", "kept", "pruned ids"],
                       [[l, expert_plan.num_experts[l], len(ids), " ".join(map(str, pruned[l])) or "-"]
                        for l, ids in expert_plan.keep.items()]), ""]
    for name, entry in (scores or {}).items():
        image = f"scores_{''.join(c if c.isalnum() or c in '-_' else '_' for c in name)}.png"
        _plot_scores(entry["importance"], plan, name, run_dir / image)
        out += [f"## Expert scores: {name}", "", "Importance (higher = keep) per MoE layer x expert; "
                "crossed: pruned by the plan.", "", f"![{name} scores]({image})", ""]
    return out


def _plot_scores(importance: dict[str, list[float]], plan: dict | None, name: str, path: Path) -> None:
    import numpy as np

    plt = _pyplot()
    layers = sorted(importance, key=int)
    width = max(len(importance[l]) for l in layers)
    grid = np.full((len(layers), width), np.nan)
    for i, l in enumerate(layers):
        grid[i, :len(importance[l])] = importance[l]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * width + 2), max(2.5, 0.35 * len(layers) + 1.5)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, label="importance")
    if plan:
        for i, l in enumerate(layers):
            kept = set(plan["keep"].get(l, range(len(importance[l]))))
            xs = [e for e in range(len(importance[l])) if e not in kept]
            ax.scatter(xs, [i] * len(xs), marker="x", color="white", s=18, linewidths=1)
    ax.set_yticks(range(len(layers)), layers)
    ax.set_xlabel("expert")
    ax.set_ylabel("MoE layer")
    ax.set_title(name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- evaluation
def _evaluation_section(run_dir: Path, evaluation: dict | None) -> list[str]:
    if not evaluation:
        return []
    labels = [k for k in ("before", "after", "test") if isinstance(evaluation.get(k), dict)]
    if not labels:
        return []
    runs = [evaluation[k] for k in labels]
    rows = [["perplexity", *[r.get("perplexity") for r in runs]], ["loss", *[r.get("loss") for r in runs]],
            ["next-token accuracy", *[r.get("next_token_accuracy") for r in runs]]]
    tasks = list(evaluation.get("task_names") or runs[0].get("task_accuracy", {}))
    if tasks == ["default"] and evaluation.get("metric", "token") == "token":
        tasks = []  # one task of next-token accuracy: the next-token row already is it
    rows += [[f"{evaluation.get('metric', 'token')} accuracy: {t}", *[r.get("task_accuracy", {}).get(t) for r in runs]]
             for t in tasks]
    for task in sorted({t for r in runs for t in r.get("lm_eval", {}) if t != "samples"}):
        keys = sorted({k for r in runs for k in r.get("lm_eval", {}).get(task, {})
                       if isinstance(r["lm_eval"][task].get(k), (int, float)) and "stderr" not in k})
        rows += [[f"lm-eval {task}: {k}", *[r.get("lm_eval", {}).get(task, {}).get(k) for r in runs]] for k in keys]
    rows += [["label tokens", *[r.get("tokens") for r in runs]], ["samples", *[r.get("samples") for r in runs]]]
    out = ["## Evaluation", "", f"Held-out split `{evaluation.get('split')}`.", "", _table(["metric", *labels], rows), ""]
    plt = _pyplot()
    names = ["next-token", *tasks]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(names) + 1), 3.2))
    step = 0.8 / len(labels)
    for j, (label, r) in enumerate(zip(labels, runs)):
        values = [r.get("next_token_accuracy")] + [r.get("task_accuracy", {}).get(t) for t in tasks]
        ax.bar([i + j * step for i in range(len(names))], [v if v is not None else 0.0 for v in values],
               width=step, label=f"{label} (ppl {fmt(r.get('perplexity'))})")
    ax.set_xticks([i + step * (len(labels) - 1) / 2 for i in range(len(names))], names)
    ax.set_ylabel(f"accuracy ({evaluation.get('metric', 'token')})")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=len(labels))
    fig.tight_layout()
    fig.savefig(run_dir / "evaluation.png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out + ["![accuracy before and after](evaluation.png)", ""]


# ---------------------------------------------------------------------------------------------- MWOP
def _width_fractions(plan: dict) -> list[list[Any]]:
    paths = plan.get("paths", ["v2v", "t2v", "t2t"])
    rows = []
    for j, path in enumerate(paths):
        cells = [row[j] for mask in plan["attn_keep"].values() for row in mask]
        total = sum(plan["num_heads"].values())
        rows.append([path, (total - sum(cells)) / total if total else None])
    channels = sum(plan["intermediate_size"].values())
    for mu in ("vision", "text"):
        kept = sum(sum(m[mu]) for m in plan["ffn_keep"].values())
        rows.append([f"ffn_{mu}", (channels - kept) / channels if channels else None])
    return rows


def _width_section(run_dir: Path, search: dict | None, width_plan: dict | None, report: dict | None) -> list[str]:
    out: list[str] = []
    if search:
        state = search["search"]
        history = state["history"]
        anchors = {a["stage"]: a["ratio"] for a in state.get("anchors", {}).values()}
        meta = (width_plan or {}).get("metadata", {})
        dense = meta["flops"] / meta["flops_fraction"] if meta.get("flops") and meta.get("flops_fraction") else None
        out += ["## Width search (MWOP)", "", f"Chosen candidate: **{search['chosen']}**. Reference (dense M0) "
                "scores per task:", "", _table(["task", "reference score"],
                                             list(zip(search.get("task_names", []), search.get("reference", [])))), "",
                f"Grid {', '.join(map(fmt, state['grid']))}; stages {', '.join(state['stages'])}; min retention "
                f"{fmt(state['min_retention'])}; FLOPs profile (vision, text tokens) {search.get('flops_profile')}.", "",
                "Recovered candidates in search order (training-free ATR: the stage's sweep on the selection set; "
                "recovered ATR: after recovery, on the evaluation set):", "",
                _table(["stage", "ratio", "training-free ATR", "recovered ATR", "FLOPs", "FLOPs fraction", "anchor",
                        "chosen"],
                       [[c["stage"], c["ratio"], c.get("training_free_atr"), c["atr"], c["flops"],
                         c["flops"] / dense if dense else None, anchors.get(c["stage"]) == c["ratio"],
                         f"{c['stage']}@{c['ratio']:g}" == search["chosen"]] for c in history]), ""]
        _plot_retention(history, search["chosen"], run_dir / "retention_vs_ratio.png", state.get("sweeps", {}))
        out += ["![retention vs ratio](retention_vs_ratio.png)", ""]
    if width_plan:
        meta = width_plan.get("metadata", {})
        out += ["## Chosen width plan", "", _table(["ATR", "FLOPs", "FLOPs fraction", "chosen"],
                                                  [[meta.get("atr"), meta.get("flops"), meta.get("flops_fraction"),
                                                    meta.get("chosen")]]), "",
                _table(["unit", "pruned fraction"], _width_fractions(width_plan)), ""]
    if report and report.get("method") == "mwop":
        ver = report.get("verification", {})
        out += ["## Width export", "", _table(["checkpoint", "bytes", "verification max abs logit diff", "seconds"],
                                              [[report.get("checkpoint"), report.get("checkpoint_bytes"),
                                                ver.get("max_abs_diff"), report.get("seconds")]]), "",
                _table(["unit", "pruned fraction (export)"], sorted(report.get("pruned_fractions", {}).items())), ""]
    return out


def _plot_retention(history: list[dict], chosen: str, path: Path, sweeps: dict | None = None) -> None:
    """Per stage: recovered ATR of its candidates, and its training-free sweep (the whole grid when the search
    kept it, else the candidates' own training-free ATR)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    for stage in dict.fromkeys(c["stage"] for c in history):
        cands = sorted((c for c in history if c["stage"] == stage), key=lambda c: c["ratio"])
        line = ax.plot([c["ratio"] for c in cands], [c["atr"] for c in cands], "o-", label=f"{stage} recovered")[0]
        sweep = (sweeps or {}).get(stage)
        if sweep:
            free = sorted((float(r), atr) for r, atr in sweep.items())
        else:
            free = [(c["ratio"], c["training_free_atr"]) for c in cands if c.get("training_free_atr") is not None]
        ax.plot([r for r, _ in free], [a for _, a in free], "o--", mfc="none", color=line.get_color(),
                label=f"{stage} training-free")
    best = [c for c in history if f"{c['stage']}@{c['ratio']:g}" == chosen]
    if best:
        ax.scatter([best[0]["ratio"]], [best[0]["atr"]], s=160, marker="*", color="black", zorder=5, label="chosen")
    ax.axhline(100.0, color="grey", lw=0.8)
    ax.set_xlabel("masking ratio")
    ax.set_ylabel("ATR (%)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- page
def write_report_page(run_dir: str | os.PathLike) -> Path:
    """Write ``report.md`` (and its PNGs) in ``run_dir`` from the run's JSON files; returns its path."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory {str(run_dir)!r} does not exist")
    data = {name: _read(run_dir, name) for name in RUN_FILES}
    if all(v is None for v in data.values()):
        raise ValueError(f"{run_dir} holds none of the run files {list(RUN_FILES)}: nothing to report")
    report = data["report.json"]
    lines = [f"# lightprune run: {run_dir.resolve().name}", "",
             "Files: " + ", ".join(f"`{n}`" for n, v in data.items() if v is not None) + ".", ""]
    lines += _expert_section(run_dir, report, data["plan.json"], data["scores.json"])
    lines += _merge_section(data["merge_plan.json"])
    lines += _width_section(run_dir, data["search.json"], data["width_plan.json"], report)
    lines += _evaluation_section(run_dir, (report or {}).get("evaluation"))
    text = "\n".join(lines).rstrip() + "\n"
    return write_atomically(run_dir / "report.md", lambda tmp: tmp.write_text(text, encoding="utf-8"), "report page")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m lightprune.reporting.page RUN_DIR``: write RUN_DIR/report.md from the run's JSON files."""
    parser = argparse.ArgumentParser(prog="python -m lightprune.reporting.page", description=main.__doc__)
    parser.add_argument("run_dir", help="a run directory (trainer.default_root_dir of the run)")
    args = parser.parse_args(argv)
    print(write_report_page(args.run_dir))


if __name__ == "__main__":
    main()
