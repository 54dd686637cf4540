"""MAEP combination: text-side and low-attention-vision Delta-H into one importance (MAEP ("Modality-Aware Expert
Pruning for MoE-Based Multimodal Large Language Models", arXiv 2611.05927), section 5.3).

Per layer l and token subset, z~(l, j) = (log(dH(l, j) + 1e-8) - mu_l) / sigma_l (mean and the
population standard deviation over the layer's experts; `lightprune.experts.select.log_zscore`),
and the importance is Eq. 4 of the paper::

    s(l, j) = (1 - alpha) z~_text(l, j) - alpha z~_la(l, j)     (higher = keep; lowest pruned first)

Text Delta-H is a preservation signal, low-attention vision Delta-H (``vision_low_attn``) a pruning
signal, hence the minus sign. The modality balance alpha comes from a closed form on the same
statistics::

    alpha = a / (a + b),  a = rho(t, v) - rho(t, la),  b = rho(v, la)

where rho(x, y) = (1 / L) sum_l rho_l(dH_x^(l), dH_y^(l)) is the Spearman correlation between the
raw Delta-H of two subsets over one layer's experts, averaged over the MoE layers (t = ``text``,
v = ``vision``, la = ``vision_low_attn``). The paper notes a, b > 0 on its models, keeping alpha in
[0, 1]; a closed-form alpha outside [0, 1], undefined (a + b = 0) or NaN is an error here
(lightprune's rule: the paper does not say) and the caller must pass alpha explicitly. A given alpha
skips that check but must itself lie in [0, 1].

Rules where the paper is silent:

- Spearman ties take average ranks (float64). A constant vector has no ranking, so
  `spearman` returns NaN (as ``scipy.stats.spearmanr`` does); a layer where any of the three
  rhos is NaN is left out of all three layer means and listed in ``AlphaReport.skipped_layers``
  (with a warning); if every layer is left out, alpha is undefined (error unless given).
- A layer whose log(Delta-H + 1e-8) on a subset is constant (sigma_l = 0, e.g. all zeros) gets
  z~ = 0 for every expert on that subset (the rule of ``log_zscore``, tested here on exact
  equality of the logs, since their float std need not be exactly 0): that subset then carries no
  information in that layer and s comes from the other term alone; no NaN arises.
- a <= 0 with b < 0 gives an alpha inside [0, 1] that the paper's reading (a, b > 0) does not
  cover; it is accepted, as the [0, 1] rule above allows, with a warning.

Allocation ([`maep_plan`][]): the paper ranks all (l, j) by s globally and prunes the lowest
floor(r x N_total), here subject to each layer's floor (top-k, groups) as ``select_experts`` does.
For a uniform per-layer quota the paper re-tunes alpha to 0.5 (Appendix L: the closed form is
weighted for the global operating point, and alpha >= 0.7 is unstable under a uniform quota); pass
``alpha=0.5`` for that variant. The paper rounds its closed-form values (0.75 -> 0.8, 0.33 -> 0.3,
0.08 -> 0.1) "for simplicity"; the closed form here is not rounded.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from lightprune.core.checks import check_interval
from lightprune.core.errors import listed
from lightprune.experts.plan import ExpertPlan
from lightprune.experts.ranking import spearman
from lightprune.experts.scores import ExpertScores
from lightprune.experts.select import log_zscore, select_experts

__all__ = ["AlphaReport", "maep_alpha", "maep_scores", "maep_plan"]



# ---------------------------------------------------------------------------- alpha
def _num(x: float | None) -> float | None:
    """JSON-safe float: NaN / inf / None -> None."""
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass
class AlphaReport:
    """How alpha was obtained: the layer-averaged Spearman rhos, a, b and the closed form.

    ``alpha`` is the value used. ``source`` is ``"closed_form"`` (computed) or ``"given"`` (passed
    by the caller; then ``closed_form`` still holds a / (a + b) where the vision statistics exist).
    ``rho_tv`` / ``rho_tla`` / ``rho_vla`` are per layer; ``mean_rho_*`` their means over
    ``layers_used``. Values that could not be computed are NaN (``None`` in [`to_dict`][]).
    """

    alpha: float
    a: float = math.nan
    b: float = math.nan
    closed_form: float = math.nan
    source: str = "closed_form"
    mean_rho_tv: float = math.nan
    mean_rho_tla: float = math.nan
    mean_rho_vla: float = math.nan
    rho_tv: dict[int, float] = field(default_factory=dict)
    rho_tla: dict[int, float] = field(default_factory=dict)
    rho_vla: dict[int, float] = field(default_factory=dict)
    layers_used: list[int] = field(default_factory=list)
    skipped_layers: list[int] = field(default_factory=list)
    criterion: str = "delta_h"
    subsets: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (string layer keys, NaN as null) for report.json."""
        def per_layer(d: Mapping[int, float]) -> dict[str, float | None]:
            return {str(k): _num(v) for k, v in sorted(d.items())}
        return {
            "alpha": _num(self.alpha), "source": self.source, "a": _num(self.a), "b": _num(self.b),
            "closed_form": _num(self.closed_form),
            "mean_rho_tv": _num(self.mean_rho_tv), "mean_rho_tla": _num(self.mean_rho_tla),
            "mean_rho_vla": _num(self.mean_rho_vla),
            "rho_tv": per_layer(self.rho_tv), "rho_tla": per_layer(self.rho_tla),
            "rho_vla": per_layer(self.rho_vla),
            "layers_used": list(self.layers_used), "skipped_layers": list(self.skipped_layers),
            "criterion": self.criterion, "subsets": dict(self.subsets),
        }


def _raw(stats, criterion: str, subset: str, hint: str = "") -> dict[int, torch.Tensor]:
    try:
        values = stats.raw(criterion, subset)
    except KeyError as err:
        raise KeyError(f"MAEP needs {criterion!r} on subset {subset!r}: {err.args[0] if err.args else err}"
                       + hint) from None
    out: dict[int, torch.Tensor] = {}
    for layer, v in values.items():
        v = torch.as_tensor(v).detach().cpu().double()
        if not torch.isfinite(v).all():
            bad = [e for e, x in enumerate(v.tolist()) if not math.isfinite(x)]
            raise ValueError(f"{criterion} on {subset!r}, layer {layer}: non-finite values for experts {listed(bad)}")
        if (v < 0).any():
            raise ValueError(f"{criterion} on {subset!r}, layer {layer}: negative values "
                             f"(min {float(v.min()):.4g}); Delta-H is a squared norm and cannot be negative")
        out[int(layer)] = v
    return out


def _check_layers(named: Mapping[str, Mapping[int, torch.Tensor]]) -> list[int]:
    """The common layer list of several subsets; a mismatch in layers or expert counts is an error."""
    items = list(named.items())
    first_name, first = items[0]
    for name, other in items[1:]:
        if set(other) != set(first):
            raise ValueError(f"subsets {first_name!r} and {name!r} cover different layers: "
                             f"{listed(sorted(first))} vs {listed(sorted(other))}")
        for layer in first:
            if other[layer].numel() != first[layer].numel():
                raise ValueError(f"layer {layer}: {first_name!r} has {first[layer].numel()} experts, "
                                 f"{name!r} has {other[layer].numel()}")
    if not first:
        raise ValueError("no layers to score (empty statistics)")
    return sorted(first)


def _check_given(alpha: Any) -> float:
    return check_interval("alpha", alpha, 0, 1)  # a number (not a string or a bool), NaN refused


def maep_alpha(stats, *, criterion: str = "delta_h", text_subset: str = "text",
               low_subset: str = "vision_low_attn", vision_subset: str = "vision",
               check: bool = True) -> AlphaReport:
    """Closed-form alpha = a / (a + b) from ``stats`` (MAEP section 5.3, Appendix F Table 8).

    With ``check`` (the default) a closed form outside [0, 1], undefined (a + b = 0, no usable
    layer) or NaN raises ValueError naming a, b and the value; ``check=False`` returns the report
    as it is (``alpha`` may then be NaN or outside [0, 1]).
    """
    hint = "; pass alpha explicitly to skip the closed form"
    t = _raw(stats, criterion, text_subset, hint)
    v = _raw(stats, criterion, vision_subset, hint)
    la = _raw(stats, criterion, low_subset, hint)
    layers = _check_layers({text_subset: t, vision_subset: v, low_subset: la})
    rho_tv = {l: spearman(t[l], v[l]) for l in layers}
    rho_tla = {l: spearman(t[l], la[l]) for l in layers}
    rho_vla = {l: spearman(v[l], la[l]) for l in layers}
    used = [l for l in layers if not any(math.isnan(r[l]) for r in (rho_tv, rho_tla, rho_vla))]
    skipped = [l for l in layers if l not in used]
    if skipped:
        warnings.warn(f"MAEP alpha: layers {listed(skipped)} have a constant {criterion} on one of the subsets "
                      f"({text_subset}, {vision_subset}, {low_subset}), so Spearman rho is undefined there; "
                      "they are left out of the layer means", stacklevel=2)

    def mean(d: Mapping[int, float]) -> float:
        return math.fsum(d[l] for l in used) / len(used) if used else math.nan

    m_tv, m_tla, m_vla = mean(rho_tv), mean(rho_tla), mean(rho_vla)
    a = m_tv - m_tla
    b = m_vla
    closed = a / (a + b) if (a + b) != 0 and not math.isnan(a + b) else math.nan
    report = AlphaReport(alpha=closed, a=a, b=b, closed_form=closed, source="closed_form",
                         mean_rho_tv=m_tv, mean_rho_tla=m_tla, mean_rho_vla=m_vla,
                         rho_tv=rho_tv, rho_tla=rho_tla, rho_vla=rho_vla, layers_used=used,
                         skipped_layers=skipped, criterion=criterion,
                         subsets={"text": text_subset, "vision": vision_subset, "low": low_subset})
    if check:
        rhos = f"mean rho(t,v) = {m_tv:.4g}, rho(t,la) = {m_tla:.4g}, rho(v,la) = {m_vla:.4g}"
        fix = "; pass alpha explicitly, e.g. maep_scores(stats, alpha=0.5)"
        if not used:
            raise ValueError(f"MAEP alpha is undefined: Spearman rho is undefined in every layer "
                             f"(constant {criterion} on a subset){fix}")
        if a + b == 0:
            raise ValueError(f"MAEP alpha = a / (a + b) is undefined: a + b = 0 with a = rho(t,v) - rho(t,la) "
                             f"= {a:.4g}, b = rho(v,la) = {b:.4g} ({rhos}){fix}")
        if math.isnan(closed) or not 0.0 <= closed <= 1.0:
            raise ValueError(f"closed-form MAEP alpha = a / (a + b) = {closed:.4g} is outside [0, 1] "
                             f"(a = rho(t,v) - rho(t,la) = {a:.4g}, b = rho(v,la) = {b:.4g}; {rhos}){fix}")
        if a < 0 or b < 0:
            warnings.warn(f"MAEP alpha = {closed:.4g} lies in [0, 1] but a = {a:.4g}, b = {b:.4g} are not both "
                          "non-negative, which the paper's reading of the closed form assumes; consider "
                          "passing alpha explicitly", stacklevel=2)
    return report


# ---------------------------------------------------------------------------- combination
def maep_scores(stats, alpha: float | None = None, *, criterion: str = "delta_h", text_subset: str = "text",
                low_subset: str = "vision_low_attn",
                vision_subset: str = "vision") -> tuple[ExpertScores, float]:
    """MAEP importance s = (1 - alpha) z~_text - alpha z~_low per (layer, expert), and the alpha used.

    ``stats`` is a [`CalibrationStats`][...calibration.result.CalibrationStats] (anything with
    ``raw(name, subset)`` and ``limits``). ``alpha=None`` takes the closed form of
    [`maep_alpha`][] (ValueError when it is outside [0, 1] or undefined); a given alpha must lie
    in [0, 1] and bypasses that check. The returned [`ExpertScores`][] has ``criterion="maep"``,
    ``raw`` = s, the stats' ``limits`` and an ``alpha_report`` ([`AlphaReport`][]) attribute.
    Select with ``select_experts(imp, ratio, allocation="global")`` (no normalisation: s is
    already z-scored per layer).
    """
    if alpha is None:
        report = maep_alpha(stats, criterion=criterion, text_subset=text_subset, low_subset=low_subset,
                            vision_subset=vision_subset, check=True)
        value = report.alpha
    else:
        value = _check_given(alpha)
        report = None
        if stats.has(criterion, vision_subset):  # rhos for the report only; never an error here
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    report = maep_alpha(stats, criterion=criterion, text_subset=text_subset,
                                        low_subset=low_subset, vision_subset=vision_subset, check=False)
                except (KeyError, ValueError):
                    report = None
        if report is None:
            report = AlphaReport(alpha=value, criterion=criterion,
                                 subsets={"text": text_subset, "vision": vision_subset, "low": low_subset})
        report.alpha = value
        report.source = "given"

    t = _raw(stats, criterion, text_subset)
    la = _raw(stats, criterion, low_subset)
    layers = _check_layers({text_subset: t, low_subset: la})
    s = {l: (1.0 - value) * log_zscore(t[l]) - value * log_zscore(la[l]) for l in layers}
    scores = ExpertScores(s, stats.limits, criterion="maep", raw=s)
    scores.alpha_report = report
    return scores, value


def maep_plan(stats, ratio: float, allocation: str = "global", alpha: float | None = None,
              **subsets: str) -> ExpertPlan:
    """MAEP scores then ``select_experts(imp, ratio, allocation)``; plan.metadata records alpha, a, b.

    ``subsets`` passes ``criterion`` / ``text_subset`` / ``low_subset`` / ``vision_subset`` on to
    [`maep_scores`][]. The paper's operating point is ``allocation="global"``; for ``"uniform"``
    it re-tunes alpha to 0.5 (Appendix L), so a uniform plan with ``alpha=None`` warns.
    """
    if allocation == "uniform" and alpha is None:
        warnings.warn("MAEP's closed-form alpha is tuned for global allocation; the paper uses alpha = 0.5 "
                      "for a uniform per-layer quota (Appendix L): pass alpha=0.5 for that variant",
                      stacklevel=2)
    imp, value = maep_scores(stats, alpha, **subsets)
    plan = select_experts(imp, ratio, allocation=allocation)
    report: AlphaReport = imp.alpha_report
    plan.criterion = "maep"
    plan.metadata.update({"alpha": value, "alpha_source": report.source, "alpha_a": _num(report.a),
                          "alpha_b": _num(report.b), "alpha_closed_form": _num(report.closed_form)})
    return plan
