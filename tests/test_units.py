"""Tests of memsim.units: examples per dimension, error messages, and round-trip properties."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim.errors import ConfigError
from memsim.testing import examples
from memsim.units import DIMENSIONS, format_quantity, parse_quantity, units_of


def parse(value, dimension="capacity"):
    return parse_quantity(value, dimension, field="test.field")


# --- examples ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "dimension", "expected"), [
    ("80 GB", "capacity", 80e9),
    ("80GB", "capacity", 80e9),
    ("  80   GB ", "capacity", 80e9),
    ("1e3 GB", "capacity", 1e12),
    ("1.5E-3GB", "capacity", 1.5e6),
    ("3EB", "capacity", 3e18),
    ("50 MiB", "capacity", 50 * 2**20),
    ("1 GiB", "capacity", 2**30),
    ("256 Kib", "capacity", 32768),
    ("8 b", "capacity", 1),
    ("2 kB", "capacity", 2000),
    ("2 KB", "capacity", 2000),
    ("2 KiB", "capacity", 2048),
    ("16 Gb", "capacity", 2e9),
    ("3.35 TB/s", "bandwidth", 3.35e12),
    ("900 GB/s", "bandwidth", 900e9),
    ("64 GiB/s", "bandwidth", 64 * 2**30),
    ("400 Gb/s", "bandwidth", 50e9),
    ("400 Gbps", "bandwidth", 50e9),
    ("1.6 Tbps", "bandwidth", 200e9),
    ("100 Mbps", "bandwidth", 12.5e6),
    ("1.98 GHz", "frequency", 1.98e9),
    ("100 MHz", "frequency", 1e8),
    ("120 ns", "time", 120e-9),
    ("2 us", "time", 2e-6),
    ("2 \u00b5s", "time", 2e-6),
    ("1.5 ms", "time", 1.5e-3),
    ("5 ps", "time", 5e-12),
    ("3 s", "time", 3.0),
    ("2 min", "time", 120.0),
    ("1 h", "time", 3600.0),
    ("3.9 pJ/bit", "energy_per_bit", 3.9e-12),
    ("80 fJ/bit", "energy_per_bit", 80e-15),
    ("8 pJ/B", "energy_per_bit", 1e-12),
    ("0.5 pJ/FLOP", "energy_per_op", 0.5e-12),
    ("2 pJ/OP", "energy_per_op", 2e-12),
    ("2 pJ/op", "energy_per_op", 2e-12),
    ("15 mJ", "energy", 15e-3),
    ("1.2 kWh", "energy", 1.2 * 3.6e6),
    ("1 Wh", "energy", 3600.0),
    ("989 TFLOPS", "compute_rate", 989e12),
    ("989.4 TFLOP/s", "compute_rate", 989.4e12),
    ("1979 TOPS", "compute_rate", 1979e12),
    ("2 PFLOPS", "compute_rate", 2e15),
    ("1 EFLOPS", "compute_rate", 1e18),
    ("700 W", "power", 700.0),
    ("350 mW", "power", 0.35),
    ("1.2 kW", "power", 1200.0),
    ("132", "count", 132.0),
    ("1e3", "count", 1000.0),
    (132, "count", 132.0),
    (2.5, "count", 2.5),
    ("0.85", "ratio", 0.85),
    ("85%", "ratio", 0.85),
    (0.85, "ratio", 0.85),
    ("0 GB", "capacity", 0.0),
])
def test_examples(text, dimension, expected):
    assert parse(text, dimension) == expected


def test_every_dimension_has_an_example_and_a_format():
    for dimension in DIMENSIONS:
        assert isinstance(format_quantity(1.0, dimension), str)
    assert set(DIMENSIONS) == {"capacity", "bandwidth", "frequency", "time", "energy_per_bit",
                               "energy_per_op", "energy", "compute_rate", "power", "count",
                               "ratio"}


def test_exact_factors():
    assert parse("1 GiB") == 2**30
    assert parse("1 EiB") == 2**60
    assert parse("1 Kib") == 128
    assert parse("120 ns", "time") == float("120e-9")  # one rounding, not 120 * 1e-9
    assert parse("0.1 ns", "time") == 1e-10


def test_units_of():
    assert "GiB" in units_of("capacity")
    assert "GB/s" in units_of("bandwidth")
    assert units_of("count") == ()
    assert units_of("ratio") == ("%",)
    with pytest.raises(ValueError):
        units_of("mass")


# --- errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "dimension", "needle"), [
    ("80 XB", "capacity", "GiB"),               # unknown unit: lists accepted units
    ("80 gb", "capacity", "case-sensitive"),     # unknown unit: case hint
    ("3.35 TB/s", "capacity", "is a bandwidth; expected a capacity such as '80 GB'"),
    ("80 GB", "bandwidth", "is a capacity; expected a bandwidth"),
    ("1.98 GHz", "time", "is a frequency"),
    ("132 GB", "count", "is a capacity; expected a count"),
    ("16 GT/s", "bandwidth", "transfer rate"),
    ("80", "capacity", "no unit"),
    (80, "capacity", "no unit"),
    (80.0, "bandwidth", "no unit"),
    ("-5 GB", "capacity", "negative"),
    ("-1", "count", "negative"),
    (-1, "count", "negative"),
    ("-5%", "ratio", "negative"),
    ("nan GB", "capacity", "not a finite number"),
    ("NaN", "count", "not a finite number"),
    ("inf", "count", "not a finite number"),
    (float("nan"), "count", "not a finite number"),
    (float("inf"), "ratio", "not a finite number"),
    ("abc", "capacity", "cannot read a number"),
    ("GB", "capacity", "cannot read a number"),
    ("", "capacity", "empty"),
    ("1_000 GB", "capacity", "separators"),
    ("1,000 GB", "capacity", "separators"),
    ("3/4 GB", "capacity", "unknown capacity unit"),
    ("132 cores", "count", "takes no unit"),
    ("80 GB extra", "capacity", "unknown"),
    (True, "count", "boolean"),
    (None, "count", "expected a count"),
    ("1e999999 GB", "capacity", "out of range"),
    ("1e300 EB", "capacity", "too large"),
    (10**400, "count", "too large"),
])
def test_errors(value, dimension, needle):
    with pytest.raises(ConfigError) as info:
        parse_quantity(value, dimension, field="tiers.hbm.capacity", file="dev.toml")
    error = info.value
    assert error.field == "tiers.hbm.capacity"
    assert error.file == "dev.toml"
    assert "tiers.hbm.capacity" in str(error)
    assert str(error).startswith("dev.toml: tiers.hbm.capacity: ")
    assert needle in str(error)


def test_error_without_file():
    with pytest.raises(ConfigError) as info:
        parse_quantity("80", "capacity", field="--sram")
    assert info.value.field == "--sram"
    assert str(info.value).startswith("--sram: ")
    assert "'80 GB'" in str(info.value)  # the expected form, with an example


def test_unknown_dimension_is_a_programming_error():
    with pytest.raises(ValueError):
        parse_quantity("1 kg", "mass", field="x")
    with pytest.raises(ValueError):
        format_quantity(1.0, "mass")


# --- formatting -------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "dimension", "binary", "expected"), [
    (80e9, "capacity", False, "80 GB"),
    (50 * 2**20, "capacity", True, "50 MiB"),
    (32768, "capacity", True, "32 KiB"),
    (32768, "capacity", False, "32.768 kB"),
    (0.0, "capacity", False, "0 B"),
    (512, "capacity", True, "512 B"),
    (3.35e12, "bandwidth", False, "3.35 TB/s"),
    (1.98e9, "frequency", False, "1.98 GHz"),
    (120e-9, "time", False, "120 ns"),
    (3.9e-12, "energy_per_bit", False, "3.9 pJ/bit"),
    (0.5e-12, "energy_per_op", False, "500 fJ/FLOP"),
    (989e12, "compute_rate", False, "989 TFLOP/s"),
    (700.0, "power", False, "700 W"),
    (132.0, "count", False, "132"),
    (0.85, "ratio", False, "0.85"),
    (0.1 + 0.2, "ratio", False, "0.3"),
    (999999.9, "capacity", False, "1 MB"),       # rounding carries into the next prefix
    (1234567.891, "capacity", False, "1.23457 MB"),
    (5000.0, "time", False, "5000 s"),           # beyond the ladder: keep the last unit
])
def test_format_examples(value, dimension, binary, expected):
    assert format_quantity(value, dimension, binary=binary) == expected


def test_format_rejects_nonfinite_and_bad_digits():
    with pytest.raises(ValueError):
        format_quantity(math.nan, "capacity")
    with pytest.raises(ValueError):
        format_quantity(math.inf, "capacity")
    with pytest.raises(ValueError):
        format_quantity(1.0, "capacity", digits=0)


# --- properties -------------------------------------------------------------------------------

RANGES = {
    "capacity": (1e-3, 1e21), "bandwidth": (1e-3, 1e21), "frequency": (1e-3, 1e15),
    "time": (1e-15, 1e6), "energy_per_bit": (1e-18, 1e3), "energy_per_op": (1e-18, 1e3),
    "energy": (1e-18, 1e12), "compute_rate": (1e-3, 1e21), "power": (1e-9, 1e12),
    "count": (1e-15, 1e18), "ratio": (1e-15, 1e3),
}


def positive_floats(dimension):
    low, high = RANGES[dimension]
    return st.floats(min_value=low, max_value=high, allow_nan=False, allow_infinity=False)


quantities = st.sampled_from(DIMENSIONS).flatmap(
    lambda d: st.tuples(st.just(d), positive_floats(d), st.booleans()))


@settings(max_examples=examples(300))
@given(quantities)
def test_round_trip_exact_with_17_digits(case):
    dimension, x, binary = case
    text = format_quantity(x, dimension, binary=binary, digits=17)
    assert parse(text, dimension) == x


@settings(max_examples=examples(300))
@given(quantities)
def test_round_trip_default_digits(case):
    dimension, x, binary = case
    text = format_quantity(x, dimension, binary=binary)
    assert math.isclose(parse(text, dimension), x, rel_tol=5e-6 * (1 + 1e-9))


@settings(max_examples=examples(300))
@given(st.sampled_from(DIMENSIONS), st.integers(1, 999_999), st.integers(-8, 8))
def test_short_decimals_round_trip_bit_exact(dimension, mantissa, exponent):
    # a value of <= 6 significant digits in its unit comes back bit for bit at the default digits
    x = float(Fraction(mantissa) * Fraction(10) ** exponent)
    assert parse(format_quantity(x, dimension), dimension) == x


@settings(max_examples=examples(300))
@given(st.sampled_from(["capacity", "bandwidth"]), st.integers(100, 102_399),
       st.integers(0, 6))
def test_short_binary_values_round_trip_bit_exact(dimension, hundredths, power):
    # e.g. 1.5 GiB or 1023.25 MiB: <= 6 significant digits in the binary unit
    x = float(Fraction(hundredths, 100) * 2 ** (10 * power))
    text = format_quantity(x, dimension, binary=True)
    assert parse(text, dimension) == x
    assert 1 <= float(text.split(" ")[0]) < 1024


@settings(max_examples=examples(300))
@given(st.sampled_from(["capacity", "bandwidth"]), st.floats(1e-3, 1e24), st.booleans(),
       st.integers(1, 17))
def test_prefixes_never_mix(dimension, x, binary, digits):
    number, unit = format_quantity(x, dimension, binary=binary, digits=digits).split(" ")
    capacity_unit = unit.removesuffix("/s")
    if binary:
        assert "i" in capacity_unit or capacity_unit == "B"
    else:
        assert "i" not in capacity_unit
        assert capacity_unit in ("B", "kB", "MB", "GB", "TB", "PB", "EB")


# (smallest, largest) unit of the formatter's ladder, in base units
LADDER_ENDS = {
    "capacity": (1, 1e18), "bandwidth": (1, 1e18), "frequency": (1, 1e12),
    "time": (1e-12, 1), "energy_per_bit": (1e-15, 1), "energy_per_op": (1e-15, 1),
    "energy": (1e-15, 1e9), "compute_rate": (1, 1e18), "power": (1e-6, 1e9),
}


@settings(max_examples=examples(300))
@given(st.sampled_from(DIMENSIONS), st.floats(1e-18, 1e24), st.booleans(), st.integers(1, 17))
def test_mantissa_in_range_inside_the_ladder(dimension, x, binary, digits):
    parts = format_quantity(x, dimension, binary=binary, digits=digits).split(" ")
    if dimension in ("count", "ratio"):
        assert len(parts) == 1
        return
    number = float(parts[0])
    low, high = LADDER_ENDS[dimension]
    binary_ladder = binary and dimension in ("capacity", "bandwidth")
    step = 1024 if binary_ladder else 1000
    if binary_ladder:
        high = 2**60
    if low <= x < high * step * (1 - 10.0**-digits):
        assert 1 <= number < step


@settings(max_examples=examples(200))
@given(st.integers(1, 9_000_000))
def test_gib_and_gb_differ_by_exactly_the_binary_ratio(n):
    gib = parse(f"{n} GiB")
    gb = parse(f"{n} GB")
    assert gib != gb
    assert Fraction(gib) / Fraction(gb) == Fraction(2**30, 10**9)


@settings(max_examples=examples(100))
@given(st.sampled_from(DIMENSIONS))
def test_every_formatted_unit_parses_in_its_dimension(dimension):
    for x in (1e-15, 1e-9, 1e-3, 1.0, 1e3, 1e9, 1e15, 1e18):
        for binary in (False, True):
            text = format_quantity(x, dimension, binary=binary)
            assert parse(text, dimension) == pytest.approx(x, rel=5e-6)
