"""MWOP quality rows: Taylor vs random width plans at the paper's operating points, training-free.

The reference operating points of MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs",
appendix D.2: LLaVA-OneVision-7B prunes the V2V / T2V / T2T paths 40 / 60 / 10 % and the visual FFN channels 50 %;
Qwen2.5-VL-7B 60 / 70 / 0 % and 40 %) against random masks of the same ratios, here without the recovery epoch;
ATR as in MWOP section 6.1, FLOPs as in MWOP appendix D.4. For a model and a Testbed VQA datamodule:

1. attention Taylor importance S_attn(l, h, p) once on the ``calibration`` split (dense model); every score comes
   from the width-scorer registry (`lightprune.width.scorers`: ``taylor``, ``min_rank``, ``random``);
2. per operating point: the Taylor plan prunes, per path p, the round(r_p * L * H) lowest-scored
   (layer, head) units ([`select_paths`][lightprune.width.select_paths]); FFN importance S_ffn(l, c, mu) is
   then computed with those attention masks applied (Alg. 1 line 7) and round(r_mu * sum_l m_l) channels of
   modality mu are pruned, lowest first ([`select_channels`][lightprune.width.select_channels]). The random
   plans rank the same units by uniform scores (scorer ``random``, [`random_scores`][lightprune.width.random_scores],
   seeds 0 .. ``random_seeds`` - 1) at the same ratios; with ``all_tasks``, the "All Tasks" plans (appendix A.4)
   rank them by the minimum over task families of each family's Taylor rank, every family's scores from its
   own calibration samples (scorer ``min_rank``, [`min_rank_scores`][lightprune.width.min_rank_scores], the
   families' splits from [`category_batches`][lightprune.width.category_batches]);
3. every plan is evaluated under [`mask_width`][lightprune.width.mask_width] on the ``val`` split, teacher
   forced, as the staged search does, end-of-turn markers not counted as answer tokens
   (`answer_row_sums`):

       acc_f        per task family f (``metric``: answer-token accuracy, whole-answer match or probability)
       ATR          = mean over families f with acc_f(dense) > 0 of 100 * acc_f(plan) / acc_f(dense)
       loss_f       the answer tokens' mean negative log-likelihood (nats), a continuous score beside acc_f
       answer-ppl ATR = mean over the same families of 100 * exp(loss_f(dense) - loss_f(plan))
       FLOPs frac.  = decoder_flops(config, V, T, plan, align).fraction at ``align`` and at 1   (appendix D.4)

   with 95% paired bootstrap intervals of both ATRs over the val rows
   (`task_mean_retention_interval`), every figure computed from the rows'
   sums rounded to float32 and kept per row (``records``, `TaskRowRecords`),
   so that ``scripts/recompute_results.py`` computes each of them again from the seed's file;

   with (V, T) the val split's mean vision (image placeholder) and text tokens per sample, system tokens
   (those before a sample's first image token) and padding excluded, rounded to integers, as the search
   counts its FLOPs profile.

`mwop_quality` returns plain JSON-ready data (plans and scores included);
`mwop_markdown` writes the table and
`plot_mwop` the ATR-vs-FLOPs figure (random: mean with min-max bars). The
same plans after recovery: `lightprune.quality.width_recovery`.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Mapping

import torch

from lightprune.core.checks import check_positive_int
from lightprune.data.tokenizer import end_of_turn_ids
from lightprune.models.unwrap import base_model_of
from lightprune.quality.evidence import standing
from lightprune.quality.expert_quality import spread
from lightprune.quality.intervals import RESAMPLES, task_mean_paired_difference, task_mean_retention_interval
from lightprune.quality.records import TaskRowRecords, as_recorded_rows
from lightprune.width.flops import decoder_flops
from lightprune.width.mask import mask_width
from lightprune.width.modality import token_profile
from lightprune.width.paths import PATHS
from lightprune.width.plan import WIDTH_UNITS, WidthPlan
from lightprune.width.retention import METRIC_SUMS, METRICS, answer_row_sums, retention, task_scores
from lightprune.width.scorer import category_batches
from lightprune.width.scorers import get_width_scorer
from lightprune.width.select import select_channels, select_paths

__all__ = ["DENSE", "PAPER_OPERATING_POINTS", "mwop_quality", "random_width_plan"]

#: the paper's operating points, named by the model they were chosen for (units: :data:`WIDTH_UNITS`)
PAPER_OPERATING_POINTS: dict[str, dict[str, float]] = {
    "LLaVA-OneVision-7B": {"v2v": 0.4, "t2v": 0.6, "t2t": 0.1, "ffn_vision": 0.5},
    "Qwen2.5-VL-7B": {"v2v": 0.6, "t2v": 0.7, "t2t": 0.0, "ffn_vision": 0.4},
}

DENSE = "dense"


def _check_operating_points(points: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    if not isinstance(points, Mapping) or not points:
        raise ValueError(f"operating_points must be a non-empty mapping name -> {{unit: ratio}}, got {points!r}")
    out: dict[str, dict[str, float]] = {}
    for name, ratios in points.items():
        if not isinstance(name, str) or not name or name == DENSE:
            raise ValueError(f"operating point names must be non-empty strings other than {DENSE!r}, got {name!r}")
        if not isinstance(ratios, Mapping):
            raise ValueError(f"operating point {name!r} must map width units to ratios, got {ratios!r}")
        bad = sorted(str(u) for u in ratios if u not in WIDTH_UNITS)
        if bad:
            raise ValueError(f"operating point {name!r} names unknown width units {bad}; "
                             f"choose among {list(WIDTH_UNITS)}")
        checked = {}
        for unit, ratio in ratios.items():
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= float(ratio) <= 1.0:
                raise ValueError(f"operating point {name!r}: ratio for {unit!r} must be a number in [0, 1], "
                                 f"got {ratio!r}")
            checked[unit] = float(ratio)
        out[name] = checked
    return out


def _split(ratios: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    paths = {u: r for u, r in ratios.items() if u in PATHS}
    channels = {u[len("ffn_"):]: r for u, r in ratios.items() if u.startswith("ffn_")}
    return paths, channels


def split_loader(dm: Any, split: str):
    if callable(getattr(dm, "dataloader", None)):
        return dm.dataloader(split)
    fn = getattr(dm, f"{split}_dataloader", None)
    if not callable(fn):
        raise ValueError(f"{type(dm).__name__} has neither dataloader(split) nor {split}_dataloader()")
    return fn()


def _nan_to_none(value: float) -> float | None:
    return None if value is None or value != value else float(value)


def mwop_quality(model: torch.nn.Module, dm: Any, *,
                 operating_points: Mapping[str, Mapping[str, float]] = PAPER_OPERATING_POINTS,
                 random_seeds: int = 50, align: int = 64, metric: str = "token", all_tasks: bool = True,
                 testbed_seed: int = 0, progress: bool | None = None) -> dict[str, Any]:
    """Dense, Taylor and random rows of MWOP's quality table (module docstring), training-free.

    Args:
        model: the dense MLLM (e.g. ``lp.load_pruned(vqa_testbed("dense-mllm-full") / "model")``).
        dm: a datamodule with ``dataloader(split)`` (``calibration`` and ``val``) and ``task_names``
            (`TestbedVQADataModule`), or ``calibration_dataloader()`` /
            ``val_dataloader()``.
        operating_points: {name: {unit: ratio}} with units from `WIDTH_UNITS`.
        random_seeds: random plans per operating point (seeds 0 .. n - 1; 0: no random rows).
        align: FFN channel alignment b of the FLOPs count (the paper: 64; 1 counts every channel).
        metric: ``token``, ``exact`` or ``prob`` (`lightprune.width.retention`).
        all_tasks: also the "All Tasks" rows (method ``taylor_all_tasks``), when the datamodule serves a split per
            task (``dataloader(split, tasks=[...])``) and has more than one task.
        testbed_seed: the seed the model was trained from, recorded in each row's standing.
        progress: a bar over the evaluations (None: when stderr is a terminal).

    Returns:
        ``{"metric", "align", "task_names", "profile", "val_rows_per_task", "end_of_turn_ids", "reference", "scores",
        "rows", "records"}`` (``records``: every row's task id and the sums every figure is computed from, for the dense
        model and each plan keyed ``"<point>/<method>"`` or ``"<point>/random:<seed>"``); every row has
        ``operating_point``, ``method`` (``dense``, ``taylor``, ``taylor_all_tasks`` or ``random``), ``ratios``; dense
        and Taylor rows ``flops_fraction`` (at ``align``), ``flops_fraction_align_1``, ``atr`` and ``atr_interval``,
        ``answer_ppl_atr`` and ``answer_ppl_atr_interval``, ``per_task_accuracy``, ``per_task_answer_loss``,
        ``per_task_retention``, ``excluded``, ``pruned`` (the share of every unit) and ``plan`` (``WidthPlan.to_dict``);
        Taylor rows also ``standing``: ``{"atr": ..., "answer_ppl_atr": ...}``, each
        `standing` against the random plans of the same operating point (the p-value
        of its ATR among theirs, the paired difference of the task-mean retentions on the same val rows); random rows
        ``seeds``, ``per_seed`` (those fields per seed but the plan, which `random_width_plan` draws again from
        the seed) and mean / std (sample) / min / max of ``atr``, ``answer_ppl_atr``, both FLOPs fractions and
        ``per_task_accuracy``. NaN (a task without samples, or without a defined retention) is written as None.
    """
    from tqdm.auto import tqdm


    points = _check_operating_points(operating_points)
    if isinstance(random_seeds, bool) or not isinstance(random_seeds, int) or random_seeds < 0:
        raise ValueError(f"random_seeds must be an integer >= 0, got {random_seeds!r}")
    check_positive_int("align", align)
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {list(METRICS)}, got {metric!r}")
    names = list(getattr(dm, "task_names", None) or ["default"])
    show = sys.stderr.isatty() if progress is None else bool(progress)

    base = base_model_of(model)
    config = base.config
    dense_plan = WidthPlan.dense(base)
    if any(_split(r)[1] for r in points.values()) and not dense_plan.intermediate_size:
        ffn = sorted(p for p, r in points.items() if _split(r)[1])
        raise ValueError(f"operating points {ffn} prune FFN channels, but every FFN of {type(base).__name__} is a "
                         f"mixture of experts; give them attention paths only")
    calibration = list(split_loader(dm, "calibration"))
    val = list(split_loader(dm, "val"))
    if not calibration:
        raise ValueError("the calibration split has no batches: no Taylor importance")
    profile = token_profile(base, val)
    V, T = profile["vision_tokens"], profile["text_tokens"]
    by_task: dict[str, list] = {}
    if all_tasks and len(names) > 1 and callable(getattr(dm, "dataloader", None)):
        by_task = {t: list(b) for t, b in category_batches(dm, "calibration").items()}
        by_task = {t: b for t, b in by_task.items() if b}  # a task without calibration samples ranks nothing

    bar = tqdm(total=1 + len(points) * (1 + random_seeds + bool(by_task)), desc="MWOP quality", unit="eval",
               disable=not show)

    end_ids = end_of_turn_ids(dm)

    def evaluate(plan: WidthPlan | None, label: str) -> dict[str, torch.Tensor]:
        bar.set_postfix_str(label)
        if plan is None:
            rows = answer_row_sums(model, val, len(names), end_ids)
        else:
            with mask_width(model, plan):
                rows = answer_row_sums(model, val, len(names), end_ids)
        bar.update(1)
        return as_recorded_rows(rows)  # the figures are computed from the sums the record keeps

    def row(plan: WidthPlan, rows: dict[str, torch.Tensor], dense: dict[str, torch.Tensor]) -> dict[str, Any]:
        return {"flops_fraction": decoder_flops(config, V, T, plan=plan, align=align).fraction,
                "flops_fraction_align_1": decoder_flops(config, V, T, plan=plan, align=1).fraction,
                **scored_figures(rows, dense, names, metric),
                "pruned": {u: plan.pruned_fraction(u) for u in WIDTH_UNITS},
                "plan": plan.to_dict()}

    try:
        reference = evaluate(None, DENSE)
        records = TaskRowRecords((*METRIC_SUMS[metric], "nll", "tokens"), reference, resamples=RESAMPLES, seed=0,
                                 level=0.95)
        rows = [{"operating_point": DENSE, "method": DENSE, "ratios": {}, **row(dense_plan, reference, reference)}]
        taylor, all_tasks_scorer = get_width_scorer("taylor"), get_width_scorer("min_rank")
        bar.set_postfix_str("taylor: attention")
        attn = taylor.score(base, calibration, attention=True, ffn=False, progress=show)
        scores_out: dict[str, Any] = {"attn": attn.to_dict(), "ffn": {}}
        if by_task:
            bar.set_postfix_str("taylor: attention per task")
            attn_all = all_tasks_scorer.score(base, by_task, attention=True, ffn=False, progress=show)
            scores_out.update(all_tasks={"tasks": list(by_task), "attn": attn_all.to_dict(), "ffn": {}})
        for name, ratios in points.items():
            paths, channels = _split(ratios)
            plan = select_paths(attn.attn, paths, dense_plan)
            if channels:
                bar.set_postfix_str(f"taylor: FFN under {name}'s paths")
                ffn = taylor.score(base, calibration, attention=False, ffn=True, plan=plan, progress=show)
                scores_out["ffn"][name] = ffn.to_dict()
                plan = select_channels(ffn.ffn, channels, plan)
            plan.metadata.update({"method": "taylor", "operating_point": name})
            sums = {"taylor": evaluate(plan, f"{name} taylor")}
            records.add(f"{name}/taylor", sums["taylor"])
            rows.append({"operating_point": name, "method": "taylor", "ratios": dict(ratios),
                         **row(plan, sums["taylor"], reference)})
            if by_task:
                plan = select_paths(attn_all.attn, paths, dense_plan)
                if channels:
                    bar.set_postfix_str(f"taylor: FFN per task under {name}'s paths")
                    ffn_all = all_tasks_scorer.score(base, by_task, attention=False, ffn=True, plan=plan,
                                                     progress=show)
                    scores_out["all_tasks"]["ffn"][name] = ffn_all.to_dict()
                    plan = select_channels(ffn_all.ffn, channels, plan)
                plan.metadata.update({"method": "taylor_all_tasks", "operating_point": name})
                sums["taylor_all_tasks"] = evaluate(plan, f"{name} all tasks")
                records.add(f"{name}/taylor_all_tasks", sums["taylor_all_tasks"])
                rows.append({"operating_point": name, "method": "taylor_all_tasks", "ratios": dict(ratios),
                             **row(plan, sums["taylor_all_tasks"], reference)})
            if not random_seeds:
                continue
            per_seed, null = [], []
            for seed in range(random_seeds):
                plan = random_width_plan(base, ratios, seed, dense_plan)
                plan.metadata["operating_point"] = name
                null.append(evaluate(plan, f"{name} random {seed}"))
                records.add(f"{name}/random:{seed}", null[-1])
                scored = row(plan, null[-1], reference)
                per_seed.append({"seed": seed, **{k: v for k, v in scored.items() if k != "plan"}})
            for mine in (r for r in rows if r["operating_point"] == name and r["method"] != "random"):
                mine["standing"] = _standing(mine, sums[mine["method"]], per_seed, null, reference, metric,
                                             testbed_seed)
            rows.append({"operating_point": name, "method": "random", "ratios": dict(ratios),
                         "seeds": list(range(random_seeds)),
                         "atr": spread([r["atr"] for r in per_seed]),
                         "answer_ppl_atr": spread([r["answer_ppl_atr"] for r in per_seed]),
                         "flops_fraction": spread([r["flops_fraction"] for r in per_seed]),
                         "flops_fraction_align_1": spread([r["flops_fraction_align_1"] for r in per_seed]),
                         "per_task_accuracy": {n: spread([r["per_task_accuracy"][n] for r in per_seed])
                                               for n in names},
                         "per_seed": per_seed})
    finally:
        bar.close()
    return {"metric": metric, "align": align, "task_names": names, "profile": profile,
            "calibration_samples": attn.num_samples, "val_rows_per_task": _rows_per_task(reference, names),
            "end_of_turn_ids": list(end_ids),
            "reference": {n: _nan_to_none(s)
                          for n, s in zip(names, task_scores(reference, len(names), metric).tolist())},
            "scores": scores_out, "rows": rows, "records": records.to_dict()}


def random_width_plan(model: torch.nn.Module, ratios: Mapping[str, float], seed: int,
                      dense_plan: WidthPlan | None = None) -> WidthPlan:
    """The random plan of ``seed`` at ``ratios`` ({unit: ratio}): uniform scores (scorer ``random``: the same for the
    same seed and unit shapes, whatever the weights) ranked as Taylor's are, paths first, then FFN channels."""
    paths, channels = _split(ratios)
    base = base_model_of(model)
    dense_plan = WidthPlan.dense(base) if dense_plan is None else dense_plan
    drawn = get_width_scorer("random", seed=seed).score(base, attention=True, ffn=bool(channels))
    plan = select_paths(drawn.attn, paths, dense_plan)
    if channels:
        plan = select_channels(drawn.ffn, channels, plan)
    plan.metadata.update({"method": "random", "seed": seed})
    return plan


def scored_figures(rows: Mapping[str, torch.Tensor], dense: Mapping[str, torch.Tensor], names: list[str],
            metric: str) -> dict[str, Any]:
    """One evaluation's figures (`answer_row_sums`) against the dense model's:
    the ATR and the answer-ppl ATR over the tasks with a defined retention, each with its paired bootstrap
    interval, and per task the accuracy, answer loss and retention."""
    scores = task_scores(rows, len(names), metric)
    kept = retention(scores, task_scores(dense, len(names), metric), names)
    include = torch.tensor([n not in kept.excluded for n in names])
    loss, dense_loss = _task_loss(rows, len(names)), _task_loss(dense, len(names))
    ppl_kept = [100.0 * math.exp(d - v) for d, v, keep in zip(dense_loss, loss, include) if keep and d == d and v == v]
    num, den = METRIC_SUMS[metric]
    return {"atr": kept.atr,
            "atr_interval": task_mean_retention_interval("acc", rows["task"], (dense[num], dense[den]),
                                                         (rows[num], rows[den]), include),
            "answer_ppl_atr": sum(ppl_kept) / len(ppl_kept) if ppl_kept else None,
            "answer_ppl_atr_interval": task_mean_retention_interval(
                "ppl", rows["task"], (dense["nll"], dense["tokens"]), (rows["nll"], rows["tokens"]), include),
            "per_task_accuracy": {n: _nan_to_none(v) for n, v in zip(names, scores.tolist())},
            "per_task_answer_loss": {n: _nan_to_none(v) for n, v in zip(names, loss)},
            "per_task_retention": {n: _nan_to_none(v) for n, v in kept.per_task.items()},
            "excluded": list(kept.excluded)}


def _standing(row: Mapping[str, Any], sums: Mapping[str, torch.Tensor], null_rows: list[Mapping[str, Any]],
              null: list[Mapping[str, torch.Tensor]], dense: Mapping[str, torch.Tensor], metric: str,
              testbed_seed: int) -> dict[str, Any]:
    """A Taylor row's standing against the random plans of its operating point, for both ATRs: the p-value of its
    ATR among theirs and the paired difference of the task-mean retentions (`versus_null`)."""
    out = {}
    for key, record in versus_null(row, sums, null, dense, metric, testbed_seed).items():
        values = [r[key] for r in null_rows]
        if all(v is not None for v in values):
            out[key] = standing(row[key], values, record["paired_diff"], record["paired_ci"], testbed_seed)
    return out


def versus_null(row: Mapping[str, Any], sums: Mapping[str, torch.Tensor], null: list[Mapping[str, torch.Tensor]],
            dense: Mapping[str, torch.Tensor], metric: str, testbed_seed: int) -> dict[str, Any]:
    """Both ATRs' paired difference of ``row`` to the mean of the ``null`` plans (too few for a p-value)."""
    include = torch.tensor([n not in row["excluded"] for n in row["per_task_accuracy"]])
    num, den = METRIC_SUMS[metric]
    out = {}
    for key, kind, (n, d) in (("atr", "acc", (num, den)), ("answer_ppl_atr", "ppl", ("nll", "tokens"))):
        if row.get(key) is None:
            continue
        diff, ci = task_mean_paired_difference(kind, sums["task"], (dense[n], dense[d]), (sums[n], sums[d]),
                                               [(plan[n], plan[d]) for plan in null], include)
        out[key] = {"testbed_seed": int(testbed_seed), "paired_diff": diff, "paired_ci": ci}
    return out


def _task_loss(rows: Mapping[str, torch.Tensor], num_tasks: int) -> list[float]:
    """Per task, the answer tokens' mean negative log-likelihood (NaN: no answer tokens)."""
    tasks = rows["task"].long()
    nll = torch.zeros(num_tasks, dtype=torch.float64).index_add_(0, tasks, rows["nll"])
    tokens = torch.zeros(num_tasks, dtype=torch.float64).index_add_(0, tasks, rows["tokens"])
    return (nll / tokens).tolist()


def _rows_per_task(rows: Mapping[str, torch.Tensor], names: list[str]) -> dict[str, int]:
    counts = torch.bincount(rows["task"].long(), minlength=len(names)).tolist()
    return dict(zip(names, counts))
