"""The claims' verdict rules on hand-made results (the page's own numbers are checked in test_quality_tables)."""

from __future__ import annotations

from lightprune.quality.claims import paper_claims


def _spread(values):
    return {"mean": sum(values) / len(values), "std": None, "min": min(values), "max": max(values)}


def _mwop(taylor_atr, interval, randoms, recovered=None):
    rows = [{"operating_point": "P", "method": "taylor", "atr": taylor_atr, "atr_interval": interval,
             "answer_ppl_atr": None},
            {"operating_point": "P", "method": "random", "atr": _spread(randoms), "answer_ppl_atr": _spread([1.0])}]
    out = {"rows": rows}
    if recovered is not None:
        t_atr, t_ci, r_atrs = recovered
        out["recovery"] = {"rows": [{"operating_point": "P", "method": "taylor", "atr": t_atr, "atr_interval": t_ci,
                                     "answer_ppl_atr": None}]
                           + [{"operating_point": "P", "method": "random", "seed": i, "atr": a, "answer_ppl_atr": None}
                              for i, a in enumerate(r_atrs)]}
    return out


def _verdict(mwop):
    return next(c for c in paper_claims(mwop=mwop) if c["paper"] == "MWOP (002)")


def test_mwop_verdicts_follow_the_stated_rule():
    assert _verdict(_mwop(90.0, [85.0, 95.0], [70.0, 80.0]))["verdict"] == "held"      # above best, low > mean
    assert _verdict(_mwop(90.0, [70.0, 95.0], [70.0, 80.0]))["verdict"] == "within noise"  # low under the mean
    assert _verdict(_mwop(78.0, [70.0, 85.0], [70.0, 80.0]))["verdict"] == "within noise"  # under the best seed
    assert _verdict(_mwop(60.0, [55.0, 65.0], [70.0, 80.0]))["verdict"] == "did not hold"
    assert _verdict(None)["verdict"] == "not measured"


def test_mwop_is_judged_after_recovery_when_it_was_measured():
    claim = _verdict(_mwop(60.0, [55.0, 65.0], [70.0, 80.0], recovered=(95.0, [92.0, 97.0], [80.0, 85.0, 90.0])))
    assert claim["verdict"] == "held" and claim["figures"].endswith("(after recovery)")
    claim = _verdict(_mwop(90.0, [85.0, 95.0], [70.0, 80.0], recovered=(80.0, [75.0, 85.0], [80.0, 85.0, 90.0])))
    assert claim["verdict"] == "did not hold"
