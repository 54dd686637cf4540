"""The shared argument checks: each names the argument and the bad value."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

from lightprune.core.checks import (
    check_atol,
    check_bool,
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
    with pytest.raises(ValueError, match=r"^alpha must be in \[0, 1\], got np.True_: a bool, not a number$"):
        check_interval("alpha", np.bool_(True), 0, 1)
    assert check_number("x", np.int8(-3)) == -3.0
    with pytest.raises(ValueError, match=r"^x must be a finite number, got nan$"):
        check_number("x", math.nan)


# ----------------------------------------------------------------------------------- ratios as counts, exactly
def _decimal_count(ratio: float, total: int, rounding: str) -> int:
    """The count the decimal ``ratio`` stands for, in decimal arithmetic (independent of the code under test)."""
    from decimal import Decimal

    return int((Decimal(repr(ratio)) * total).to_integral_value(rounding))


@pytest.mark.parametrize("total", [3, 7, 8, 50, 64, 100, 128, 150, 200, 1000])
def test_a_ratio_counts_as_the_decimal_written(total) -> None:
    from decimal import ROUND_CEILING, ROUND_FLOOR, ROUND_HALF_EVEN

    from lightprune.core.checks import ratio_count

    for hundredths in range(100):
        ratio = hundredths / 100
        assert ratio_count(ratio, total) == _decimal_count(ratio, total, ROUND_FLOOR), (ratio, total)
        assert ratio_count(ratio, total, math.ceil) == _decimal_count(ratio, total, ROUND_CEILING), (ratio, total)
        assert ratio_count(ratio, total, round) == _decimal_count(ratio, total, ROUND_HALF_EVEN), (ratio, total)


def test_the_counts_binary_floating_point_gets_wrong() -> None:
    from lightprune.core.checks import ratio_count

    assert math.floor(0.29 * 100) == 28 and ratio_count(0.29, 100) == 29
    assert math.floor(0.58 * 50) == 28 and ratio_count(0.58, 50) == 29
    assert math.floor(0.57 * 200) == 113 and ratio_count(0.57, 200) == 114
    assert math.ceil(0.07 * 100) == 8 and ratio_count(0.07, 100, math.ceil) == 7
    assert round(0.35 * 90) == 31 and ratio_count(0.35, 90, round) == 32  # 31.5: half to even


@pytest.mark.parametrize("ratio", [0.5, 0.25, 0.125, 0.375, 0.0625, 0.75, 0.875])
@pytest.mark.parametrize("total", [2, 8, 16, 64, 128, 256])
def test_power_of_two_ratios_count_as_before(ratio, total) -> None:
    from lightprune.core.checks import ratio_count

    assert ratio_count(ratio, total) == math.floor(ratio * total)  # exact in binary: nothing changes


def test_a_computed_fraction_counts_as_the_fraction() -> None:
    from fractions import Fraction

    from lightprune.core.checks import exact_ratio, ratio_count

    assert exact_ratio(1 / 3) == Fraction(1, 3) and exact_ratio(2 / 3) == Fraction(2, 3)
    assert ratio_count(1 / 3, 6) == 2 and ratio_count(2 / 3, 3) == 2 and ratio_count(Fraction(1, 3), 3) == 1
    assert exact_ratio(0.1 + 0.2) == Fraction("0.30000000000000004")  # no fraction of its float: the decimal
    assert exact_ratio(np.float32(0.29)) == Fraction(29, 100)  # read as written (real_number)


@pytest.mark.parametrize("value, got", [
    (Decimal("Infinity"), "Decimal('Infinity')"),
    (Decimal("-Infinity"), "Decimal('-Infinity')"),
    (Decimal("NaN"), "Decimal('NaN')"),
    (Decimal("sNaN"), "Decimal('sNaN'): a Decimal, not a number"),
    (float("inf"), "inf"),
    (float("nan"), "nan"),
])
def test_a_ratio_that_is_no_finite_number_is_said_as_such(value, got) -> None:
    """``Decimal('Infinity')`` raised OverflowError and ``Decimal('NaN')`` "cannot convert NaN to integer ratio"
    (Fraction's words): every non-finite ratio is exact_ratio's own ValueError."""
    from lightprune.core.checks import exact_ratio, ratio_count

    for call in (exact_ratio, lambda x: ratio_count(x, 8)):
        with pytest.raises(ValueError) as info:
            call(value)
        assert type(info.value) is ValueError
        assert str(info.value) == f"a ratio must be a finite number, got {got}"
    assert exact_ratio(Decimal("0.25")) == Fraction(1, 4) and ratio_count(Decimal("0.25"), 8) == 2


# ----------------------------------------------------------------------------------- what is not a number
@pytest.mark.parametrize("value, why", [
    (True, "a bool, not a number"),
    (np.bool_(False), "a bool, not a number"),
    ("0.5", "a string, not a number (write 0.5 without quotes)"),
    (torch.tensor([0.5]), "a tensor of shape [1], not a number: give a number or a 0-d tensor (x.item())"),
    (np.array([0.5]), "an array of shape [1], not a number: give a number or a 0-d array (x.item())"),
    ([0.5], "a list, not a number"),
])
def test_a_refused_ratio_says_what_it_got(value, why) -> None:
    with pytest.raises(ValueError) as info:
        check_ratio(value)
    assert str(info.value) == f"ratio must be in [0, 1), got {value!r}: {why}"


META = torch.tensor(0.5, device="meta")
META_WHY = "a tensor on the meta device, which holds no value, not a number"
MASKED_WHY = "NumPy's masked value (a missing value), not a number"


@pytest.mark.parametrize("value, why", [
    (META, META_WHY),
    (torch.tensor(3, device="meta"), META_WHY),
    (np.ma.masked, MASKED_WHY),
    (np.ma.array([0.5, 0.25], mask=[True, False])[0], MASKED_WHY),  # a masked element: numpy.ma.masked
    (np.ma.array(0.5, mask=True), MASKED_WHY),  # a 0-d masked array
])
def test_a_value_that_holds_no_number_is_not_one(value, why) -> None:
    """A meta tensor's ``item()`` raised torch's "Tensor.item() cannot be called on meta tensors", naming nothing;
    ``numpy.ma.masked`` (a missing value) was read as its hidden fill, 0.0: a ratio that pruned nothing, silently.
    Both are said as what they are, naming the argument, wherever a number is read."""
    assert real_number(value) is None and integer(value) is None
    with pytest.raises(ValueError) as info:
        check_ratio(value)
    assert str(info.value) == f"ratio must be in [0, 1), got {value!r}: {why}"
    with pytest.raises(ValueError) as info:
        check_non_negative_int("n_per_layer", value)
    assert str(info.value) == f"n_per_layer must be a non-negative integer, got {value!r}: {why}"
    from lightprune.core.checks import exact_ratio

    with pytest.raises(ValueError) as info:
        exact_ratio(value)
    assert str(info.value) == f"a ratio must be a finite number, got {value!r}: {why}"


def test_an_unmasked_value_of_a_masked_array_is_its_number() -> None:
    assert real_number(np.ma.array(0.5)) == 0.5 and check_ratio(np.ma.array([0.5, 0.25], mask=[True, False])[1]) \
        == 0.25


@pytest.mark.parametrize("value", ["no", "false", "", 1, 0, None, 1.0, torch.tensor(True), np.int64(1), [True]])
def test_a_bool_argument_is_a_bool_never_a_truth_value(value) -> None:
    """``overwrite="no"`` is a non-empty string, true to ``if overwrite:``: refused naming the argument."""
    with pytest.raises(ValueError) as info:
        check_bool(value, "overwrite")
    assert str(info.value) == f"overwrite must be True or False, got {value!r}"


def test_python_and_numpy_bools_are_bools() -> None:
    assert check_bool(True, "x") is True and check_bool(False, "x") is False
    assert check_bool(np.bool_(True), "x") is True and check_bool(np.bool_(False), "x") is False


def test_a_decimal_is_a_number_as_a_fraction_is() -> None:
    from decimal import Decimal
    from fractions import Fraction

    assert check_ratio(Decimal("0.3")) == check_ratio(Fraction(3, 10)) == 0.3
    assert real_number(Decimal("2")) == 2.0 and integer(Decimal("2")) == 2 and real_number(Decimal("sNaN")) is None
    for bad in (Decimal("NaN"), Decimal("1"), Decimal("-0.1")):
        with pytest.raises(ValueError, match=r"^ratio must be in \[0, 1\), got Decimal"):
            check_ratio(bad)
