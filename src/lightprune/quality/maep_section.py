"""The results page's MAEP section: the closed-form alpha on every multimodal testbed seed, with the bootstrap
intervals of a, b and alpha over the calibration samples (`lightprune.quality.alpha_interval`), and the
pre-registered rules for the MAEP rows ("Modality-Aware Expert Pruning for MoE-Based Multimodal Large Language
Models", arXiv 2611.05927, sections 5.3 and 6.3.3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["maep_section", "maep_seed_record"]


def maep_seed_record(table: Mapping[str, Any]) -> dict[str, Any]:
    """What the page's MAEP section shows of one multimodal testbed seed: the closed-form alpha, the alpha the
    ``maep_global`` row used (clamped to [0, 1]) and the bootstrap intervals of a, b and alpha."""
    return {"testbed_seed": (table.get("testbed") or {}).get("seed"), "alpha": table.get("maep_alpha"),
            "clamped": table.get("maep_alpha_clamped"), "report": table.get("maep_alpha_report"),
            "interval": table.get("maep_alpha_interval")}


def _ci(value: float | None, interval: Sequence[float | None] | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if not interval or interval[0] is None:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def maep_section(seeds: Sequence[Mapping[str, Any]]) -> list[str]:
    """MAEP's closed-form alpha on every multimodal testbed seed with its bootstrap interval, a and b per layer."""
    rows = ["| testbed seed | closed-form alpha [95% interval] | alpha of maep_global | a = rho(t,v) - rho(t,la) | "
            "b = rho(v,la) | a excludes 0 | per layer: a, b |", "|---|---|---|---|---|---|---|"]
    for seed in seeds:
        interval = seed.get("interval") or {}
        report = seed.get("report") or {}
        alpha = interval.get("alpha", report.get("closed_form"))
        closed, clamped = report.get("closed_form"), seed.get("clamped")  # the same pass's closed form and clamp
        inside = closed is not None and 0.0 <= closed <= 1.0
        used = "-" if clamped is None else f"{clamped:.3f}" + ("" if inside else " (clamped)")
        layers = "; ".join(f"{layer}: {_ci(v['a'], v['a_ci'], 2)}, {_ci(v['b'], v['b_ci'], 2)}"
                           for layer, v in (interval.get("layers") or {}).items())
        rows.append(f"| {seed['testbed_seed']} | {_ci(alpha, interval.get('alpha_ci'))} | {used} | "
                    f"{_ci(interval.get('a', report.get('a')), interval.get('a_ci'))} | "
                    f"{_ci(interval.get('b', report.get('b')), interval.get('b_ci'))} | "
                    f"{'yes' if interval.get('a_excludes_zero') else 'no'} | {layers or '-'} |")
    samples = next((s["interval"]["samples"] for s in seeds if s.get("interval")), None)
    return ["## MAEP's alpha over testbed seeds", "",
            "The closed form alpha = a / (a + b) of \"Modality-Aware Expert Pruning for MoE-Based Multimodal Large "
            "Language Models\" (arXiv 2611.05927, section 5.3) on each multimodal testbed seed, with 95% percentile "
            f"bootstrap intervals over the {samples or 'N'} calibration samples (lightprune.quality.alpha_interval). "
            "Rules fixed before measuring: the `maep_global` row uses the closed form clamped to [0, 1] (at alpha = "
            "0 it is text Delta-H ranked globally, the `delta_h_text_global` row); rows at the paper's fixed alphas "
            "0.1, 0.3 and 0.8 (its Table 3) on every seed; REAP ranked globally (`reap_global`) beside them, so "
            "that a win over REAP is credited to the allocation or to the modality term; the closed-form claims are "
            "judged only where a's interval excludes 0 on every seed.", "", *rows, ""]
