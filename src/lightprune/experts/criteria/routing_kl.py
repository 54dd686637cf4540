"""Routing KL: how far removing an expert moves each token's routing distribution (MAEP ("Modality-Aware Expert
Pruning for MoE-Based Multimodal Large Language Models", arXiv 2611.05927), appendix I, Eq. 8).

For token t with the router's distribution p over all E experts (a softmax of the logits, or for a sigmoid router
the sigmoid scores normalised to sum to 1), ``routing_kl`` of expert j is the mean over the subset's tokens of
KL(p || p^(-j)), p^(-j) the distribution with p_j zeroed and renormalised, both sides Laplace-smoothed by
eps = 1e-12 (`routing_kl`). Computed in O(T E) per batch, in the compute dtype, added to float64 sums [U, E];
the value is divided by the subset's token count when read. Higher is kept (importance = the value).
"""

from __future__ import annotations

import torch

from lightprune.experts.criteria.from_data import CalibrationCriterion
from lightprune.experts.criteria.registry import register_criterion
from lightprune.experts.criteria.statistic import Statistic, SubsetCounts, compute_dtype
from lightprune.models import MoELayer

__all__ = ["RoutingKLSums", "STATISTIC", "RoutingKl", "KL_EPS", "router_distribution", "routing_kl"]

KL_EPS = 1e-12


def router_distribution(layer: MoELayer, logits: torch.Tensor) -> torch.Tensor:
    """The router's distribution p over all experts [T, E] (float32 or wider): softmax of the logits, or for a
    sigmoid router (DeepSeek-V3) the sigmoid scores normalised to sum to 1."""
    logits = logits.to(compute_dtype(logits))
    if getattr(layer.family, "score_function", "softmax") == "sigmoid":
        scores = logits.sigmoid()
        return scores / scores.sum(dim=-1, keepdim=True)
    return torch.softmax(logits, dim=-1)


def routing_kl(p: torch.Tensor, eps: float = KL_EPS) -> torch.Tensor:
    """KL(p || p^(-j)) for every j [T, E] (p's dtype): p^(-j) zeroes p_j and renormalises; both sides get Laplace
    smoothing (add eps, renormalise by z = 1 + E eps), as MAEP eq. (8) does. O(T E), no cancellation.

    With ps = (p + eps) / z and r_j = 1 - p_j, the pairs i != j contribute
    ps_i log((p_i + eps) r_j / (p_i + eps r_j)) = ps_i (log r_j + log1p(x_ij)), x_ij = eps p_j / (p_i + eps r_j), so

        KL_j = ps_j log1p(p_j / eps) + (1 - ps_j) log r_j + R_j,   1 - ps_j = (r_j + (E - 1) eps) / z,

    and R_j = sum_{i != j} ps_i log1p(x_ij) is taken to first order with p_i + eps r_j ~ p_i + eps, where
    ps_i / (p_i + eps) = 1 / z: R_j ~ eps p_j (E - 1) / z. What that leaves out is below E eps (1 + |log r_j|)
    in absolute terms (about 1e-8 for 256 experts), against KL_j ~ p_j log(p_j / eps). r_j of the most probable
    expert is the sum of the others (exact where 1 - p_j rounds to 0), the others' log r_j is log1p(-p_j).
    """
    num = p.shape[-1]
    top = p.max(dim=-1, keepdim=True).indices
    rest_top = p.scatter(-1, top, 0.0).sum(dim=-1, keepdim=True).clamp_min_(torch.finfo(p.dtype).tiny)
    # z KL_j = (p_j + eps) log1p(p_j / eps) + (r_j + (E - 1) eps) log r_j + eps (E - 1) p_j, in place past the
    # first buffer of each factor (a fresh [T, E] buffer costs its page faults on a CPU)
    kl = torch.mul(p, 1.0 / eps).log1p_().mul_(p + eps)
    log_rest = torch.neg(p).log1p_().scatter_(-1, top, rest_top.log())
    weight = torch.sub(1.0 + (num - 1) * eps, p).scatter_(-1, top, rest_top + (num - 1) * eps)
    kl.addcmul_(weight, log_rest)
    return kl.add_(p, alpha=eps * (num - 1)).mul_(1.0 / (1.0 + num * eps))


class RoutingKLSums(Statistic):
    """sum over each subset's tokens of KL(p || p^(-j)) per expert; the value is the mean over those tokens."""

    values = ("routing_kl",)

    def __init__(self, layer: MoELayer, subsets: tuple[str, ...], wanted: tuple[str, ...],
                 counts: SubsetCounts | None = None):
        super().__init__(layer, subsets, wanted, counts)
        self.sums = {"routing_kl": self.zeros(len(subsets), layer.num_experts)}

    @property
    def needs(self) -> frozenset[str]:
        return frozenset({"logits"})

    def update(self, batch) -> None:
        kl = routing_kl(router_distribution(batch.layer, batch.logits))[:, :self.num_experts].to(batch.dtype)
        self.sums["routing_kl"] += (batch.m @ kl).double()

    def value(self, name: str, subset: int | None) -> torch.Tensor:
        return self.sums["routing_kl"][subset] / self.counts.tokens(subset).clamp_min(1)


#: what the observed pass accumulates for this criterion
STATISTIC = RoutingKLSums


@register_criterion("routing_kl")
class RoutingKl(CalibrationCriterion):
    """Routing KL (MAEP eq. 8): the mean over the subset's tokens of KL(p || p with j removed), eps 1e-12."""

    statistic = "routing_kl"
