"""Expert-pruning quality side by side: every criterion at the same ratios on one trained model.

What the papers' tables report, measured on a testbed: for each criterion and ratio, the plan
(``select_experts``; uniform per layer unless the criterion is a global one) is applied with
``mask_experts`` (reversible, no copy) and the model evaluated by a caller-given function
(perplexity, task accuracy). Random is run over several seeds and reported with its spread; the
anti orderings (the REAP, AIMER and router-sensitivity rankings reversed: the most important experts
pruned first) frame the ceiling of damage and test each ranking's direction (docs/testbeds.md). When the
evaluation returns per-row sums (`ROW_SUMS`), every row gets paired bootstrap
intervals of its retention against the dense model (`lightprune.quality.intervals`).

Rankings (`expert_rankings`), higher = keep:

- calibration criteria from one observed pass over the calibration batches, on the ``all`` token subset:
  frequency, seer, ean, reap (AIMER ("AIMER: Calibration-Free Task-Agnostic MoE Pruning", arXiv 2603.18492),
  appendix B), routing_kl and delta_h (MAEP ("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language
  Models", arXiv 2611.05927), Eqs. 8 and 2);
- weight-only criteria: aimer (AIMER section 4.2), magnitude (AIMER section 5.1's baseline), router_norm;
- router sensitivity ("Router Sensitivity Under Lightweight Fine-Tuning Identifies Prunable Experts in
  Mixture-of-Experts Models", arXiv 2608.07890), Eq. 4: |Delta ||w_e||| of the router rows after a router-LoRA fit with
  configs/router_lora.yaml's recipe (`router_sensitivity`, the RouterDelta callback's own scores);
- MAEP section 5.3: s = (1 - alpha) z~_text - alpha z~_low, global ranking, with the closed-form alpha clamped to
  [0, 1], with each fixed alpha of `FIXED_ALPHAS`, at alpha = 0 (text Delta-H alone), beside REAP ranked
  globally and MAEP uniform per layer at alpha = 0.5 (MAEP appendix L): `maep_rankings`.

Merges (`expert_merges`, MAEP's merging baseline HC-SMoE and M-SMoE) are rows beside them: the same share of
each layer's experts merged away instead of pruned, evaluated reversibly.

Also `proxy_rho` (per-layer Spearman of delta_h, reap, routing_kl against the ground-truth
LM-head KL of removing each expert) and `stability` (Spearman between the rankings of two
calibration sets, per token subset).
"""

from __future__ import annotations

import math
import statistics
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from lightprune.callbacks import RouterDelta
from lightprune.experts.calibration.validation import ground_truth_kl, proxy_correlations, ranking_stability
from lightprune.experts.criteria.registry import DEFAULT_CRITERIA, MERGE_STATISTICS
from lightprune.finetune import AdapterSpec, MoECausalLM
from lightprune.quality.intervals import RESAMPLES, ROW_SUMS, intervals_of, metric_value
from lightprune.quality.records import RowRecords, as_recorded, plan_key

__all__ = ["ANTI_CRITERIA", "CALIBRATION_CRITERIA", "FIXED_ALPHAS", "WEIGHT_CRITERIA", "MERGE_STATISTICS",
           "clamped_alpha", "expert_merges", "expert_quality", "expert_rankings", "maep_alpha", "maep_rankings",
           "proxy_rho", "router_sensitivity", "spread", "stability", "summarise"]

#: the values every calibration pass collects, each one ranking (the criteria's one table)
CALIBRATION_CRITERIA: tuple[str, ...] = DEFAULT_CRITERIA
WEIGHT_CRITERIA: tuple[str, ...] = ("aimer", "magnitude", "router_norm")
#: the rankings whose direction is a paper's claim, also run reversed (``anti_<name>``) when present
ANTI_CRITERIA: tuple[str, ...] = ("reap", "aimer", "router_sensitivity")

Evaluate = Callable[[torch.nn.Module], dict[str, float]]


def expert_rankings(model: torch.nn.Module, stats, *, maep: bool = False,
                    extra: Mapping[str, Any] | None = None) -> dict[str, tuple[Any, str]]:
    """``{name: (ExpertScores, allocation)}`` for every criterion of the module docstring.

    ``stats``: [`CalibrationStats`][lightprune.experts.calibration.result.CalibrationStats] with the calibration
    criteria on ``all`` (and, for ``maep``, delta_h on ``text``, ``vision`` and ``vision_low_attn``);
    ``extra``: more ``{name: ExpertScores}`` (e.g. router sensitivity), pruned uniformly.
    """
    import lightprune as lp

    out: dict[str, tuple[Any, str]] = {}
    for name in CALIBRATION_CRITERIA:
        out[name] = (stats.score(name, "all"), "uniform")
    for name in WEIGHT_CRITERIA:
        out[name] = (lp.score_weights(model, name), "uniform")
    for name, scores in (extra or {}).items():
        out[name] = (scores, "uniform")
    if maep:
        out.update(maep_rankings(stats))
    for name in ANTI_CRITERIA:
        if name in out:
            scores = out[name][0]
            out[f"anti_{name}"] = (type(scores)({l: -v for l, v in scores.items()}, scores.limits,
                                                criterion=f"anti_{name}"), "uniform")
    return out


#: MAEP's fixed alphas, chosen before measuring: the values the paper rounds its closed forms to and uses (0.1, 0.3,
#: 0.8: MAEP section 6.3.3, Table 3's "Used alpha")
FIXED_ALPHAS: tuple[float, ...] = (0.1, 0.3, 0.8)


def maep_rankings(stats) -> dict[str, tuple[Any, str]]:
    """MAEP's rows, every one on every seed, by rules fixed before measuring (MAEP section 5.3):

    - ``maep_global``: the closed-form alpha clamped to [0, 1] (`clamped_alpha`; the tables record whether
      it was clamped), global allocation. At alpha = 0 this is ``delta_h_text_global``;
    - ``maep_global_alpha<a>`` for every a of `FIXED_ALPHAS`, global;
    - ``delta_h_text_global``: text Delta-H alone (alpha = 0), global: the allocation without the modality term;
    - ``reap_global``: REAP log-z-scored per layer as MAEP's terms are, global: the allocation with a
      modality-blind score, so that a win over uniform REAP is credited to the allocation or to the modality term;
    - ``maep_uniform``: alpha = 0.5 with a uniform per-layer quota (the paper's Appendix L).

    No row when the closed form is undefined (NaN: no layer with a ranking); the tables say why."""
    import lightprune as lp
    from lightprune.experts.scores import ExpertScores
    from lightprune.experts.select import log_zscore

    out: dict[str, tuple[Any, str]] = {}
    alpha = clamped_alpha(stats)
    if alpha is not None:
        out["maep_global"] = (lp.maep_scores(stats, alpha=alpha)[0], "global")
    for fixed in FIXED_ALPHAS:
        out[f"maep_global_alpha{fixed:g}"] = (lp.maep_scores(stats, alpha=fixed)[0], "global")
    out["delta_h_text_global"] = (lp.maep_scores(stats, alpha=0.0)[0], "global")
    reap = stats.raw("reap", "all")
    z = {layer: log_zscore(torch.as_tensor(v).double()) for layer, v in reap.items()}
    out["reap_global"] = (ExpertScores(z, reap.limits, criterion="reap_global", raw=z), "global")
    out["maep_uniform"] = (lp.maep_scores(stats, alpha=0.5)[0], "uniform")
    return out


def clamped_alpha(stats) -> float | None:
    """The closed-form alpha clamped to [0, 1] (None when it is undefined: no layer with a ranking, or a + b =
    0)."""
    from lightprune.experts.maep import maep_alpha as closed_form

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = closed_form(stats, check=False).closed_form
    return None if math.isnan(value) else min(1.0, max(0.0, value))


def maep_alpha(stats) -> dict[str, Any]:
    """``{"value": alpha, "error": None, "report", "clamped"}``: MAEP's closed-form alpha on ``stats``, or ``{"value":
    None, "error": why, ...}`` when it leaves [0, 1]; ``report``: the a, b and rhos it comes from
    ([`AlphaReport`][lightprune.experts.maep.AlphaReport] as a dict), either way; ``clamped``: the alpha the
    ``maep_global`` row uses (`clamped_alpha`)."""
    from lightprune.experts.maep import maep_alpha as closed_form

    try:
        report = closed_form(stats)
        return {"value": float(report.alpha), "error": None, "report": report.to_dict(),
                "clamped": float(report.alpha)}
    except ValueError as err:
        return {"value": None, "error": str(err), "report": closed_form(stats, check=False).to_dict(),
                "clamped": clamped_alpha(stats)}


def _pruned_per_layer(plan) -> dict[str, int]:
    return {str(layer): len(experts) for layer, experts in sorted(plan.pruned().items())}


def expert_merges(stats) -> dict[str, Callable[[float], Any]]:
    """``{name: ratio -> MergePlan}`` of the merging baselines (HC-SMoE, M-SMoE) from ``stats`` collected with
    the merging statistics (``expert_outputs``, ``router_logits``)."""
    import lightprune as lp

    return {"hc_smoe": lambda ratio: lp.hc_smoe_plan(stats, ratio),
            "m_smoe": lambda ratio: lp.m_smoe_plan(stats, ratio, align=True)}


def expert_quality(model: torch.nn.Module, rankings: Mapping[str, tuple[Any, str]], evaluate: Evaluate, *,
                   ratios: Sequence[float] = (0.25, 0.5), random_seeds: int = 5, progress: bool = True,
                   merges: Mapping[str, Callable[[float], Any]] | None = None,
                   standing_metrics: Sequence[str] = (), comparisons: Sequence[tuple[str, str, str]] = (),
                   testbed_seed: int = 0) -> dict[str, Any]:
    """Evaluate the dense model, every ranking at every ratio, every merge (``merges``: name -> ratio ->
    MergePlan, evaluated reversibly with [`lightprune.merged_experts`][lightprune.experts.merging.merge.merged_experts];
    allocation ``"merge"``) and ``random_seeds`` random plans per ratio (the null distribution).

    Returns ``{"dense": metrics, "rows": [{"criterion", "allocation", "ratio", "metrics", "pruned_per_layer"}
    (+ "intervals": {metric: [low, high]} of the retention when ``evaluate`` gives row sums)],
    "random": {ratio: {"seeds": [metrics...], "summary": summarise(...)}}}``. With row sums (rounded to float32
    first: `as_recorded`; every metric then computed from them), ``"records"``
    keeps every plan's row sums (`RowRecords`), and each row also gets
    ``"standing": {metric: claims.standing(...)}`` for every metric of ``standing_metrics`` (its retention's
    p-value against the random plans of its ratio and the paired difference to their mean, ``testbed_seed``
    recorded), and ``"versus": {rival: {metric: {"paired_diff", "paired_ci"}}}`` for every (criterion, rival,
    metric) of ``comparisons`` (the same rows for both: `paired_difference`
    against the rival alone).
    """
    from tqdm.auto import tqdm

    import lightprune as lp

    if random_seeds < 1:
        raise ValueError(f"random_seeds must be >= 1, got {random_seeds!r}")
    for r in ratios:
        if not 0.0 < r < 1.0:
            raise ValueError(f"ratios must lie in (0, 1), got {r!r}")
    merges = dict(merges or {})
    jobs = [(name, r) for r in ratios for name in [*rankings, *merges]] + \
        [(f"random:{s}", r) for r in ratios for s in range(random_seeds)]

    def measured(m: torch.nn.Module) -> dict[str, Any]:
        """``evaluate(m)``, its row sums rounded as the records keep them and its metrics computed from those."""
        metrics = dict(evaluate(m))
        if metrics.get(ROW_SUMS) is not None:
            metrics[ROW_SUMS] = as_recorded(metrics[ROW_SUMS])
            metrics.update({k: float(metric_value(k, *v)) for k, v in metrics[ROW_SUMS].items()})
        return metrics

    dense = measured(model)
    dense_sums = dense.pop(ROW_SUMS, None)
    out: dict[str, Any] = {"dense": dense, "rows": [], "random": {}}
    records = None if dense_sums is None else RowRecords(list(dense_sums), dense_sums, resamples=RESAMPLES, seed=0,
                                                         level=0.95)

    row_sums: dict[tuple[str, float], Any] = {}      # (criterion, ratio) -> its row sums, for the comparisons
    null_sums: dict[float, list[Any]] = {}             # ratio -> each random plan's row sums

    def row(name: str, allocation: str, ratio: float, metrics: Mapping[str, Any], plan) -> dict[str, Any]:
        metrics = dict(metrics)
        sums = metrics.pop(ROW_SUMS, None)
        entry = {"criterion": name, "allocation": allocation, "ratio": ratio, "metrics": metrics,
                 "pruned_per_layer": _pruned_per_layer(plan)}
        if sums is not None and dense_sums is not None:
            entry["intervals"] = intervals_of(dense_sums, sums)
            row_sums[(name, ratio)] = sums
            records.add(plan_key(name, ratio), sums)
        return entry

    for name, ratio in tqdm(jobs, desc="expert quality", disable=not progress):
        if name in merges:
            merge = merges[name](ratio)
            with lp.merged_experts(model, merge):
                metrics = measured(model)
            out["rows"].append(row(name, "merge", ratio, metrics, merge.expert_plan()))
            continue
        if name.startswith("random:"):
            seed = int(name.split(":")[1])
            scores, allocation = lp.score_weights(model, "random", seed=seed), "uniform"
        else:
            scores, allocation = rankings[name]
        plan = lp.select_experts(scores, ratio, allocation)
        with lp.mask_experts(model, plan):
            metrics = measured(model)
        if name.startswith("random:"):
            if metrics.get(ROW_SUMS) is not None:
                null_sums.setdefault(ratio, []).append(metrics[ROW_SUMS])
                if records is not None:
                    records.add(plan_key(name, ratio), metrics[ROW_SUMS])
            metrics = {k: v for k, v in metrics.items() if k != ROW_SUMS}
            out["random"].setdefault(str(ratio), {"seeds": []})["seeds"].append(metrics)
        else:
            out["rows"].append(row(name, allocation, ratio, metrics, plan))
    for entry in out["random"].values():
        entry["summary"] = summarise(entry["seeds"])
    if dense_sums is not None and (standing_metrics or comparisons):
        _stand(out, dense_sums, row_sums, null_sums, standing_metrics, comparisons, testbed_seed)
    if records is not None:
        out["records"] = records.to_dict()
    return out


def _stand(out: dict[str, Any], dense_sums, row_sums, null_sums, metrics: Sequence[str],
           comparisons: Sequence[tuple[str, str, str]], testbed_seed: int) -> None:
    """Each row's ``standing`` against the random plans and ``versus`` its rivals (`expert_quality`)."""
    from lightprune.quality.evidence import standing
    from lightprune.quality.intervals import paired_difference, retention

    dense = out["dense"]
    for entry in out["rows"]:
        ratio, sums = entry["ratio"], row_sums.get((entry["criterion"], entry["ratio"]))
        if sums is None:
            continue
        for metric in metrics:
            null = null_sums.get(ratio, [])
            if not null or metric not in sums:
                continue
            value = float(retention(metric, entry["metrics"][metric], dense[metric]))
            kept = [float(retention(metric, seed[metric], dense[metric]))
                    for seed in out["random"][str(ratio)]["seeds"]]
            if not all(math.isfinite(v) for v in (value, *kept)):  # a dense accuracy of 0: no retention to judge
                continue
            diff, ci = paired_difference(metric, dense_sums[metric], sums[metric], [n[metric] for n in null])
            entry.setdefault("standing", {})[metric] = standing(value, kept, diff, ci, testbed_seed)
        for criterion, rival, metric in comparisons:
            other = row_sums.get((rival, ratio))
            if criterion != entry["criterion"] or other is None or metric not in sums:
                continue
            diff, ci = paired_difference(metric, dense_sums[metric], sums[metric], [other[metric]])
            if not math.isfinite(diff):  # a dense accuracy of 0: no retention to compare
                continue
            entry.setdefault("versus", {}).setdefault(rival, {})[metric] = {
                "testbed_seed": int(testbed_seed), "paired_diff": diff, "paired_ci": ci}


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """Mean, sample standard deviation (None for one value), min and max; all None when a value is missing."""
    if not values or any(v is None for v in values):
        return {"mean": None, "std": None, "min": None, "max": None}
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values)}


def summarise(runs: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float | None]]:
    """Per metric: `spread` over runs."""
    return {k: spread([r[k] for r in runs]) for k in runs[0]}


def proxy_rho(model: torch.nn.Module, batches: Sequence[Mapping[str, Any]], stats, subsets: Sequence[str] = ("all",),
              *, expert_chunk: int = 8, progress: bool = True) -> dict[str, Any]:
    """Per subset and proxy (delta_h, reap, routing_kl): per-layer Spearman rho against the ground-truth KL."""
    truth = ground_truth_kl(model, batches, subsets=subsets, expert_chunk=expert_chunk, progress=progress)
    return proxy_correlations(stats, truth)


def stability(stats_a, stats_b, criteria: Sequence[str] = ("delta_h", "reap", "frequency"),
              subsets: Sequence[str] | None = None) -> dict[str, Any]:
    """``{criterion: {subset: {"per_layer", "mean"}}}``: Spearman between two calibration sets' rankings."""
    return {c: ranking_stability(stats_a, stats_b, c, subsets) for c in criteria}


def router_sensitivity(checkpoint: str, datamodule, *, steps: int, learning_rate: float = 2e-4,
                       weight_decay: float = 0.01, warmup_steps: int = 5, r: int = 8, seed: int = 0,
                       progress: bool = True):
    """Router sensitivity's weight score (Eq. 4): fit LoRA on the routers of ``checkpoint`` for ``steps``, score
    |Delta ||w_e|||.

    The defaults are configs/router_lora.yaml's recipe (LoRA r = alpha = 8 on the routers, AdamW, lr 2e-4, weight
    decay 0.01, cosine with 5 warm-up steps; the paper's 500 steps); the batch is the datamodule's. Runs ``lightprune
    fit``'s RouterDelta callback (no export) and returns its [`ExpertScores`][lightprune.experts.scores.ExpertScores].
    """
    import lightning.pytorch as pl


    pl.seed_everything(seed, verbose=False)
    module = MoECausalLM(checkpoint=checkpoint, learning_rate=learning_rate, weight_decay=weight_decay,
                         warmup_steps=min(warmup_steps, max(0, steps - 1)), scheduler="cosine",
                         adapter=AdapterSpec(kind="lora", targets=["router"], r=r, alpha=r, dropout=0.0))
    with tempfile.TemporaryDirectory() as tmp:
        callback = RouterDelta(score="weight")  # a scorer: no plan, nothing written
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                             enable_progress_bar=progress, enable_model_summary=False, limit_val_batches=0,
                             num_sanity_val_steps=0, callbacks=[callback], default_root_dir=tmp)
        trainer.fit(module, datamodule=datamodule)
    if callback.scores is None:
        raise RuntimeError("the router-LoRA fit ended without RouterDelta scores")
    return callback.scores

