"""The shared argument checks: each names the argument and the bad value."""

from __future__ import annotations

import math

import pytest

from lightprune.core.checks import check_atol, check_choice, check_positive_int, check_ratio


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, True, "0.5", None, math.nan])
def test_ratio_outside_zero_one_is_named(bad) -> None:
    with pytest.raises(ValueError, match=r"ratio must be in \[0, 1\), got"):
        check_ratio(bad)


def test_ratio_inside_is_a_float() -> None:
    assert check_ratio(0) == 0.0 and isinstance(check_ratio(0), float) and check_ratio(0.25, "x") == 0.25


@pytest.mark.parametrize("bad", [0, -1e-3, math.nan, math.inf, True, "1e-5"])
def test_atol_must_be_positive_and_finite(bad) -> None:
    # NaN would turn verification off (every comparison with NaN is False): refused like the rest
    with pytest.raises(ValueError, match="atol must be positive, got"):
        check_atol(bad)


def test_atol_none_is_the_dtype_default() -> None:
    assert check_atol(None) is None and check_atol(1e-4) == 1e-4


def test_choice_and_positive_int() -> None:
    assert check_choice("allocation", "global", ("uniform", "global")) == "global"
    with pytest.raises(ValueError, match=r"allocation must be one of \['uniform', 'global'\], got 'all'"):
        check_choice("allocation", "all", ("uniform", "global"))
    assert check_positive_int("align", 64.0) == 64 and check_positive_int("n", None, allow_none=True) is None
    for bad in (0, -2, 1.5, True, None):
        with pytest.raises(ValueError, match="align must be a positive integer"):
            check_positive_int("align", bad)
