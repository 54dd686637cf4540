"""HC-SMoE's average-linkage clustering against scipy, its tie rule and its validation."""

from __future__ import annotations

import re

import pytest
import torch
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import cdist, squareform

from lightprune.experts.merging.cluster import average_linkage, pairwise_euclidean


def _partition(clusters) -> set[frozenset[int]]:
    return {frozenset(int(i) for i in c) for c in clusters}


def _scipy_partition(distance: torch.Tensor, n_clusters: int) -> set[frozenset[int]]:
    tree = linkage(squareform(distance.numpy(), checks=False), method="average")
    labels = fcluster(tree, t=n_clusters, criterion="maxclust")
    groups: dict[int, set[int]] = {}
    for item, label in enumerate(labels.tolist()):
        groups.setdefault(label, set()).add(item)
    return {frozenset(g) for g in groups.values()}


def _points(count: int, seed: int, dim: int = 5) -> torch.Tensor:
    return torch.randn(count, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("count", [8, 16, 64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_average_linkage_matches_scipy(count, seed):
    distance = pairwise_euclidean(_points(count, seed))
    for n_clusters in sorted({1, 2, 3, count // 4, count // 2, count - 1, count}):
        ours = average_linkage(distance, n_clusters)
        expected = _scipy_partition(distance, n_clusters)
        assert len(expected) == n_clusters  # distinct merge heights: scipy's maxclust cut is exact
        assert _partition(ours) == expected, (count, seed, n_clusters)
        assert len(ours) == n_clusters
        assert all(c == sorted(c) for c in ours)
        assert [c[0] for c in ours] == sorted(c[0] for c in ours)
        assert sorted(i for c in ours for i in c) == list(range(count))


def test_average_linkage_matches_scipy_on_non_euclidean_dissimilarities():
    gen = torch.Generator().manual_seed(7)
    upper = torch.rand(20, 20, generator=gen, dtype=torch.float64).triu(1)
    distance = upper + upper.T
    for n_clusters in (1, 4, 9, 20):
        assert _partition(average_linkage(distance, n_clusters)) == _scipy_partition(distance, n_clusters)


def test_pairwise_euclidean_matches_cdist():
    points = _points(12, 3, dim=7).to(torch.float32)
    distance = pairwise_euclidean(points)
    assert distance.dtype == torch.float64 and distance.shape == (12, 12)
    expected = torch.from_numpy(cdist(points.double().numpy(), points.double().numpy()))
    torch.testing.assert_close(distance, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(distance, distance.T)
    assert torch.equal(torch.diagonal(distance), torch.zeros(12, dtype=torch.float64))


def test_pairwise_euclidean_validation():
    with pytest.raises(ValueError, match=re.escape("(2, 3, 4)")):
        pairwise_euclidean(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="inf"):
        pairwise_euclidean(torch.tensor([[0.0, 1.0], [float("inf"), 0.0]]))


def test_tie_rule_all_equal():
    # Four items at mutual distance 1: every pair ties. The rule picks the smallest (min id, min id) pair:
    # first {0} + {1}; then d({0,1}, 2) = d({0,1}, 3) = d(2, 3) = 1 all tie again and ({0,1}, {2}) wins.
    distance = torch.ones(4, 4, dtype=torch.float64) - torch.eye(4, dtype=torch.float64)
    assert average_linkage(distance, 4) == [[0], [1], [2], [3]]
    assert average_linkage(distance, 3) == [[0, 1], [2], [3]]
    assert average_linkage(distance, 2) == [[0, 1, 2], [3]]
    assert average_linkage(distance, 1) == [[0, 1, 2, 3]]


def test_tie_rule_by_smallest_member_ids():
    # Six items, every distance 4 except d(2, 5) = d(1, 4) = 1 and d(0, 3) = 2.
    # Merge 1: (1, 4) and (2, 5) tie at 1; (1, 4) has the smaller ids -> {1,4}, {2,5} next.
    # Merge 2: {2} + {5} at 1 -> [[0], [1,4], [2,5], [3]].
    # Merge 3: {0} + {3} at 2 (every cluster-cluster linkage else is 4) -> [[0,3], [1,4], [2,5]].
    # Merge 4: the three clusters are all at 4: the pair ({0,3}, {1,4}) has the smallest (0, 1) -> [[0,1,3,4], [2,5]].
    distance = torch.full((6, 6), 4.0, dtype=torch.float64)
    distance.fill_diagonal_(0.0)
    for i, j, value in ((2, 5, 1.0), (1, 4, 1.0), (0, 3, 2.0)):
        distance[i, j] = distance[j, i] = value
    assert average_linkage(distance, 5) == [[0], [1, 4], [2], [3], [5]]
    assert average_linkage(distance, 4) == [[0], [1, 4], [2, 5], [3]]
    assert average_linkage(distance, 3) == [[0, 3], [1, 4], [2, 5]]
    assert average_linkage(distance, 2) == [[0, 1, 3, 4], [2, 5]]


def test_average_linkage_single_item_and_float32_input():
    assert average_linkage(torch.zeros(1, 1), 1) == [[0]]
    distance = pairwise_euclidean(_points(10, 4)).to(torch.float32)
    assert _partition(average_linkage(distance, 3)) == _scipy_partition(distance.double(), 3)


def test_nearly_symmetric_matrix_is_accepted():
    distance = pairwise_euclidean(_points(8, 5))
    bumped = distance.clone()
    bumped[0, 1] += 1e-12
    assert average_linkage(bumped, 3) == average_linkage(distance, 3)


def test_average_linkage_validation():
    good = pairwise_euclidean(_points(4, 6))
    asymmetric = good.clone()
    asymmetric[0, 1] = 1.0
    asymmetric[1, 0] = 2.0
    with pytest.raises(ValueError, match=re.escape("distance[0, 1] = 1.0 but distance[1, 0] = 2.0")):
        average_linkage(asymmetric, 2)
    negative = good.clone()
    negative[2, 3] = negative[3, 2] = -0.5
    with pytest.raises(ValueError, match="negative distance -0.5 at"):
        average_linkage(negative, 2)
    nan = good.clone()
    nan[1, 2] = nan[2, 1] = float("nan")
    with pytest.raises(ValueError, match="non-finite distance nan at"):
        average_linkage(nan, 2)
    with pytest.raises(ValueError, match=re.escape("got shape (3, 4)")):
        average_linkage(torch.zeros(3, 4), 2)
    with pytest.raises(ValueError, match=re.escape("got shape (4,)")):
        average_linkage(torch.zeros(4), 2)
    diagonal = good.clone()
    diagonal[1, 1] = 0.25
    with pytest.raises(ValueError, match=re.escape("distance[1, 1] = 0.25")):
        average_linkage(diagonal, 2)
    with pytest.raises(ValueError, match="got 0"):
        average_linkage(good, 0)
    with pytest.raises(ValueError, match="got 5"):
        average_linkage(good, 5)
    with pytest.raises(TypeError, match="got True"):
        average_linkage(good, True)
    with pytest.raises(TypeError, match=re.escape("got 2.0")):
        average_linkage(good, 2.0)
    with pytest.raises(TypeError, match="list"):
        average_linkage(good.tolist(), 2)
