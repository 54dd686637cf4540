"""MWOP quality rows after recovery: the plans of `mwop_quality` (Taylor,
All Tasks, some random plans) and the dense model, each recovered from the dense model under its masks (the
recovery epochs of MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), Alg. 1) and
scored as the training-free rows are, against the dense model given the same recovery: `mwop_recovery`,
`mwop_recovery_markdown`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch

from lightprune.core.checks import check_positive_int
from lightprune.data.tokenizer import end_of_turn_ids
from lightprune.models.unwrap import base_model_of
from lightprune.quality.expert_quality import spread
from lightprune.quality.intervals import RESAMPLES
from lightprune.quality.mwop_section import num_cell, spread_cell
from lightprune.quality.records import TaskRowRecords, as_recorded_rows
from lightprune.quality.width_quality import DENSE, random_width_plan, scored_figures, split_loader, versus_null
from lightprune.width.flops import decoder_flops
from lightprune.width.mask import mask_width
from lightprune.width.plan import WidthPlan
from lightprune.width.retention import METRIC_SUMS, answer_row_sums

__all__ = ["mwop_recovery", "mwop_recovery_markdown"]


def _recover(model: torch.nn.Module, plan: WidthPlan, train: list, steps: int, learning_rate: float,
             seed: int) -> torch.nn.Module:
    """A copy of ``model`` trained ``steps`` batches of ``train`` (cycled) under ``plan``'s masks: the language
    model's weights (vision tower frozen), AdamW, cosine with 3% warm-up, weight decay 0, the answer loss."""
    import copy

    from lightprune.core.batch import model_inputs
    from lightprune.finetune.optim import build_scheduler

    torch.manual_seed(seed)
    trained = copy.deepcopy(model)
    tower = {id(p) for name, p in trained.named_parameters() if "visual" in name or "vision_tower" in name}
    params = [p for p in trained.parameters() if id(p) not in tower]
    for p in trained.parameters():
        p.requires_grad_(id(p) not in tower)
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.0)
    scheduler = build_scheduler(optimizer, "cosine", max(1, round(0.03 * steps)), steps)
    trained.train()
    with mask_width(trained, plan):
        for step in range(steps):
            batch = train[step % len(train)]
            loss = trained(**model_inputs(batch, keep_labels=True)).loss
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
    trained.eval()
    return trained


def mwop_recovery(model: torch.nn.Module, dm: Any, result: Mapping[str, Any], *, random_seeds: int = 3,
                  epochs: int = 1, learning_rate: float = 1e-4, testbed_seed: int = 0,
                  progress: bool | None = None) -> dict[str, Any]:
    """The plans of ``result`` (`mwop_quality`'s Taylor and All Tasks rows and its first ``random_seeds``
    random plans per operating point) and the dense model, each recovered for ``epochs`` epochs of the train split
    under its masks (Alg. 1's recovery, from the dense model every time) and evaluated as `mwop_quality`
    does, against the dense model given the same recovery (so what the recovery teaches every model is not counted
    as the plan's; the recovered dense row itself is scored against the dense model before recovery). The testbed
    is too small for the paper's LoRA (r = 128 on a 128-wide model), so the language model is fine-tuned in full,
    with the paper's schedule (cosine, 3% warm-up, weight decay 0).

    Returns ``{"epochs", "steps", "learning_rate", "rows", "records"}`` (``records``: the rows' sums before
    recovery as ``dense`` and each recovered plan's, keyed as `mwop_quality`'s, the recovered dense model
    ``dense/dense``): rows with ``operating_point``, ``method`` (``dense``, ``taylor``, ``taylor_all_tasks`` or
    ``random`` with ``seed``), ``flops_fraction`` and `mwop_quality`'s scores (ATRs with intervals, per-task accuracy,
    answer loss and retention), recovered; Taylor rows also ``versus``:
    ``{"random": {"atr": ..., "answer_ppl_atr": ...}}``, each ``{"testbed_seed", "paired_diff", "paired_ci"}`` against
    the mean of the recovered random plans of their operating point (paired over the val rows:
    `task_mean_paired_difference`).
    """
    from tqdm.auto import tqdm

    check_positive_int("epochs", epochs)
    names = list(result["task_names"])
    train = list(split_loader(dm, "train"))
    if not train:
        raise ValueError("the train split has no batches: nothing to recover on")
    steps = epochs * len(train)
    val = list(split_loader(dm, "val"))
    end_ids = end_of_turn_ids(dm)
    config = base_model_of(model).config
    V, T = result["profile"]["vision_tokens"], result["profile"]["text_tokens"]
    metric, align = result["metric"], result["align"]
    before = as_recorded_rows(answer_row_sums(model, val, len(names), end_ids))
    records = TaskRowRecords((*METRIC_SUMS[metric], "nll", "tokens"), before, resamples=RESAMPLES, seed=0,
                             level=0.95)
    jobs = []
    for r in result["rows"]:
        if r["method"] in (DENSE, "taylor", "taylor_all_tasks"):
            jobs.append((r["operating_point"], r["method"], None, WidthPlan.from_dict(r["plan"])))
        elif r["method"] == "random":
            jobs += [(r["operating_point"], "random", e["seed"], random_width_plan(model, r["ratios"], e["seed"]))
                     for e in r["per_seed"][:random_seeds]]
    show = sys.stderr.isatty() if progress is None else bool(progress)
    recovered = []
    for point, method, seed, plan in tqdm(jobs, desc="MWOP recovery", unit="plan", disable=not show):
        trained = _recover(model, plan, train, steps, learning_rate, seed=0 if seed is None else seed)
        with mask_width(trained, plan):
            sums = as_recorded_rows(answer_row_sums(trained, val, len(names), end_ids))
        records.add(f"{point}/{method}" if seed is None else f"{point}/random:{seed}", sums)
        recovered.append((point, method, seed, plan, sums))
    dense = next((sums for _, method, _, _, sums in recovered if method == DENSE), before)
    rows = []
    for point, method, seed, plan, sums in recovered:
        rows.append({"operating_point": point, "method": method, **({"seed": seed} if seed is not None else {}),
                     "flops_fraction": decoder_flops(config, V, T, plan=plan, align=align).fraction,
                     **scored_figures(sums, before if method == DENSE else dense, names, metric)})
        null = [s for p, m, _, _, s in recovered if p == point and m == "random"]
        if method == "taylor" and null:
            rows[-1]["versus"] = {"random": versus_null(rows[-1], sums, null, dense, metric, testbed_seed)}
    return {"epochs": epochs, "steps": steps, "learning_rate": learning_rate, "rows": rows,
            "records": records.to_dict()}


def mwop_recovery_markdown(recovery: Mapping[str, Any]) -> str:
    """The recovered rows: Taylor and All Tasks per operating point, random as mean [min, max] over its seeds."""
    lines = ["| operating point | method | FLOPs fraction | ATR (%) after recovery [95% CI] | answer-ppl ATR (%) "
             "after recovery |", "|---|---|---:|---:|---:|"]
    points = list(dict.fromkeys(r["operating_point"] for r in recovery["rows"]))
    for point in points:
        mine = [r for r in recovery["rows"] if r["operating_point"] == point]
        for r in (r for r in mine if r["method"] != "random"):
            low, high = r["atr_interval"]
            versus = (r.get("versus") or {}).get("random", {}).get("atr")
            versus = "" if versus is None else (f"; vs random {versus['paired_diff']:+.1f} "
                                                f"[{versus['paired_ci'][0]:+.1f}, {versus['paired_ci'][1]:+.1f}]")
            lines.append(f"| {point} | {r['method']} | {r['flops_fraction']:.3f} | {num_cell(r['atr'], 1)} "
                         f"[{num_cell(low, 1)}, {num_cell(high, 1)}]{versus} | {num_cell(r['answer_ppl_atr'], 1)} |")
        randoms = [r for r in mine if r["method"] == "random"]
        if randoms:
            atr, ppl = spread([r["atr"] for r in randoms]), spread([r["answer_ppl_atr"] for r in randoms])
            lines.append(f"| {point} | random ({len(randoms)} seeds) | {randoms[0]['flops_fraction']:.3f} | "
                         f"{spread_cell(atr, 1)} | {spread_cell(ppl, 1)} |")
    lines += ["", f"Each plan recovered from the dense model for {recovery['epochs']} epoch(s) ({recovery['steps']} "
              f"steps) of the train split under its masks: the language model fine-tuned in full (the testbed is too "
              f"small for the paper's LoRA r = 128), AdamW lr {recovery['learning_rate']:g}, cosine with 3% warm-up, "
              "weight decay 0. ATR against the dense model given the same recovery (the dense row: against the "
              "dense model before it); [95% CI] as above; vs random: Taylor's paired difference to the recovered "
              "random plans' mean on the same val rows [95% CI]."]
    return "\n".join(lines) + "\n"
