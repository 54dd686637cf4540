"""A criterion's standing on one testbed against a null distribution of random plans (what each claim's verdict
reads, `lightprune.quality.claims.claim_verdict`).

On one testbed seed, the criterion's retention v against the retentions of N random plans of the same ratio: the
empirical p-value p = (1 + #{null >= v}) / (1 + N), the chance that a random plan keeps at least as much, counting
the criterion as one draw (a draw of the null then gets p <= a with probability <= a: Phipson & Smyth, "Permutation
p-values should never be zero", 2010), and the paired difference d = v - mean(null) with its bootstrap interval
over the evaluation rows (`lightprune.quality.intervals.paired_difference`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["empirical_p_value", "standing"]


def empirical_p_value(value: float, null: Sequence[float]) -> float:
    """(1 + #{x in null: x >= value}) / (1 + len(null)): the chance a null draw keeps at least ``value`` (higher =
    better), counting the value itself as one draw, so a draw of the null gets p <= a with probability <= a."""
    if not null:
        raise ValueError("empirical_p_value needs a non-empty null distribution")
    return (1 + sum(x >= value for x in null)) / (1 + len(null))


def standing(value: float, null: Sequence[float], paired_diff: float, paired_ci: Sequence[float],
             testbed_seed: int) -> dict[str, Any]:
    """One seed's record of a criterion against its null (the module docstring): ``{"testbed_seed", "null_size",
    "p_value", "p_value_below", "paired_diff", "paired_ci"}`` (``p_value_below``: the p-value the other way,
    (1 + #{null <= v}) / (1 + N), the chance a null draw keeps at most ``value``), what results.json keeps and
    `lightprune.quality.claims.claim_verdict` reads."""
    return {"testbed_seed": int(testbed_seed), "null_size": len(null), "p_value": empirical_p_value(value, null),
            "p_value_below": empirical_p_value(-value, [-x for x in null]),
            "paired_diff": float(paired_diff), "paired_ci": [float(paired_ci[0]), float(paired_ci[1])]}
