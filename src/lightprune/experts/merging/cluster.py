"""HC-SMoE's clustering: agglomerative average-linkage (UPGMA) clustering of a layer's experts.

Chen et al., "Retraining-Free Merging of Sparse MoE via Hierarchical Clustering" (ICML 2025), section 3: each
expert is represented by its mean output on the calibration tokens, experts are compared by Euclidean distance,
and the closest pair of clusters is merged until a fixed number of clusters per layer remains, with the average
linkage

    d(A, B) = 1 / (|A| |B|) * sum_{a in A, b in B} d(a, b),

kept up to date after each merge by the Lance-Williams update

    d(A u B, C) = (|A| d(A, C) + |B| d(B, C)) / (|A| + |B|)

in float64, O(E^2) per merge. Ties between equal minimal distances go to the pair of clusters with the
lexicographically smallest (smallest id of the first cluster, smallest id of the second cluster), the first
cluster being the one with the smaller smallest id: a deterministic, input-order-only rule.
"""

from __future__ import annotations

import torch

from lightprune.core.jsonio import strict_int

__all__ = ["average_linkage", "pairwise_euclidean"]


def pairwise_euclidean(x: torch.Tensor) -> torch.Tensor:
    """Euclidean distances ``[E, E]`` (float64) between the rows of ``x`` ``[E, D]``.

    Computed from the row differences, so the matrix is exactly symmetric with an exactly zero diagonal."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"pairwise_euclidean expects a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"pairwise_euclidean expects a 2-D tensor [E, D], got shape {tuple(x.shape)}")
    if x.is_complex():
        raise ValueError(f"pairwise_euclidean expects real values, got dtype {x.dtype}")
    rows = x.detach().to(torch.float64)
    if not bool(torch.isfinite(rows).all()):
        bad = torch.nonzero(~torch.isfinite(rows))[0].tolist()
        raise ValueError(f"pairwise_euclidean got a non-finite value {rows[bad[0], bad[1]].item()} at {tuple(bad)}")
    out = torch.empty(rows.shape[0], rows.shape[0], dtype=torch.float64, device=rows.device)
    for i in range(rows.shape[0]):  # one row of differences at a time: O(E D) memory instead of O(E^2 D)
        out[i] = torch.linalg.vector_norm(rows - rows[i], dim=1)
    # x_j - x_i is exactly -(x_i - x_j), but a norm kernel may reduce two rows in different orders: one value for both
    return torch.minimum(out, out.T)


def _check_distance(distance: torch.Tensor) -> torch.Tensor:
    """``distance`` as float64 on the CPU after checking it is a valid distance matrix; exactly symmetric."""
    if not isinstance(distance, torch.Tensor):
        raise TypeError(f"average_linkage expects the distances as a torch.Tensor, got {type(distance).__name__}")
    if distance.dim() != 2 or distance.shape[0] != distance.shape[1]:
        raise ValueError(f"average_linkage expects a square [E, E] distance matrix, got shape {tuple(distance.shape)}")
    if distance.is_complex():
        raise ValueError(f"average_linkage expects real distances, got dtype {distance.dtype}")
    d = distance.detach().to(device="cpu", dtype=torch.float64)
    finite = torch.isfinite(d)
    if not bool(finite.all()):
        i, j = torch.nonzero(~finite)[0].tolist()
        raise ValueError(f"average_linkage got a non-finite distance {d[i, j].item()} at ({i}, {j})")
    if bool((d < 0).any()):
        i, j = torch.nonzero(d < 0)[0].tolist()
        raise ValueError(f"average_linkage got a negative distance {d[i, j].item()} at ({i}, {j})")
    diagonal = torch.diagonal(d)
    if bool((diagonal != 0).any()):
        i = int(torch.nonzero(diagonal != 0)[0])
        raise ValueError(f"average_linkage needs a zero diagonal, got distance[{i}, {i}] = {diagonal[i].item()}")
    if not torch.allclose(d, d.T):
        gap = (d - d.T).abs()
        i, j = divmod(int(torch.argmax(gap)), d.shape[0])
        raise ValueError(f"average_linkage needs a symmetric distance matrix, got distance[{i}, {j}] = "
                         f"{d[i, j].item()} but distance[{j}, {i}] = {d[j, i].item()}")
    return (d + d.T) / 2  # symmetric up to rounding (allclose): both triangles agree exactly from here on


def average_linkage(distance: torch.Tensor, n_clusters: int) -> list[list[int]]:
    """Cluster ``E`` items into ``n_clusters`` groups by average linkage on the symmetric ``distance [E, E]``.

    Returns the clusters as sorted lists of ids, ordered by each cluster's smallest id. A matrix symmetric up to
    rounding (``torch.allclose`` with its transpose) is averaged with its transpose first."""
    d = _check_distance(distance)
    count = d.shape[0]
    if strict_int(n_clusters) is None:  # a Python or NumPy int, never a bool or a float
        raise TypeError(f"n_clusters must be an int, got {n_clusters!r} ({type(n_clusters).__name__})")
    n_clusters = strict_int(n_clusters)
    if not 1 <= n_clusters <= count:
        raise ValueError(f"n_clusters must be between 1 and the number of experts {count}, got {n_clusters}")

    # Every cluster lives in the slot of its smallest id: merging the clusters in slots a < b keeps slot a.
    # ``work`` holds the linkage between live slots above the diagonal, +inf everywhere else, so the first
    # minimum in row-major order is the tie rule's pair.
    inf = float("inf")
    upper = torch.ones(count, count, dtype=torch.bool).triu(1)
    work = d.masked_fill(~upper, inf)
    members: dict[int, list[int]] = {i: [i] for i in range(count)}
    for _ in range(count - n_clusters):
        a, b = divmod(int(torch.argmin(work)), count)  # argmin returns the first minimum: smallest (a, b)
        na, nb = len(members[a]), len(members[b])
        # both triangles of ``d`` stay in step, so its row a/b read the linkage to every other live slot
        merged = (na * d[a] + nb * d[b]) / (na + nb)
        d[a], d[:, a] = merged, merged
        d[a, a] = 0.0
        alive = torch.zeros(count, dtype=torch.bool)
        alive[list(members)] = True
        alive[b] = False
        row = merged.masked_fill(~(alive & upper[a]), inf)
        col = merged.masked_fill(~(alive & upper[:, a]), inf)
        work[a], work[:, a] = row, col
        work[b], work[:, b] = inf, inf
        members[a] = sorted(members[a] + members.pop(b))
    return [members[slot] for slot in sorted(members)]
