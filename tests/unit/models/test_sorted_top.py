"""sorted_topk against torch.topk (sorted) and against a brute-force sort with ties in ascending index."""

from __future__ import annotations

import pytest
import torch

from lightprune.models.sorted_top import sorted_topk, top_positions


def _brute_force(row: list[float], k: int) -> tuple[list[float], list[int]]:
    """The k largest of a row, descending, equal values in ascending index (Python's stable sort)."""
    order = sorted(range(len(row)), key=lambda i: -row[i])[:k]
    return [row[i] for i in order], order


@pytest.mark.parametrize("shape,k", [((64, 8, 32), 9), ((300, 36), 8), ((5, 256), 16), ((7, 3), 3), ((4, 1), 1)])
def test_distinct_values_equal_torch_topk(shape, k) -> None:
    values = torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 5
    got_values, got_index = sorted_topk(values, k)
    expected = torch.topk(values, k, dim=-1)
    assert torch.equal(got_values, expected.values) and torch.equal(got_index, expected.indices)


def test_ties_signs_and_infinities_follow_a_stable_sort() -> None:
    """Saturated scores (many equal), negative values of every magnitude, -inf and +inf, -0.0 beside +0.0."""
    gen = torch.Generator().manual_seed(1)
    values = torch.randn(40, 24, generator=gen)
    values[::2, ::3] = 1.0                                       # ties, some among the top k
    values[1::4, 5] = float("-inf")
    values[3::4, 7] = float("inf")
    values[5, :] = torch.tensor([-1e-30, -3e38, -2.5, -0.0, 0.0, 1e-45] * 4)
    values[6, :] = float("-inf")                                 # all equal
    got_values, got_index = sorted_topk(values, 10)
    for row in range(values.shape[0]):
        expected_values, expected_index = _brute_force(values[row].tolist(), 10)
        if row == 5:  # -0.0 == 0.0 for Python's sort; the keys put -0.0 just below +0.0
            assert got_index[row].tolist() == [5, 11, 17, 23, 4, 10, 16, 22, 3, 9]
            continue
        assert got_values[row].tolist() == expected_values, row
        assert got_index[row].tolist() == expected_index, row


def test_float64_is_torch_topk_and_bad_k_is_refused() -> None:
    values = torch.randn(6, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    got_values, got_index = sorted_topk(values, 4)
    expected = torch.topk(values, 4, dim=-1)
    assert got_values.dtype == torch.float64
    assert torch.equal(got_values, expected.values) and torch.equal(got_index, expected.indices)
    with pytest.raises(ValueError, match="k=11 of rows of 10"):
        top_positions(values.float(), 11)
