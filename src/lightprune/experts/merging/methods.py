"""HC-SMoE and M-SMoE: calibration statistics -> [`MergePlan`][].

HC-SMoE (Chen et al., "Retraining-Free Merging of Sparse MoE via Hierarchical Clustering", ICML 2025, section 3;
MAEP's appendix configuration: similarity on expert outputs, hierarchical clustering, average linkage, frequency
merge): per layer, the experts' mean outputs over every calibration token (each expert run on every token,
``expert_outputs``) are clustered by Euclidean distance with average linkage into the layer's kept count; each
cluster's coefficients are its members' routing frequencies (top-k counts), normalised. Under group-limited
routing (DeepSeek-V3 ``n_group``) each group is clustered apart into its share, so every group keeps the same count.

M-SMoE (Li et al., "Merge, then Compress", ICLR 2024, section 3): the most frequently routed experts are the
dominants (per layer, or ranked across layers); every other expert, in decreasing frequency, joins the dominant
whose router-logit column over the calibration tokens is most similar (cosine, from the ``router_logits`` Gram
matrix); members are aligned to the dominant by neuron permutation (``align``) and averaged by frequency.

Choices where the papers' code does otherwise (the authors keep every router row and let all members' slots
share the merged weights, so the checkpoint does not shrink): a merged layer here keeps one slot per cluster, the
dominant's, with its router row (``router="dominant"``) or the coefficient-weighted average of the members' rows
(``"average"``); HC-SMoE's dominant is its most frequent member (ties: the lowest id). A cluster whose members
were never routed gets equal coefficients (the papers' formula would give it an all-zero expert).
"""

from __future__ import annotations

from typing import Mapping

import torch

from lightprune.experts.merging.cluster import average_linkage, pairwise_euclidean
from lightprune.experts.merging.plan import ROUTER_RULES, MergePlan
from lightprune.experts.select import select_experts
from lightprune.models.layer import RoutingLimits

__all__ = ["hc_smoe_plan", "m_smoe_plan"]


def kept_counts(limits: Mapping[int, RoutingLimits], ratio: float) -> dict[int, int]:
    """Experts each layer keeps at ``ratio`` when every layer loses the same share (pruning's uniform count)."""
    dry = {layer: torch.zeros(lim.num_experts) for layer, lim in limits.items()}
    return select_experts(dry, ratio, "uniform", limits=limits).kept_counts()


def frequency_coefficients(frequency: torch.Tensor, members: list[int]) -> list[float]:
    """The members' routing frequencies normalised to sum to 1 (equal weights when none was routed)."""
    f = frequency.double()[members].clamp_min(0)
    total = float(f.sum())
    if total <= 0:
        return [1.0 / len(members)] * len(members)
    weights = (f / total).tolist()
    weights[-1] = 1.0 - sum(weights[:-1])  # exactly 1 in float64
    return weights


def _most_frequent(frequency: torch.Tensor, members: list[int]) -> int:
    return min(members, key=lambda e: (-float(frequency[e]), e))


def _check_router(router: str) -> str:
    if router not in ROUTER_RULES:
        raise ValueError(f"router must be one of {list(ROUTER_RULES)}, got {router!r}")
    return router


def hc_smoe_plan(stats, ratio: float, *, router: str = "dominant", subset: str = "all") -> MergePlan:
    """HC-SMoE's merge plan at ``ratio`` (the share of each layer's experts merged away) from ``stats``
    (collected with ``expert_outputs``; frequencies of ``subset``)."""
    _check_router(router)
    outputs = stats.merging_statistic("expert_outputs")
    frequency = stats.raw("frequency", subset)
    counts = kept_counts(stats.limits, ratio)
    clusters, dominant, coefficients = {}, {}, {}
    for layer in sorted(outputs):
        n_group = max(stats.limits[layer].n_group, 1)
        size = outputs[layer].shape[0] // n_group
        groups = []
        for g in range(n_group):  # group-limited routing: clusters within each group
            ids = list(range(g * size, (g + 1) * size))
            found = average_linkage(pairwise_euclidean(outputs[layer][ids]), counts[layer] // n_group)
            groups += [[ids[i] for i in cluster] for cluster in found]
        groups.sort(key=min)
        clusters[layer] = groups
        dominant[layer] = [_most_frequent(frequency[layer], g) for g in groups]
        coefficients[layer] = [frequency_coefficients(frequency[layer], g) for g in groups]
    return MergePlan(clusters=clusters, dominant=dominant, coefficients=coefficients,
                     num_experts={l: int(outputs[l].shape[0]) for l in outputs}, router=router, align=False,
                     method="hc_smoe", ratio=ratio,
                     metadata={"distance": "euclidean", "linkage": "average", "merge": "frequency", "subset": subset})


def router_cosine(gram: torch.Tensor) -> torch.Tensor:
    """Cosine similarity [E, E] of the experts' router-logit columns from their Gram matrix G = sum_t l_t l_t^T:
    G_ij / sqrt(G_ii G_jj) (0 where a column is all zero)."""
    norms = gram.diagonal().clamp_min(0).sqrt()
    denom = norms.unsqueeze(0) * norms.unsqueeze(1)
    return torch.where(denom > 0, gram / denom.clamp_min(torch.finfo(gram.dtype).tiny), torch.zeros_like(gram))


def m_smoe_plan(stats, ratio: float, *, allocation: str = "uniform", align: bool = True, router: str = "dominant",
                subset: str = "all") -> MergePlan:
    """M-SMoE's merge plan at ``ratio`` from ``stats`` (collected with ``router_logits``).

    ``allocation="uniform"``: every layer keeps the same count of dominants, its most frequent experts;
    ``"global"``: frequencies normalised per layer are ranked across layers (the paper's global grouping),
    under each layer's floor."""
    _check_router(router)
    if not isinstance(align, bool):
        raise ValueError(f"align must be true or false, got {align!r}")
    gram = stats.merging_statistic("router_logits")
    frequency = stats.raw("frequency", subset)
    normalised = {l: f / f.sum().clamp_min(1e-12) for l, f in frequency.items()}
    chosen = select_experts(normalised, ratio, allocation, limits=stats.limits, criterion="frequency").keep
    clusters, dominant, coefficients = {}, {}, {}
    for layer in sorted(gram):
        similarity = router_cosine(gram[layer])
        dominants = chosen[layer]
        members = {d: [d] for d in dominants}
        others = sorted(set(range(gram[layer].shape[0])) - set(dominants),
                        key=lambda e: (-float(frequency[layer][e]), e))
        for expert in others:
            best = max(dominants, key=lambda d: (float(similarity[expert, d]), -d))
            members[best].append(expert)
        groups = sorted((sorted(m) for m in members.values()), key=min)
        clusters[layer] = groups
        dominant[layer] = [next(d for d in dominants if d in g) for g in groups]
        coefficients[layer] = [frequency_coefficients(frequency[layer], g) for g in groups]
    return MergePlan(clusters=clusters, dominant=dominant, coefficients=coefficients,
                     num_experts={l: int(gram[l].shape[0]) for l in gram}, router=router, align=align,
                     method="m_smoe", ratio=ratio,
                     metadata={"similarity": "router_logits_cosine", "merge": "frequency", "allocation": allocation,
                               "subset": subset})
