"""Kubernetes quantities, parsed exactly."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.quantity import (
    QUANTITY_PATTERN,
    QuantityError,
    ceil_div,
    floor_div,
    format_amount,
    format_bytes,
    format_memory,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("1", Fraction(1), id="integer"),
        pytest.param(2, Fraction(2), id="json-number"),
        pytest.param(0.5, Fraction(1, 2), id="yaml-float"),
        pytest.param("0.1", Fraction(1, 10), id="decimal-is-exact"),
        pytest.param("500m", Fraction(1, 2), id="milli"),
        pytest.param("250m", Fraction(1, 4), id="milli-quarter"),
        pytest.param("10Gi", Fraction(10 * 2**30), id="gibibytes"),
        pytest.param("1.5Gi", Fraction(3 * 2**29), id="fractional-gibibytes"),
        pytest.param("4000M", Fraction(4 * 10**9), id="megabytes"),
        pytest.param("1e3", Fraction(1000), id="exponent"),
        pytest.param("5E-1", Fraction(1, 2), id="negative-exponent"),
        pytest.param("-1", Fraction(-1), id="negative"),
        pytest.param(" 2 ", Fraction(2), id="surrounding-space"),
    ],
)
def test_parse(text: object, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("lots", id="word"),
        pytest.param("1.5.0", id="two-points"),
        pytest.param("10GB", id="unknown-suffix"),
        pytest.param("1e999", id="exponent-out-of-range"),
        pytest.param("1e999999999", id="absurd-exponent"),
        pytest.param("1e-999999999", id="absurd-negative-exponent"),
        pytest.param("9" * 4301, id="thousands-of-digits"),
        pytest.param("0." + "0" * 5000 + "1", id="thousands-of-decimals"),
        pytest.param("8Ei", id="past-2-to-the-63"),
        pytest.param(2**64 - 1, id="json-number-past-2-to-the-63"),
        pytest.param(1e300, id="float-past-2-to-the-63"),
        pytest.param(True, id="boolean"),
        pytest.param(None, id="null"),
        pytest.param([1], id="list"),
    ],
)
def test_invalid_quantities_say_what_is_accepted(text: object) -> None:
    with pytest.raises(QuantityError, match=r"quantit|out of range"):
        parse_quantity(text)


def test_the_largest_quantity_parses() -> None:
    assert parse_quantity("9223372036854775807") == 2**63 - 1
    assert parse_quantity("7Ei") == 7 * 2**60
    assert parse_quantity("1e-83") == Fraction(1, 10**83)


def test_ten_tenths_are_exactly_one() -> None:
    assert sum((parse_quantity("0.1") for _ in range(10)), Fraction(0)) == 1


@pytest.mark.parametrize(
    ("amount", "text"),
    [
        pytest.param(Fraction(2), "2", id="whole"),
        pytest.param(Fraction(1, 2), "0.5", id="half"),
        pytest.param(Fraction(7, 64), "0.109375", id="binary-fraction"),
        pytest.param(Fraction(13, 100), "0.13", id="hundredths"),
        pytest.param(Fraction(1, 7), "1/7", id="no-finite-decimal"),
    ],
)
def test_format_amount(amount: Fraction, text: str) -> None:
    assert format_amount(amount) == text


def test_format_bytes_prefers_binary_suffixes() -> None:
    assert format_bytes(Fraction(80 * 2**30)) == "80Gi"
    assert format_bytes(Fraction(1500 * 2**20)) == "1500Mi"
    assert format_bytes(Fraction(1000)) == "1000"


@pytest.mark.parametrize(
    ("written", "text"),
    [
        pytest.param("80Gi", "80Gi", id="whole-binary"),
        pytest.param("16G", "16G", id="whole-decimal-is-shorter"),
        pytest.param("1.5G", "1500M", id="whole-in-a-smaller-decimal-unit"),
        pytest.param("79.99Gi", "79.99Gi", id="binary-with-two-decimals"),
        pytest.param("1000", "1k", id="bytes-in-thousands"),
        pytest.param("1500", "1500 bytes", id="bytes-say-so"),
    ],
)
def test_format_memory_always_names_a_unit(written: str, text: str) -> None:
    assert format_memory(parse_quantity(written)) == text


def test_floor_div_rounds_down_only() -> None:
    assert floor_div(Fraction(64, 10), 1) == 6
    assert floor_div(Fraction(64), 1) == 64
    assert floor_div(Fraction(1, 10**9), 2**20) == 0
    # Three thirds of 80Gi in MiB, each rounded down, fit in 80Gi.
    assert 3 * floor_div(Fraction(80 * 2**30, 3), 2**20) <= 80 * 1024


def test_ceil_div_rounds_up_only() -> None:
    assert ceil_div(Fraction(64, 10), 1) == 7
    assert ceil_div(Fraction(64), 1) == 64
    assert ceil_div(Fraction(1, 10**9), 2**20) == 1


@given(st.text(alphabet="0123456789.+-eEkKMGTPinum \t", max_size=14))
def test_the_schema_pattern_takes_every_quantity_gpuadm_reads(text: str) -> None:
    # The chart's values schema checks quantities by this pattern: it must never refuse at
    # install what gpuadm itself reads.
    try:
        parse_quantity(text)
    except QuantityError:
        return
    assert re.match(QUANTITY_PATTERN, text), text
