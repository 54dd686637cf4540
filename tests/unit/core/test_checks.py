"""The shared argument checks: each names the argument and the bad value."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lightprune.core.checks import (
    check_atol,
    check_choice,
    check_interval,
    check_non_negative_int,
    check_number,
    check_positive_int,
    check_ratio,
    integer,
    real_number,
)


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


# ----------------------------------------------------------------------------------- NumPy and torch numbers
@pytest.mark.parametrize("value, expected", [
    (np.float64(0.25), 0.25), (np.float32(0.25), 0.25), (np.float16(0.25), 0.25), (np.int64(3), 3), (np.uint8(3), 3),
    (np.array(0.25), 0.25), (np.array(3, dtype=np.int32), 3), (torch.tensor(0.25), 0.25),
    (torch.tensor(3), 3), (torch.tensor(0.25, dtype=torch.bfloat16), 0.25),
    # a float narrower than Python's is read as written, not as its widened binary value
    (np.float32(0.7), 0.7), (np.float16(0.7), 0.7), (torch.tensor(0.7), 0.7), (np.array(0.1, dtype=np.float32), 0.1),
    (torch.tensor(0.7, dtype=torch.bfloat16), 0.7), (np.float32(1 / 3), 0.33333334),
])
def test_numpy_and_torch_numbers_are_python_numbers(value, expected) -> None:
    got = real_number(value)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("value", [True, np.bool_(False), np.array(True), torch.tensor(True), "0.5", b"1", None,
                                   0.5 + 0j, np.complex64(0.5), np.array([0.5]), torch.tensor([0.5]),
                                   np.array("0.5"), [0.5]])
def test_bools_strings_complex_and_arrays_are_not_numbers(value) -> None:
    assert real_number(value) is None


def test_integers_are_integral_finite_numbers() -> None:
    assert [integer(v) for v in (np.int64(4), np.float32(4.0), torch.tensor(4), 4.0)] == [4, 4, 4, 4]
    assert [integer(v) for v in (np.float32(4.5), math.inf, math.nan, np.bool_(True), "4")] == [None] * 5


@pytest.mark.parametrize("ratio", [np.float32(0.5), np.float64(0.5), np.float16(0.5), np.array(0.5),
                                   torch.tensor(0.5), torch.tensor(0.5, dtype=torch.float64)])
def test_ratio_takes_numpy_and_0d_tensor_floats(ratio) -> None:
    got = check_ratio(ratio)
    assert got == 0.5 and type(got) is float


@pytest.mark.parametrize("bad", [np.bool_(False), np.float32("nan"), np.float64(math.inf), torch.tensor(math.nan),
                                 torch.tensor(False), np.float32(1.0), np.array([0.5])])
def test_ratio_refuses_numpy_bools_and_non_finite_numbers(bad) -> None:
    with pytest.raises(ValueError, match=r"^ratio must be in \[0, 1\), got "):
        check_ratio(bad)


def test_integer_checks_take_numpy_ints_and_refuse_non_finite() -> None:
    assert check_positive_int("align", np.int64(64)) == 64 and type(check_positive_int("align", np.int32(8))) is int
    assert check_non_negative_int("n_per_layer", np.uint8(0)) == 0
    for bad in (math.inf, math.nan, np.bool_(True), np.float32(2.5), torch.tensor(True)):
        with pytest.raises(ValueError, match=r"^align must be a positive integer, got "):
            check_positive_int("align", bad)
        with pytest.raises(ValueError, match=r"^n must be a non-negative integer, got "):
            check_non_negative_int("n", bad)


def test_atol_interval_and_finite_number_take_numpy() -> None:
    assert check_atol(np.float32(1e-4)) == 1e-4 and check_atol(torch.tensor(0.5)) == 0.5
    with pytest.raises(ValueError, match=r"^atol must be positive, got np.float32\(inf\)$"):
        check_atol(np.float32(math.inf))
    assert check_interval("q", np.float32(0.5), 0, 0.5, "(]") == 0.5
    with pytest.raises(ValueError, match=r"^q must be in \(0, 0.5\], got 0$"):
        check_interval("q", 0, 0, 0.5, "(]")
    with pytest.raises(ValueError, match=r"^alpha must be in \[0, 1\], got np.True_$"):
        check_interval("alpha", np.bool_(True), 0, 1)
    assert check_number("x", np.int8(-3)) == -3.0
    with pytest.raises(ValueError, match=r"^x must be a finite number, got nan$"):
        check_number("x", math.nan)
