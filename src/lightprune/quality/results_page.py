"""docs/RESULTS.md: the quality tables, plots and benchmark figures in one page (readable offline).

:func:`write_results` takes what :mod:`lightprune.quality.tables`,
:mod:`lightprune.quality.width_quality` and ``scripts/collect_benchmarks.py`` return (any may be
missing) and writes ``<out>/RESULTS.md``, ``<out>/results/results.json`` and the PNGs under
``<out>/results/``. Retention is ``100 * metric / dense`` for accuracies and ``100 * dense / metric``
for perplexities (so 100 = unchanged and lower is worse for both).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightprune.core.checks import ratio_count
from lightprune.quality.bench_section import benchmarks_markdown
from lightprune.quality.expert_quality import summarise
from lightprune.quality.intervals import RESAMPLES, retention
from lightprune.quality.maep_section import maep_section
from lightprune.quality.width_quality import mwop_markdown, plot_mwop
from lightprune.quality.width_recovery import mwop_recovery_markdown

__all__ = ["retention", "write_results"]


def _percent(ratio: float) -> int:
    """``ratio`` as a whole percent, exactly (0.29 is 29, where ``int(0.29 * 100)`` is 28)."""
    return ratio_count(ratio, 100)


def _fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


def _by_criterion(result: Mapping[str, Any]) -> dict[str, dict[float, Mapping[str, Any]]]:
    out: dict[str, dict[float, Mapping[str, Any]]] = {}
    for row in result["rows"]:
        out.setdefault(row["criterion"], {})[float(row["ratio"])] = row
    return out


def _ratios(result: Mapping[str, Any]) -> list[float]:
    return sorted({float(r["ratio"]) for r in result["rows"]})


def _random_cell(result, ratio: float, metric: str, digits: int) -> str:
    s = summarise(result["random"][str(ratio)]["seeds"])[metric]
    return f"{_fmt(s['mean'], digits)} ± {_fmt(s['std'], digits)} [{_fmt(s['min'], digits)}, {_fmt(s['max'], digits)}]"


def _metric_table(result: Mapping[str, Any], columns: list[tuple[str, str, int]]) -> str:
    """One row per criterion; per ratio and column (metric, header, digits) its value; random last."""
    ratios = _ratios(result)
    head = ["criterion", "allocation"] + [f"{h} @{_percent(r)}%" for r in ratios for _, h, _ in columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    dense = result["dense"]
    lines.append("| dense | - | " + " | ".join(_fmt(dense[m], d) for _ in ratios for m, _, d in columns) + " |")
    for name, by_ratio in _by_criterion(result).items():
        alloc = next(iter(by_ratio.values()))["allocation"]
        cells = [_fmt(by_ratio[r]["metrics"][m], d) for r in ratios for m, _, d in columns]
        lines.append(f"| {name} | {alloc} | " + " | ".join(cells) + " |")
    n = len(next(iter(result["random"].values()))["seeds"])
    cells = [_random_cell(result, r, m, d) for r in ratios for m, _, d in columns]
    lines.append(f"| random ({n} seeds: mean ± std [min, max]) | uniform | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _retention_cell(row: Mapping[str, Any], metric: str, dense: float) -> str:
    """The row's retention of ``metric``, with its bootstrap interval when it was measured with one."""
    cell = _fmt(retention(metric, row["metrics"][metric], dense))
    interval = row.get("intervals", {}).get(metric)
    return f"{cell} [{_fmt(interval[0])}, {_fmt(interval[1])}]" if interval else cell


def _retention_table(result: Mapping[str, Any], metrics: list[str]) -> str:
    """One row per criterion: retention per ratio and metric (with its 95% bootstrap interval when measured);
    random last, as mean [min, max] over its seeds."""
    ratios = _ratios(result)
    head = ["criterion"] + [f"{m} retention @{_percent(r)}%" for r in ratios for m in metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    dense = result["dense"]
    for name, by_ratio in _by_criterion(result).items():
        cells = [_retention_cell(by_ratio[r], m, dense[m]) for r in ratios for m in metrics]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    cells = []
    for r in ratios:
        for m in metrics:
            vals = [retention(m, s[m], dense[m]) for s in result["random"][str(r)]["seeds"]]
            cells.append(f"{_fmt(sum(vals) / len(vals))} [{_fmt(min(vals))}, {_fmt(max(vals))}]")
    lines.append("| random (mean [min, max]) | " + " | ".join(cells) + " |")
    if any("intervals" in row for row in result["rows"]):
        lines += ["", f"[low, high] after a criterion: the 95% paired bootstrap interval of its retention over the "
                  f"evaluation rows ({RESAMPLES} resamples, the same for every row: lightprune.quality.intervals); "
                  "random's brackets are its min and max over seeds."]
    return "\n".join(lines)


def _summary(result: Mapping[str, Any], metric: str) -> str:
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
        out.append(f"At {_percent(r)}%: best {best} {kept[best]:.1f}, worst {worst} {kept[worst]:.1f}, random "
                   f"{sum(vals) / len(vals):.1f} [{min(vals):.1f}, {max(vals):.1f}]; above random's maximum: "
                   f"{', '.join(above) if above else 'none'}.")
    return f"{metric} retention (%): " + " ".join(out)


def _rho_table(proxy_rho: Mapping[str, Any]) -> str:
    lines = ["| token subset | proxy | mean rho | per layer |", "|---|---|---|---|"]
    for subset, proxies in proxy_rho.items():
        for proxy, r in proxies.items():
            per = ", ".join(f"{l}: {_fmt(v, 2)}" for l, v in r["per_layer"].items())
            lines.append(f"| {subset} | {proxy} | {_fmt(r['mean'], 3)} | {per} |")
    return "\n".join(lines)


def _stability_table(stab: Mapping[str, Any]) -> str:
    a, b = stab["pair"]
    lines = [f"| criterion | token subset | mean rho ({a} vs {b}) | per layer |", "|---|---|---|---|"]
    for criterion, subsets in stab["criteria"].items():
        for subset, r in subsets.items():
            per = ", ".join(f"{l}: {_fmt(v, 2)}" for l, v in r["per_layer"].items())
            lines.append(f"| {criterion} | {subset} | {_fmt(r['mean'], 3)} | {per} |")
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
               label=f"{row['criterion']} @{_percent(row['ratio'])}%")
    ax.set_xlabel("layer")
    ax.set_ylabel("experts pruned")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _balance_table(r: Mapping[str, Any]) -> list[str]:
    """The testbed's routing balance per MoE layer (absent in results measured before it was recorded)."""
    balance = r.get("routing_balance")
    if not balance:
        return []
    goal = balance["goal"]
    rows = ["| MoE layer | least routed expert's share | share x E | normalised entropy |", "|---|---:|---:|---:|"]
    rows += [f"| {layer} | {v['min_share']:.4f} | {v['min_share_x_experts']:.2f} | {v['entropy']:.3f} |"
             for layer, v in balance["layers"].items()]
    verdict = "met in every layer" if balance["met"] else "**not met** in every layer"
    return [f"Routing balance on the calibration tokens (goal: every expert at least 1/(4E) of a layer's routing, "
            f"share x E >= {goal['min_share_x_experts']}, and normalised entropy >= {goal['entropy']}: {verdict}):",
            "", *rows, ""]


def _sensitivity_note(r: Mapping[str, Any]) -> list[str]:
    """How the router_sensitivity row was fitted (absent in results measured before it was recorded)."""
    steps = r.get("router_sensitivity_steps")
    if not steps:
        return []
    data = r.get("router_sensitivity_data", "the testbed's train split (no instruction data distinct from its "
                                               "pretraining text)")
    return [f"router_sensitivity: configs/router_lora.yaml's recipe (LoRA r = alpha = 8 on the routers, AdamW, lr "
            f"2e-4, weight decay 0.01, cosine with 5 warm-up steps) for {steps} steps of {data}.", ""]


def _text_section(r: Mapping[str, Any], out: Path) -> list[str]:
    tb = r["testbed"]
    plot_retention(r, "ppl", out / "results" / "text_ppl_retention.png", "text MoE testbed: perplexity retention")
    ppl = tb["held_out_perplexity"]["test"]
    return [
        "## Text MoE testbed", "",
        f"Qwen3-MoE-style, {tb['parameters']:,} parameters ({tb['spec']['model'].get('num_hidden_layers')} layers, "
        f"{tb['spec']['model'].get('num_experts')} experts, top-{tb['spec']['model'].get('num_experts_per_tok')}), "
        f"trained {tb['spec']['steps']} steps of {tb['spec']['batch_size']} x {tb['spec']['max_length']} tokens "
        "on prose and code "
        f"from Python's own documentation and standard library; held-out test perplexity {ppl['all']:.1f} "
        f"(prose {ppl['prose']:.1f}, code {ppl['code']:.1f}). Calibration on the calibration split (mixed domains), "
        "evaluation on the first test rows of each domain: perplexity (every token) and next-token accuracy.", "",
        *_balance_table(r), *_sensitivity_note(r),
        _metric_table(r, [("ppl", "ppl", 1), ("ppl_prose", "ppl prose", 1), ("ppl_code", "ppl code", 1),
                          ("acc", "acc", 3)]), "",
        _retention_table(r, ["ppl", "acc"]), "",
        _summary(r, "ppl"), "",
        "![perplexity retention](results/text_ppl_retention.png)", "",
        "Per-layer Spearman rho of each proxy against the ground-truth LM-head KL of removing each expert alone:", "",
        _rho_table(r["proxy_rho"]), "",
        "Ranking stability across calibration sets (per-layer Spearman between the rankings):", "",
        _stability_table(r["stability"]), ""]


def _mllm_section(r: Mapping[str, Any], out: Path) -> list[str]:
    tb = r["testbed"]
    plot_retention(r, "acc_image", out / "results" / "mllm_image_retention.png",
                   "multimodal MoE testbed: image-task accuracy retention")
    plot_retention(r, "ppl_text", out / "results" / "mllm_text_retention.png",
                   "multimodal MoE testbed: text perplexity retention")
    lines = [
        "## Multimodal MoE testbed", "",
        f"Qwen3-VL-MoE-style, {tb['parameters']:,} parameters ({_moe_shape(tb)}), trained {tb['spec']['steps']} "
        f"steps of {tb['spec']['batch_size']} rows on Testbed VQA ({_vqa_tasks(tb)}{_canvas(tb)}) in "
        f"{tb['train_seconds'] / 60:.0f} minutes on this machine. Calibration on the calibration split "
        "(all tasks); evaluation on the val split: answer accuracy per image task (every answer token right), "
        + ("the image answers' perplexity (their loss beside their accuracy) " if "ppl_image" in r["dense"] else "")
        + "and the text rows' completion perplexity. Multimodal and text reported apart. " + _alpha_sentence(r), "",
        *_balance_table(r),
        _metric_table(r, [c for c in [("acc_image", "image acc", 3)]
                      + [(m, m[len("acc_"):].replace("chart_", "chart "), 3) for m in _image_task_metrics(r)]
                      + [("ppl_image", "image answer ppl", 2), ("ppl_text", "text ppl", 1)] if c[0] in r["dense"]]),
        "", "Chance accuracy (one over the answer words): " + ", ".join(
            f"{m[len('acc_'):].replace('chart_', 'chart ')} {_chance(m[len('acc_'):]):.3f}"
            for m in _image_task_metrics(r) if _chance(m[len("acc_"):]) is not None) + ".",
        "", _retention_table(r, [m for m in ("acc_image", "ppl_image", "ppl_text") if m in r["dense"]]), "",
        _summary(r, "acc_image"), "", _summary(r, "ppl_text"), "",
        "![image-task retention](results/mllm_image_retention.png)",
        "![text retention](results/mllm_text_retention.png)", ""]
    if plot_pruned_per_layer(r, out / "results" / "mllm_pruned_per_layer.png", "global allocation: experts pruned"):
        lines += ["![pruned per layer](results/mllm_pruned_per_layer.png)", ""]
    lines += ["Proxy rho against the ground-truth KL (per token subset):", "", _rho_table(r["proxy_rho"]), "",
              "Cross-dataset stability (digits vs charts calibration), per token subset:", "",
              _stability_table(r["stability"]), ""]
    return lines


def _moe_shape(tb: Mapping[str, Any]) -> str:
    """The testbed's MoE layers, experts and top-k, from its spec (the preset's overrides of the tiny config)."""
    text = (tb["spec"].get("model") or {}).get("text_config") or {}
    if not text:
        return "the tiny config's shape"
    return (f"{text.get('num_hidden_layers')} MoE layers of {text.get('num_experts')} experts, "
            f"top-{text.get('num_experts_per_tok')}")


def _canvas(tb: Mapping[str, Any]) -> str:
    data = tb["spec"].get("data") or {}
    if not data.get("canvas"):
        return ""
    where = "in the middle of" if data.get("canvas_place") == "centre" else "at a random place on"
    return f"; each {data.get('image_size', 32)}-pixel picture {where} a {data['canvas']}-pixel square of grey noise"


def _image_task_metrics(r: Mapping[str, Any]) -> list[str]:
    """The dense row's per-image-task accuracies (``acc_<task>``), in its order."""
    return [m for m in r["dense"] if m.startswith("acc_") and m not in ("acc_image", "acc_text")]


def _vqa_tasks(tb: Mapping[str, Any]) -> str:
    """The testbed's tasks as the rows ask them (digits are scikit-learn's, charts drawn by matplotlib)."""
    from lightprune.data.generated.testbed_vqa import TASK_QUESTIONS, TESTBED_VQA_TASKS

    tasks = tb["spec"].get("data", {}).get("tasks", TESTBED_VQA_TASKS)
    return "; ".join(f'{t}: "{TASK_QUESTIONS[t]}"' if t in TASK_QUESTIONS else f"{t}: Python-documentation rows"
                     for t in tasks)


def _chance(task: str) -> float | None:
    """An image task's chance accuracy: one over its answer words (None for a task without a fixed answer set)."""
    from lightprune.data.generated.testbed_vqa import BAR_COLORS, COUNT_WORDS, DIGIT_WORDS

    answers = {"digit": DIGIT_WORDS, "chart_left": BAR_COLORS, "chart_tallest": BAR_COLORS,
               "chart_count": COUNT_WORDS}.get(task)
    return None if answers is None else 1 / len(answers)


def _alpha_sentence(r: Mapping[str, Any]) -> str:
    """MAEP's closed-form alpha and the layer-mean rhos it comes from (when measured)."""
    if r.get("maep_alpha") is None:
        return ("MAEP's closed-form alpha is outside [0, 1] on this model, so its global row was not measured: "
                f"{r.get('maep_alpha_error')}.")
    text = f"MAEP's closed-form alpha on this model: {r['maep_alpha']:.3f}"
    report = r.get("maep_alpha_report")
    if report:
        text += (f" (a = rho(t,v) - rho(t,la) = {report['mean_rho_tv']:.3f} - {report['mean_rho_tla']:.3f}, "
                 f"b = rho(v,la) = {report['mean_rho_vla']:.3f}, layer means)")
    return text + "."


def _shown_seed(name: str, part: Mapping[str, Any], claims: Sequence[Mapping[str, Any]]) -> str:
    """Which testbed seed a part's tables are, and how many seeds its checks are over."""
    testbed = {"text MoE": "text", "multimodal MoE": "mllm", "MWOP": "mwop"}[name]
    seeds = {s["testbed_seed"] for c in claims if c["testbed"] == testbed for s in c["seeds"]}
    seed = (part.get("testbed") or {}).get("seed")
    if seed is None or not seeds:
        return f"{name}: one draw measured before the seeded rule (its checks are not measured)"
    return f"{name}: seed {seed} of the {len(seeds)} its checks are over"


def _which(record: Mapping[str, Any]) -> str:
    """What else a seed's record is one of: router sensitivity's fit seed, MWOP's operating point."""
    if "operating_point" in record:
        return f" {record['operating_point']}"
    return f" fit {record['fit_seed']}" if record.get("fit_seed") else ""


def _criteria_section(criteria: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every criterion against the random null over the testbed seeds, by the claims' rule
    (:func:`lightprune.quality.claims.criteria_over_seeds`)."""
    rows = ["| testbed | criterion | allocation | metric | against random | over seeds: mean difference [95% t "
            "interval] | per testbed seed: p, difference [95% interval] |", "|---|---|---|---|---|---|---|"]
    for c in criteria:
        seeds = "; ".join(f"seed {s['testbed_seed']}: p {s['p_value']:.3f}, {s['paired_diff']:+.1f} "
                          f"[{s['paired_ci'][0]:+.1f}, {s['paired_ci'][1]:+.1f}]" for s in c["seeds"])
        rows.append(f"| {c['testbed']} | {c['criterion']} | {c['allocation']} | {c['metric']} retention "
                    f"@{_percent(c['ratio'])}% | {c['verdict']} | {_over_seeds_cell(c)} | {seeds or '-'} |")
    return ["## Every criterion against random, over testbed seeds", "",
            "Each row of the tables below judged against the random null by the claims' rule over every testbed "
            "seed (the rule is stated above the claims).", "", *rows, ""]


def _over_seeds_cell(check: Mapping[str, Any]) -> str:
    """The mean paired difference over the seeds and its t interval (:func:`lightprune.quality.claims.over_seeds`)."""
    over = check.get("over_seeds")
    if not over:
        return "-"
    interval = over.get("interval")
    shown = f"{over['mean']:+.1f}" + (f" [{interval[0]:+.1f}, {interval[1]:+.1f}]" if interval else "")
    return f"{shown}, {over['seeds']} seeds"


def _seeded_claims_section(claims: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each check over the testbed seeds (:func:`lightprune.quality.claims.claims_over_seeds`): the verdict and, per
    seed, the p-value against the random null (or "-" against a rival) and the paired difference with its interval."""
    rows = ["| paper | claim | testbed | metric | here | over seeds: mean difference [95% t interval] | per testbed "
            "seed: p, difference [95% interval] |", "|---|---|---|---|---|---|---|"]
    for c in claims:
        seeds = "; ".join(
            f"seed {s['testbed_seed']}{_which(s)}: "
            + (f"p {s['p_value']:.3f} (N {s['null_size']}), " if "p_value" in s else "")
            + f"{s['paired_diff']:+.1f} [{s['paired_ci'][0]:+.1f}, {s['paired_ci'][1]:+.1f}]" for s in c["seeds"])
        seeds = "; ".join([seeds] * bool(seeds) + [f"seed {u['testbed_seed']}: not measured ({u['error']})"
                                                    for u in c.get("unmeasured", [])])
        verdict = c["verdict"] if c["verdict"] in ("held", "not measured") else f"**{c['verdict']}**"
        where = "at the paper's operating points" if c["testbed"] == "mwop" else f"@{_percent(c['ratio'])}%"
        rows.append(f"| {c['paper']} | {c['claim']} | {c['testbed']} | {c['metric']} retention {where} | "
                    f"{verdict} | {_over_seeds_cell(c)} | {seeds or '-'} |")
    return ["## Claims over testbed seeds", "",
            "The rule, stated before the seeds were measured (lightprune.quality.claims). On each independently "
            "trained testbed seed, the paired difference d of retentions (criterion minus the mean of N random "
            "plans, or minus a named rival) on the same evaluation rows, with its 95% bootstrap interval over the "
            "rows; against random also the p-value among the random plans. A seed is for the claim when its "
            "interval lies above 0 (and p < 0.05), against it when its interval lies below 0 (and the p-value the "
            "other way is below 0.05). Over the seeds, the 95% t interval of the seeds' d (the training seed's "
            "noise): **held** when it lies above 0 and no seed is against; **did not hold** when it lies below 0 "
            "and no seed is for; **depends on the training seed** when some seed is for and another against; "
            "otherwise within noise. MAEP's closed-form alpha is judged only where a = rho(t,v) - rho(t,la) has a "
            "bootstrap interval over the calibration samples that excludes 0 on every seed. Too few testbed seeds "
            "(under 3; the micro run: under 2): no verdict, the figures shown.",
            "", *rows, ""]


def page_tables(part: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """One seed's tables as results.json keeps them: without the per-row records (they stay in the seed's own file,
    ``seeds/<part>-seed<n>.json``; MWOP's recovery has its own), so that the page's file does not grow with the rows
    measured."""
    if part is None:
        return None
    kept = {k: v for k, v in part.items() if k != "records"}
    if isinstance(kept.get("recovery"), Mapping):
        kept["recovery"] = {k: v for k, v in kept["recovery"].items() if k != "records"}
    return kept


def write_results(out: str | Path = "docs", *, text: Mapping | None = None, mllm: Mapping | None = None,
                  mwop: Mapping | None = None, benchmarks: Mapping | None = None,
                  claims: Sequence[Mapping[str, Any]] | None = None,
                  criteria: Sequence[Mapping[str, Any]] | None = None,
                  maep: Sequence[Mapping[str, Any]] | None = None, command: str | None = None) -> Path:
    """Write ``<out>/RESULTS.md`` (+ ``results/results.json`` and PNGs) from the parts given; its path.
    ``claims``: the checks over testbed seeds (:func:`lightprune.quality.claims.claims_over_seeds`); ``maep``: MAEP's
    alpha on each multimodal testbed seed (:func:`~lightprune.quality.maep_section.maep_seed_record`)."""
    out = Path(out)
    (out / "results").mkdir(parents=True, exist_ok=True)
    text, mllm, mwop = page_tables(text), page_tables(mllm), page_tables(mwop)
    data = {"text": text, "mllm": mllm, "mwop": mwop, "benchmarks": benchmarks, "claims": claims,
            "criteria": criteria, "maep": maep}
    (out / "results" / "results.json").write_text(json.dumps(data, separators=(",", ":"), default=float) + "\n")
    lines = ["# Results", "",
             "Measured here, on CPU, on testbed models trained by lightprune itself (no pretrained weights can be "
             "fetched): every criterion at the same pruning ratios, side by side, random over seeds with its spread, "
             "95% bootstrap intervals over the evaluation rows, and the anti orderings of REAP, AIMER and router "
             "sensitivity (most important pruned first) as the ceiling of damage. Rows with allocation "
             "`merge` are MAEP's merging baselines (HC-SMoE, M-SMoE): the same share of each layer's experts merged "
             "away instead of pruned, measured in the form lightprune exports (one expert per cluster in its "
             "dominant's place, the dominant's router row). Small models, so the absolute numbers are not the "
             "papers'; the ordering of the criteria is what this page is for.", ""]
    if command:
        lines += [f"Regenerate: `{command}`", ""]
    if claims:
        lines += _seeded_claims_section(claims)
        shown = [_shown_seed(name, part, claims) for name, part in
                 (("text MoE", text), ("multimodal MoE", mllm), ("MWOP", mwop)) if part]
        lines += ["The tables after these sections show one testbed seed each: " + "; ".join(shown) + ".", ""]
    if criteria:
        lines += _criteria_section(criteria)
    if text:
        lines += _text_section(text, out)
    if maep:
        lines += maep_section(maep)
    if mllm:
        lines += _mllm_section(mllm, out)
    if mwop:
        plot_mwop(mwop, out / "results" / "mwop_atr_flops.png")
        lines += ["## MWOP on the dense multimodal testbed", "", mwop_markdown(mwop), "",
                  "![MWOP ATR vs FLOPs](results/mwop_atr_flops.png)", ""]
        if mwop.get("recovery"):
            lines += ["After recovery (the paper's claim is made after its recovery epochs):", "",
                      mwop_recovery_markdown(mwop["recovery"]), ""]
    if benchmarks:
        lines += [benchmarks_markdown(benchmarks), ""]
    path = out / "RESULTS.md"
    path.write_text("\n".join(lines))
    return path
