"""Each paper's claim as the quality tables can check it, and one rule that says whether it held here.

The claims (`CLAIM_CHECKS`: a check per claim and comparator), stated as the papers make them:

- MAEP ("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language Models", arXiv 2611.05927),
  section 6.2: Delta-H, and MAEP's global ranking, keep more of a multimodal MoE than random pruning, REAP and
  routing-KL;
- AIMER ("AIMER: Calibration-Free Task-Agnostic MoE Pruning", arXiv 2603.18492), section 5.2: a weight-only
  ranking, without calibration data, keeps more than random pruning, and more than the other weight-only rankings
  (magnitude, router norm);
- MWOP ("MWOP: Modality-aware Width-wise Operation Pruning for Efficient MLLMs"), section 6.2: Taylor-ranked path
  and channel pruning keeps more than random masks of the same ratios, training-free and after the same recovery
  (scored against the dense model given that recovery);
- router sensitivity ("Router Sensitivity Under Lightweight Fine-Tuning Identifies Prunable Experts in
  Mixture-of-Experts Models", arXiv 2608.07890), abstract: "nearly 1.8 times that of magnitude-based or random pruning
  at maximal compression": the experts whose router rows moved least under a light fine-tune are prunable: the ranking
  keeps more than random on every fit seed, more than magnitude and the router norm, and more than its own reverse.

The rule, stated before the seeds were measured, on several independently trained testbeds (each seed's standing:
`lightprune.quality.evidence.standing`; the verdict over the seeds: `claim_verdict`):

- on one testbed seed, the criterion's retention v against N random plans of the same ratio (the null): the
  empirical p-value p = (1 + #{null >= v}) / (1 + N) (the chance that a random plan keeps at least as much), and
  the paired difference d = v - mean(null) with its paired bootstrap interval over the evaluation rows (the same
  rows for the dense model, the criterion and every null plan: `paired_difference`);
  against a named rival (a paper's own comparator, or MWOP's few recovered random plans) d and its interval alone.
  A seed is "for" the claim when its interval lies above 0 (and, against the null, p < 0.05), "against" it when
  its interval lies below 0 (and the p-value the other way, (1 + #{null <= v}) / (1 + N), is below 0.05);
- over the seeds, the t interval of the seeds' d (`seed_interval`: the
  training seed's noise, which one seed's bootstrap over rows cannot see): "held" when it lies above 0 and no seed
  is against the claim; "did not hold" when it lies below 0 and no seed is for it; "depends on the training seed"
  when some seed is for the claim and another against it (each seed's own interval excluding 0, with opposite
  signs); otherwise "within noise". A claim made for every fit seed (router sensitivity) or operating point (MWOP)
  is judged over the testbed seeds within each, and holds when it holds for every one. The per-seed p-values and
  intervals are kept beside the verdict. A random plan judged as a criterion passes at most 2.5% of the time (the t
  interval's own guarantee), shown by a test that feeds random plans to the rule;
- MAEP's closed-form alpha (``maep_global``) is judged only where the bootstrap interval of a = rho(t, v) -
  rho(t, la) over the calibration samples excludes 0 on every seed (`lightprune.quality.alpha_interval`);
  elsewhere the check reads `NOT_JUDGED` (its fixed-alpha rows are judged either way);
- a verdict needs `MIN_TESTBED_SEEDS` independently trained testbeds; fewer give "too few testbed seeds".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightprune.quality.intervals import seed_interval

__all__ = ["CLAIM_CHECKS", "CLOSED_FORM", "DEPENDS", "MIN_TESTBED_SEEDS", "NOT_JUDGED", "P_LEVEL", "RECOVERED_RANDOM",
           "claim_verdict", "claims_over_seeds", "comparison_verdict", "criteria_over_seeds", "over_seeds"]

HELD, NOISE, FAILED, MISSING = "held", "within noise", "did not hold", "not measured"
DEPENDS = "depends on the training seed"
FEW = "too few testbed seeds"
#: a check on MAEP's closed-form alpha where a's interval contains 0 on some seed: alpha is then noise
NOT_JUDGED = "not judged: a's interval contains 0"
#: independently trained testbeds a verdict needs (fewer: :data:`FEW`, the seeds' figures still shown)
MIN_TESTBED_SEEDS = 3
#: the p-value below which one seed counts for the claim (and above 1 - P_LEVEL against it)
P_LEVEL = 0.05


def _over_seeds(seeds: Sequence[Mapping[str, Any]], up, down) -> str:
    """The rule of the module docstring over per-seed records, ``up(record)`` / ``down(record)`` saying whether a
    seed is for / against the claim."""
    if not seeds:
        return MISSING
    ups, downs = any(up(s) for s in seeds), any(down(s) for s in seeds)
    if ups and downs:
        return DEPENDS
    interval = seed_interval([s["paired_diff"] for s in seeds])
    if interval is None:  # one seed: its own interval decides (too few seeds for a verdict anyway)
        return HELD if ups else FAILED if downs else NOISE
    if interval[0] > 0 and not downs:
        return HELD
    if interval[1] < 0 and not ups:
        return FAILED
    return NOISE


def claim_verdict(seeds: Sequence[Mapping[str, Any]]) -> str:
    """The rule of the module docstring against the random null, over per-seed `standing` records: held, did
    not hold, depends on the training seed, within noise (not measured without seeds)."""
    return _over_seeds(seeds, lambda s: s["p_value"] < P_LEVEL and s["paired_ci"][0] > 0,
                       lambda s: _lower_p_value(s) < P_LEVEL and s["paired_ci"][1] < 0)


def comparison_verdict(seeds: Sequence[Mapping[str, Any]]) -> str:
    """The rule of the module docstring against a named rival (a paper's own comparator) over per-seed
    ``{"paired_diff", "paired_ci"}`` records (not measured without seeds)."""
    return _over_seeds(seeds, lambda s: s["paired_ci"][0] > 0, lambda s: s["paired_ci"][1] < 0)


def _grouped_verdict(seeds: Sequence[Mapping[str, Any]], verdict) -> str:
    """``verdict`` over the testbed seeds within each group of records (one per fit seed of router sensitivity, one
    per operating point of MWOP: a claim made for every one of them), then combined: held (did not hold) when every
    group's is, depends on the training seed when one group's does, else within noise."""
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for record in seeds:
        groups.setdefault((record.get("fit_seed"), record.get("operating_point")), []).append(record)
    verdicts = {verdict(group) for group in groups.values()}
    if len(verdicts) == 1:
        return verdicts.pop()
    return DEPENDS if DEPENDS in verdicts else NOISE


def over_seeds(seeds: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """What the page shows of a check over its seeds: the seeds' mean paired difference, its t interval over
    seeds, min and max (None without seeds)."""
    diffs = [float(s["paired_diff"]) for s in seeds]
    if not diffs:
        return None
    return {"mean": sum(diffs) / len(diffs), "interval": seed_interval(diffs), "min": min(diffs), "max": max(diffs),
            "seeds": len(diffs)}


def _lower_p_value(record: Mapping[str, Any]) -> float:
    """The p-value the other way, (1 + #{null <= v}) / (1 + N), of a `standing` record; records measured
    before it was kept: (2 + N) / (1 + N) - p (exact where no null plan ties the criterion)."""
    if "p_value_below" in record:
        return record["p_value_below"]
    size = record["null_size"]
    return (2 + size) / (1 + size) - record["p_value"]


def _row(result: Mapping[str, Any], criterion: str, ratio: float) -> Mapping[str, Any] | None:
    return next((r for r in result.get("rows", []) if r["criterion"] == criterion and float(r["ratio"]) == ratio),
                None)


#: MWOP's rival after recovery: the mean of the random plans given the same recovery (too few for a p-value)
RECOVERED_RANDOM = "random, recovered"

#: the router-sensitivity paper's label on the page ("Router Sensitivity Under Lightweight Fine-Tuning Identifies
#: Prunable Experts in Mixture-of-Experts Models", arXiv 2608.07890)
ROUTER_SENSITIVITY = "Router sensitivity (arXiv 2608.07890)"

#: every claim checked over testbed seeds: (paper, claim, testbed part, criterion, rival (None: the random null),
#: metric); a paper's claim against its own comparators is one check per comparator; a criterion ending in "*" is
#: every row of that name and its ``_fit<n>`` variants (router sensitivity's fit seeds), each a record per seed;
#: on the MWOP testbed (method rows per operating point) a record per seed and operating point
CLAIM_CHECKS: tuple[tuple[str, str, str, str, str | None, str], ...] = (
    ("MAEP (arXiv 2611.05927)", "Delta-H keeps more than random pruning", "mllm", "delta_h", None, "acc_image"),
    ("MAEP (arXiv 2611.05927)", "Delta-H keeps more image accuracy than REAP", "mllm", "delta_h", "reap",
     "acc_image"),
    ("MAEP (arXiv 2611.05927)", "Delta-H keeps more text than REAP", "mllm", "delta_h", "reap", "ppl_text"),
    ("MAEP (arXiv 2611.05927)", "Delta-H keeps more image accuracy than routing-KL", "mllm", "delta_h", "routing_kl",
     "acc_image"),
    ("MAEP (arXiv 2611.05927)", "MAEP's global ranking (closed-form alpha) keeps more image accuracy than REAP",
     "mllm", "maep_global", "reap", "acc_image"),
    ("MAEP (arXiv 2611.05927)", "MAEP's global ranking (closed-form alpha) keeps the image answers' likelihood "
     "better than REAP", "mllm", "maep_global", "reap", "ppl_image"),
    ("MAEP (arXiv 2611.05927)", "MAEP's global ranking (closed-form alpha) keeps more text than REAP", "mllm",
     "maep_global", "reap", "ppl_text"),
    ("MAEP (arXiv 2611.05927)", "the modality term: MAEP's global ranking keeps more image accuracy than text "
     "Delta-H ranked globally", "mllm", "maep_global", "delta_h_text_global", "acc_image"),
    ("MAEP (arXiv 2611.05927)", "the scoring: MAEP's global ranking keeps more image accuracy than REAP ranked "
     "globally", "mllm", "maep_global", "reap_global", "acc_image"),
    ("MAEP (arXiv 2611.05927)", "the allocation: REAP ranked globally keeps more image accuracy than REAP per "
     "layer", "mllm", "reap_global", "reap", "acc_image"),
    ("MAEP (arXiv 2611.05927)", "MAEP's global ranking at alpha = 0.1 keeps more image accuracy than REAP", "mllm",
     "maep_global_alpha0.1", "reap", "acc_image"),
    ("MAEP (arXiv 2611.05927)", "MAEP's global ranking at alpha = 0.3 keeps more image accuracy than REAP", "mllm",
     "maep_global_alpha0.3", "reap", "acc_image"),
    ("MAEP (arXiv 2611.05927)", "MAEP's global ranking at alpha = 0.8 keeps more image accuracy than REAP", "mllm",
     "maep_global_alpha0.8", "reap", "acc_image"),
    ("AIMER (arXiv 2603.18492)", "a calibration-free weight ranking keeps more than random pruning", "text", "aimer",
     None, "ppl"),
    ("AIMER (arXiv 2603.18492)", "AIMER keeps more than magnitude", "text", "aimer", "magnitude", "ppl"),
    ("AIMER (arXiv 2603.18492)", "AIMER keeps more than the router norm", "text", "aimer", "router_norm", "ppl"),
    ("AIMER (arXiv 2603.18492)", "a calibration-free weight ranking keeps more than random pruning", "mllm", "aimer",
     None, "acc_image"),
    (ROUTER_SENSITIVITY, "experts whose router rows move least are prunable: more kept than random "
     "(every fit seed)", "text", "router_sensitivity*", None, "ppl"),
    (ROUTER_SENSITIVITY, "router sensitivity keeps more than magnitude", "text", "router_sensitivity",
     "magnitude", "ppl"),
    (ROUTER_SENSITIVITY, "router sensitivity keeps more than the router norm", "text", "router_sensitivity",
     "router_norm", "ppl"),
    (ROUTER_SENSITIVITY, "router sensitivity keeps more than its reverse", "text", "router_sensitivity",
     "anti_router_sensitivity", "ppl"),
    ("MWOP", "Taylor-ranked paths and channels keep more than random masks of the same ratios, training-free "
     "(every operating point)", "mwop", "taylor", None, "atr"),
    ("MWOP", "Taylor-ranked paths and channels keep more than random masks of the same ratios, training-free "
     "(every operating point)", "mwop", "taylor", None, "answer_ppl_atr"),
    ("MWOP", "after the same recovery, Taylor's plans keep more than random plans (every operating point; "
     "against the dense model given that recovery)", "mwop", "taylor", RECOVERED_RANDOM, "atr"),
    ("MWOP", "after the same recovery, Taylor's plans keep more than random plans (every operating point; "
     "against the dense model given that recovery)", "mwop", "taylor", RECOVERED_RANDOM, "answer_ppl_atr"),
)


#: the row of MAEP's closed-form alpha (clamped to [0, 1]), judged only where a's interval excludes 0 on every seed
CLOSED_FORM = "maep_global"


def _width_records(table: Mapping[str, Any], method: str, rival: str | None,
                   metric: str) -> list[Mapping[str, Any] | None]:
    """The records of one seed's MWOP table (`mwop_quality`, with its
    ``recovery``): one per operating point of the ``method`` rows, training-free against the null or recovered
    against the recovered random plans; None where a record is missing."""
    if rival is None:
        rows, key = table.get("rows", []), "standing"
    else:
        rows, key = (table.get("recovery") or {}).get("rows", []), "versus"
    points = list(dict.fromkeys(r["operating_point"] for r in table.get("rows", []) if r["method"] == method))
    if not points:  # a seed whose table has no such rows (or could not be measured) leaves the check incomplete
        return [None]
    out: list[Mapping[str, Any] | None] = []
    for point in points:
        row = next((r for r in rows if r["method"] == method and r["operating_point"] == point), None)
        record = None if row is None else row.get(key, {}) if rival is None else row.get(key, {}).get("random", {})
        record = None if record is None else record.get(metric)
        out.append(None if record is None else {**record, "operating_point": point})
    return out


def _seed_records(table: Mapping[str, Any], criterion: str, rival: str | None, metric: str,
                  ratio: float) -> list[Mapping[str, Any] | None]:
    """The records of one seed's table: one per criterion row (``name*``: the row and its ``_fit<n>`` variants, each
    record with its ``fit_seed``); None where a row or its record is missing."""
    if criterion.endswith("*"):
        base = criterion[:-1]
        names = sorted({r["criterion"] for r in table.get("rows", []) if r["criterion"] == base
                        or r["criterion"].startswith(f"{base}_fit")}) or [base]
    else:
        names = [criterion]
    out: list[Mapping[str, Any] | None] = []
    for name in names:
        row = _row(table, name, ratio)
        record = None if row is None else row.get("standing", {}).get(metric) if rival is None else \
            row.get("versus", {}).get(rival, {}).get(metric)
        if record is not None and criterion.endswith("*"):
            record = {**record, "fit_seed": int(name.rsplit("_fit", 1)[1]) if "_fit" in name else 0}
        out.append(record)
    return out


def _enough(verdict: str, seeds: Sequence[Mapping[str, Any]], min_seeds: int) -> str:
    """``verdict``, or `FEW` when the records come from fewer than ``min_seeds`` testbed seeds."""
    return FEW if verdict != MISSING and len({s["testbed_seed"] for s in seeds}) < min_seeds else verdict


def claims_over_seeds(text: Sequence[Mapping[str, Any]] = (), mllm: Sequence[Mapping[str, Any]] = (),
                      ratio: float = 0.5, mwop: Sequence[Mapping[str, Any]] = (),
                      min_seeds: int = MIN_TESTBED_SEEDS) -> list[dict[str, Any]]:
    """``[{"paper", "claim", "testbed", "criterion", "rival", "metric", "ratio", "verdict", "seeds"}]``: every check
    of `CLAIM_CHECKS` over the tables of each testbed seed (``text`` / ``mllm``: one table per seed, from
    `text_tables` / ``mllm_tables`` / ``mwop_tables``), its seeds' records as
    results.json keeps them and the verdict by the rule of the module docstring (`claim_verdict` against the
    null, `comparison_verdict` against a rival). A check without a record on some seed is "not measured";
    ``ratio`` is the expert-pruning checks' (MWOP's: the paper's operating points); records from fewer than
    ``min_seeds`` testbed seeds give `FEW` (one draw decides nothing)."""
    parts = {"text": list(text), "mllm": list(mllm), "mwop": list(mwop)}
    out = []
    for paper, claim, testbed, criterion, rival, metric in CLAIM_CHECKS:
        per_table = [(table, _width_records(table, criterion, rival, metric) if testbed == "mwop"
                      else _seed_records(table, criterion, rival, metric, ratio)) for table in parts[testbed]]
        records = [r for _, found in per_table for r in found]
        seeds = [dict(r) for r in records if r is not None]
        complete = bool(records) and len(seeds) == len(records)
        verdict = MISSING if not complete else _grouped_verdict(seeds, claim_verdict if rival is None
                                                                else comparison_verdict)
        verdict = _enough(verdict, seeds, min_seeds)
        if criterion == CLOSED_FORM and verdict not in (MISSING, FEW):
            noise = [(t.get("testbed") or {}).get("seed") for t in parts[testbed]
                     if not (t.get("maep_alpha_interval") or {}).get("a_excludes_zero")]
            if noise:
                verdict = f"{NOT_JUDGED} on testbed seeds {noise}"
        out.append({"paper": paper, "claim": claim, "testbed": testbed, "criterion": criterion, "rival": rival,
                    "metric": metric, "ratio": ratio, "verdict": verdict, "seeds": seeds,
                    "over_seeds": over_seeds(seeds)})
        # a testbed seed that could not be measured, or whose table has no record for the check, and why (the
        # check is then not measured)
        unmeasured = [{"testbed_seed": t.get("testbed_seed"), "error": t["error"]} if "error" in t else
                      {"testbed_seed": (t.get("testbed") or {}).get("seed"), "error": _missing_why(t, criterion, ratio)}
                      for t, found in per_table if "error" in t or None in found]
        if unmeasured:
            out[-1]["unmeasured"] = unmeasured
    return out


def _missing_why(table: Mapping[str, Any], criterion: str, ratio: float) -> str:
    """Why one seed's table has no record for a check on ``criterion``: MAEP's closed-form alpha undefined (its
    clamped row needs a value; tables measured before the clamp also lack the row outside [0, 1]), else the row is
    absent."""
    if criterion.startswith("maep") and table.get("maep_alpha_error"):
        return f"no {criterion} row: {table['maep_alpha_error']}"
    return f"no {criterion.rstrip('*')} record at {ratio:g}"


def criteria_over_seeds(tables: Sequence[Mapping[str, Any]], testbed: str, metric: str,
                        ratio: float = 0.5, min_seeds: int = MIN_TESTBED_SEEDS) -> list[dict[str, Any]]:
    """Every criterion row of the expert tables (one per testbed seed) against the random null by the same rule:
    ``[{"testbed", "criterion", "allocation", "metric", "ratio", "verdict", "seeds"}]`` in the first seed's row
    order, the claims' context (which criteria tie, which hold)."""
    first = next((t for t in tables if "error" not in t), None)
    if first is None:
        return []
    out = []
    for row in first.get("rows", []):
        if float(row["ratio"]) != ratio or metric not in row.get("standing", {}):
            continue
        records = [next((r.get("standing", {}).get(metric) for r in t.get("rows", [])
                         if r["criterion"] == row["criterion"] and float(r["ratio"]) == ratio), None) for t in tables]
        seeds = [dict(r) for r in records if r is not None]
        verdict = _enough(claim_verdict(seeds) if len(seeds) == len(records) else MISSING, seeds, min_seeds)
        out.append({"testbed": testbed, "criterion": row["criterion"], "allocation": row["allocation"],
                    "metric": metric, "ratio": ratio, "verdict": verdict, "seeds": seeds,
                    "over_seeds": over_seeds(seeds)})
    return out
