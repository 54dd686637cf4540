"""docs/RESULTS.md: the quality tables, plots and benchmark figures in one page (readable offline).

`write_results` takes what `lightprune.quality.tables`,
`lightprune.quality.width_quality` and ``scripts/collect_benchmarks.py`` return (any may be
missing) and writes ``<out>/RESULTS.md``, ``<out>/results/results.json`` and the PNGs under
``<out>/results/``. Retention is ``100 * metric / dense`` for accuracies and ``100 * dense / metric``
for perplexities (so 100 = unchanged and lower is worse for both).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightprune.quality.bench_section import benchmarks_markdown
from lightprune.quality.maep_section import maep_section
from lightprune.quality.mwop_section import mwop_markdown, plot_mwop
from lightprune.quality.sweep_tables import (
    metric_table,
    percent,
    plot_pruned_per_layer,
    plot_retention,
    retention_summary,
    retention_table,
    rho_table,
    stability_table,
)
from lightprune.quality.width_recovery import mwop_recovery_markdown

__all__ = ["write_results"]


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
        metric_table(r, [("ppl", "ppl", 1), ("ppl_prose", "ppl prose", 1), ("ppl_code", "ppl code", 1),
                          ("acc", "acc", 3)]), "",
        retention_table(r, ["ppl", "acc"]), "",
        retention_summary(r, "ppl"), "",
        "![perplexity retention](results/text_ppl_retention.png)", "",
        "Per-layer Spearman rho of each proxy against the ground-truth LM-head KL of removing each expert alone:", "",
        rho_table(r["proxy_rho"]), "",
        "Ranking stability across calibration sets (per-layer Spearman between the rankings):", "",
        stability_table(r["stability"]), ""]


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
        metric_table(r, [c for c in [("acc_image", "image acc", 3)]
                      + [(m, m[len("acc_"):].replace("chart_", "chart "), 3) for m in _image_task_metrics(r)]
                      + [("ppl_image", "image answer ppl", 2), ("ppl_text", "text ppl", 1)] if c[0] in r["dense"]]),
        "", "Chance accuracy (one over the answer words): " + ", ".join(
            f"{m[len('acc_'):].replace('chart_', 'chart ')} {_chance(m[len('acc_'):]):.3f}"
            for m in _image_task_metrics(r) if _chance(m[len("acc_"):]) is not None) + ".",
        "", retention_table(r, [m for m in ("acc_image", "ppl_image", "ppl_text") if m in r["dense"]]), "",
        retention_summary(r, "acc_image"), "", retention_summary(r, "ppl_text"), "",
        "![image-task retention](results/mllm_image_retention.png)",
        "![text retention](results/mllm_text_retention.png)", ""]
    if plot_pruned_per_layer(r, out / "results" / "mllm_pruned_per_layer.png", "global allocation: experts pruned"):
        lines += ["![pruned per layer](results/mllm_pruned_per_layer.png)", ""]
    lines += ["Proxy rho against the ground-truth KL (per token subset):", "", rho_table(r["proxy_rho"]), "",
              "Cross-dataset stability (digits vs charts calibration), per token subset:", "",
              stability_table(r["stability"]), ""]
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
    from lightprune.data.generated.testbed_vqa import COUNT_WORDS, DIGIT_WORDS
    from lightprune.data.generated.testbed_vqa_pictures import BAR_COLORS

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
    (`lightprune.quality.claims.criteria_over_seeds`)."""
    rows = ["| testbed | criterion | allocation | metric | against random | over seeds: mean difference [95% t "
            "interval] | per testbed seed: p, difference [95% interval] |", "|---|---|---|---|---|---|---|"]
    for c in criteria:
        seeds = "; ".join(f"seed {s['testbed_seed']}: p {s['p_value']:.3f}, {s['paired_diff']:+.1f} "
                          f"[{s['paired_ci'][0]:+.1f}, {s['paired_ci'][1]:+.1f}]" for s in c["seeds"])
        rows.append(f"| {c['testbed']} | {c['criterion']} | {c['allocation']} | {c['metric']} retention "
                    f"@{percent(c['ratio'])}% | {c['verdict']} | {_over_seeds_cell(c)} | {seeds or '-'} |")
    return ["## Every criterion against random, over testbed seeds", "",
            "Each row of the tables below judged against the random null by the claims' rule over every testbed "
            "seed (the rule is stated above the claims).", "", *rows, ""]


def _over_seeds_cell(check: Mapping[str, Any]) -> str:
    """The mean paired difference over the seeds and its t interval (`lightprune.quality.claims.over_seeds`)."""
    over = check.get("over_seeds")
    if not over:
        return "-"
    interval = over.get("interval")
    shown = f"{over['mean']:+.1f}" + (f" [{interval[0]:+.1f}, {interval[1]:+.1f}]" if interval else "")
    return f"{shown}, {over['seeds']} seeds"


def _seeded_claims_section(claims: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each check over the testbed seeds (`lightprune.quality.claims.claims_over_seeds`): the verdict and, per
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
        where = "at the paper's operating points" if c["testbed"] == "mwop" else f"@{percent(c['ratio'])}%"
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
    ``claims``: the checks over testbed seeds (`lightprune.quality.claims.claims_over_seeds`); ``maep``: MAEP's
    alpha on each multimodal testbed seed (`maep_seed_record`)."""
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
