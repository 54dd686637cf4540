"""Each paper's claim as the quality tables can check it, and whether it held here.

One claim per paper, stated as the paper makes it, tested on the measured numbers with a rule written beside it
(no judgement is left to the reader):

- MAEP (paper 000, section 6.2 and appendix I): Delta-H keeps more than REAP and routing-KL when experts of a
  multimodal MoE are pruned, and its proxy tracks the true KL of removing an expert more closely;
- AIMER (paper 001, section 5.2): a weight-only ranking, without calibration data, keeps more than random pruning;
- MWOP (paper 002, section 6.2): Taylor-ranked path and channel pruning keeps more than random pruning at the
  same ratios, after recovery (training-free when no recovery was measured);
- router sensitivity (paper 003, abstract: "nearly 1.8 times that of magnitude-based or random pruning at maximal
  compression"): the experts whose router rows moved least under a light fine-tune are prunable: the ranking
  keeps more than random and more than its own reverse.

"Held" needs the criterion above random's best seed (random's spread is over seeds) and, where the row has one,
the lower end of its bootstrap interval above random's mean; "within noise" when it is above random's mean only;
otherwise "did not hold". A claim whose rows were not measured says so.

The rule for a claim measured on several independently trained testbeds against a null distribution (each seed's
standing: :func:`lightprune.quality.evidence.standing`; the verdict over the seeds: :func:`claim_verdict`), the one every claim moves to:

- on one testbed seed, the criterion's retention v against N random plans of the same ratio (the null): the
  empirical p-value p = (1 + #{null >= v}) / (1 + N) (the chance that a random plan keeps at least as much), and
  the paired difference d = v - mean(null) with its paired bootstrap interval over the evaluation rows (the same
  rows for the dense model, the criterion and every null plan: :func:`~lightprune.quality.intervals.paired_difference`);
- "held" when p < 0.05 and the interval's lower end is above 0 on every seed; "did not hold" when the opposite
  holds on every seed (the p-value the other way, (1 + #{null <= v}) / (1 + N), below 0.05, and the interval's
  upper end below 0); otherwise "within noise". A random plan judged as a criterion passes at most 5% of the time on one seed (the
  p-value's own guarantee), less on several (shown by a test that feeds random plans to the rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightprune.quality.expert_quality import spread
from lightprune.quality.intervals import retention

__all__ = ["CLAIM_CHECKS", "P_LEVEL", "claim_verdict", "claims_over_seeds", "comparison_verdict", "paper_claims"]

HELD, NOISE, FAILED, MISSING = "held", "within noise", "did not hold", "not measured"
#: the p-value below which one seed counts for the claim (and above 1 - P_LEVEL against it)
P_LEVEL = 0.05


def claim_verdict(seeds: Sequence[Mapping[str, Any]]) -> str:
    """The rule of the module docstring over per-seed :func:`standing` records: held, did not hold, within noise (not
    measured without seeds)."""
    if not seeds:
        return MISSING
    if all(s["p_value"] < P_LEVEL and s["paired_ci"][0] > 0 for s in seeds):
        return HELD
    if all(_lower_p_value(s) < P_LEVEL and s["paired_ci"][1] < 0 for s in seeds):
        return FAILED
    return NOISE


def comparison_verdict(seeds: Sequence[Mapping[str, Any]]) -> str:
    """A criterion against a named rival (a paper's own comparator) over per-seed ``{"paired_diff", "paired_ci"}``
    records: held when the interval is above 0 on every seed, did not hold when below 0 on every seed, else within
    noise (not measured without seeds)."""
    if not seeds:
        return MISSING
    if all(s["paired_ci"][0] > 0 for s in seeds):
        return HELD
    if all(s["paired_ci"][1] < 0 for s in seeds):
        return FAILED
    return NOISE


def _lower_p_value(record: Mapping[str, Any]) -> float:
    """The p-value the other way, (1 + #{null <= v}) / (1 + N), from a :func:`standing` record: (2 + N) / (1 + N) - p
    (the retentions of distinct plans do not tie)."""
    size = record["null_size"]
    return (2 + size) / (1 + size) - record["p_value"]


def _row(result: Mapping[str, Any], criterion: str, ratio: float) -> Mapping[str, Any] | None:
    return next((r for r in result.get("rows", []) if r["criterion"] == criterion and float(r["ratio"]) == ratio),
                None)


def _kept(result: Mapping[str, Any], row: Mapping[str, Any], metric: str) -> float:
    return retention(metric, row["metrics"][metric], result["dense"][metric])


def _random(result: Mapping[str, Any], ratio: float, metric: str) -> list[float]:
    seeds = result.get("random", {}).get(str(ratio), {}).get("seeds", [])
    return [retention(metric, s[metric], result["dense"][metric]) for s in seeds]


def _verdict(value: float, low: float, random_mean: float, random_best: float) -> str:
    """The module docstring's rule: ``low`` is the lower end of the value's interval (the value without one)."""
    return HELD if value > random_best and low > random_mean else NOISE if value > random_mean else FAILED


def _against_random(result: Mapping[str, Any] | None, criterion: str, ratio: float, metric: str) -> tuple[str, str]:
    """(verdict, figures) of ``criterion`` against random at ``ratio`` on ``metric``'s retention."""
    row = _row(result or {}, criterion, ratio)
    randoms = _random(result or {}, ratio, metric) if result else []
    if row is None or not randoms:
        return MISSING, f"{criterion} @{int(ratio * 100)}% not measured"
    kept, mean, best = _kept(result, row, metric), sum(randoms) / len(randoms), max(randoms)
    interval = row.get("intervals", {}).get(metric)
    low = interval[0] if interval else kept
    verdict = _verdict(kept, low, mean, best)
    ci = f" [{interval[0]:.1f}, {interval[1]:.1f}]" if interval else ""
    return verdict, (f"{criterion} {kept:.1f}{ci} vs random {mean:.1f} [{min(randoms):.1f}, {best:.1f}] "
                     f"({metric} retention @{int(ratio * 100)}%)")


def _worst(*verdicts: str) -> str:
    order = (MISSING, FAILED, NOISE, HELD)
    return min(verdicts, key=order.index)


def _maep(mllm: Mapping[str, Any] | None, ratio: float) -> tuple[str, str]:
    if not mllm or _row(mllm, "delta_h", ratio) is None:
        return MISSING, "the multimodal MoE testbed was not measured"
    parts, verdicts = [], []
    for metric in ("acc_image", "ppl_text"):
        dh = _kept(mllm, _row(mllm, "delta_h", ratio), metric)
        rivals = {c: _kept(mllm, _row(mllm, c, ratio), metric) for c in ("reap", "routing_kl")
                  if _row(mllm, c, ratio) is not None}
        verdicts.append(HELD if all(dh > v for v in rivals.values()) else FAILED)
        parts.append(f"{metric} retention @{int(ratio * 100)}%: delta_h {dh:.1f}, "
                     + ", ".join(f"{c} {v:.1f}" for c, v in rivals.items()))
    rho = mllm.get("proxy_rho", {}).get("all", {})
    if {"delta_h", "reap", "routing_kl"} <= set(rho) and all(rho[c]["mean"] is not None for c in rho):
        verdicts.append(HELD if rho["delta_h"]["mean"] > max(rho["reap"]["mean"], rho["routing_kl"]["mean"])
                        else FAILED)
        parts.append("proxy rho vs the true KL: " + ", ".join(f"{c} {rho[c]['mean']:.2f}"
                                                             for c in ("delta_h", "reap", "routing_kl")))
    return _worst(*verdicts), "; ".join(parts)


def _mwop(mwop: Mapping[str, Any] | None) -> tuple[str, str]:
    """Taylor against random per operating point: after recovery when it was measured (the claim as the paper
    makes it), else training-free."""
    if not mwop:
        return MISSING, "MWOP was not measured"
    recovered = (mwop.get("recovery") or {}).get("rows")
    verdicts, parts = [], []
    for taylor in (r for r in (recovered or mwop["rows"]) if r["method"] == "taylor"):
        point = taylor["operating_point"]
        if recovered:
            seeds = [r for r in recovered if r["method"] == "random" and r["operating_point"] == point]
            random = {key: spread([r[key] for r in seeds]) for key in ("atr", "answer_ppl_atr")} if seeds else None
        else:
            random = next((r for r in mwop["rows"] if r["method"] == "random" and r["operating_point"] == point), None)
        if random is None:
            continue
        for key, label in (("atr", "token ATR"), ("answer_ppl_atr", "answer-ppl ATR")):
            if taylor.get(key) is None or key not in random or random[key]["mean"] is None:
                continue
            interval = taylor.get(f"{key}_interval")
            low = interval[0] if interval else taylor[key]
            best, mean = random[key]["max"], random[key]["mean"]
            verdicts.append(_verdict(taylor[key], low, mean, best))
            ci = f" [{interval[0]:.1f}, {interval[1]:.1f}]" if interval else ""
            parts.append(f"{point} {label}: Taylor {taylor[key]:.1f}{ci} vs random {mean:.1f} "
                         f"[{random[key]['min']:.1f}, {best:.1f}]")
    if not verdicts:
        return MISSING, "MWOP has no random rows"
    return _worst(*verdicts), "; ".join(parts) + (" (after recovery)" if recovered else " (training-free, no recovery)")


def paper_claims(text: Mapping[str, Any] | None = None, mllm: Mapping[str, Any] | None = None,
                 mwop: Mapping[str, Any] | None = None, ratio: float = 0.5) -> list[dict[str, str]]:
    """``[{"paper", "claim", "rule", "verdict", "figures"}]``, one per paper (module docstring), at ``ratio``."""
    out = []
    verdict, figures = _maep(mllm, ratio)
    out.append({"paper": "MAEP (000)", "claim": "Delta-H keeps more than REAP and routing-KL on a multimodal MoE, "
                "and tracks the true removal KL more closely", "rule": "delta_h above both on image accuracy and "
                "text perplexity retention, and the highest proxy rho", "verdict": verdict, "figures": figures})
    checks = [_against_random(text, "aimer", ratio, "ppl"), _against_random(mllm, "aimer", ratio, "acc_image")]
    out.append({"paper": "AIMER (001)", "claim": "a calibration-free weight ranking keeps more than random pruning",
                "rule": "aimer above random (text ppl and multimodal image accuracy retention)",
                "verdict": _worst(*(v for v, _ in checks)), "figures": "; ".join(f for _, f in checks)})
    verdict, figures = _mwop(mwop)
    out.append({"paper": "MWOP (002)", "claim": "Taylor-ranked paths and channels keep more than random at the "
                "same ratios", "rule": "Taylor above random at every operating point, token and answer-ppl ATR",
                "verdict": verdict, "figures": figures})
    checks = [_against_random(text, "router_sensitivity", ratio, "ppl")]
    anti, sens = _row(text or {}, "anti_router_sensitivity", ratio), _row(text or {}, "router_sensitivity", ratio)
    if anti is not None and sens is not None:
        a, s = _kept(text, anti, "ppl"), _kept(text, sens, "ppl")
        checks.append((HELD if s > a else FAILED, f"anti_router_sensitivity {a:.1f}"))
    out.append({"paper": "router sensitivity (003)", "claim": "experts whose router rows move least under a light "
                "fine-tune are prunable", "rule": "router_sensitivity above random and above its reverse (text ppl "
                "retention)", "verdict": _worst(*(v for v, _ in checks)), "figures": "; ".join(f for _, f in checks)})
    for claim in out:
        claim["rule"] += f", at {int(ratio * 100)}% of the experts" if claim["paper"] != "MWOP (002)" else ""
    return out


#: every claim checked over testbed seeds: (paper, claim, testbed part, criterion, rival (None: the random null),
#: metric); a paper's claim against its own comparators is one check per comparator; a criterion ending in "*" is
#: every row of that name and its ``_fit<n>`` variants (router sensitivity's fit seeds), each a record per seed
CLAIM_CHECKS: tuple[tuple[str, str, str, str, str | None, str], ...] = (
    ("MAEP (000)", "Delta-H keeps more than random pruning", "mllm", "delta_h", None, "acc_image"),
    ("MAEP (000)", "Delta-H keeps more image accuracy than REAP", "mllm", "delta_h", "reap", "acc_image"),
    ("MAEP (000)", "Delta-H keeps more text than REAP", "mllm", "delta_h", "reap", "ppl_text"),
    ("MAEP (000)", "Delta-H keeps more image accuracy than routing-KL", "mllm", "delta_h", "routing_kl", "acc_image"),
    ("MAEP (000)", "MAEP's global ranking keeps more image accuracy than REAP", "mllm", "maep_global", "reap",
     "acc_image"),
    ("AIMER (001)", "a calibration-free weight ranking keeps more than random pruning", "text", "aimer", None, "ppl"),
    ("AIMER (001)", "AIMER keeps more than magnitude", "text", "aimer", "magnitude", "ppl"),
    ("AIMER (001)", "AIMER keeps more than the router norm", "text", "aimer", "router_norm", "ppl"),
    ("AIMER (001)", "a calibration-free weight ranking keeps more than random pruning", "mllm", "aimer", None,
     "acc_image"),
    ("router sensitivity (003)", "experts whose router rows move least are prunable: more kept than random "
     "(every fit seed)", "text", "router_sensitivity*", None, "ppl"),
    ("router sensitivity (003)", "router sensitivity keeps more than magnitude", "text", "router_sensitivity",
     "magnitude", "ppl"),
    ("router sensitivity (003)", "router sensitivity keeps more than the router norm", "text", "router_sensitivity",
     "router_norm", "ppl"),
    ("router sensitivity (003)", "router sensitivity keeps more than its reverse", "text", "router_sensitivity",
     "anti_router_sensitivity", "ppl"),
)


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


def claims_over_seeds(text: Sequence[Mapping[str, Any]] = (), mllm: Sequence[Mapping[str, Any]] = (),
                      ratio: float = 0.5) -> list[dict[str, Any]]:
    """``[{"paper", "claim", "testbed", "criterion", "rival", "metric", "ratio", "verdict", "seeds"}]``: every check
    of :data:`CLAIM_CHECKS` over the tables of each testbed seed (``text`` / ``mllm``: one table per seed, from
    :func:`~lightprune.quality.tables.text_tables` / ``mllm_tables``), its seeds' records as results.json keeps
    them and the verdict by the rule of the module docstring (:func:`claim_verdict` against the null,
    :func:`comparison_verdict` against a rival). A check without a record on some seed is "not measured"."""
    parts = {"text": list(text), "mllm": list(mllm)}
    out = []
    for paper, claim, testbed, criterion, rival, metric in CLAIM_CHECKS:
        records = [r for table in parts[testbed] for r in _seed_records(table, criterion, rival, metric, ratio)]
        seeds = [dict(r) for r in records if r is not None]
        complete = bool(records) and len(seeds) == len(records)
        verdict = MISSING if not complete else claim_verdict(seeds) if rival is None else comparison_verdict(seeds)
        out.append({"paper": paper, "claim": claim, "testbed": testbed, "criterion": criterion, "rival": rival,
                    "metric": metric, "ratio": ratio, "verdict": verdict, "seeds": seeds})
    return out
