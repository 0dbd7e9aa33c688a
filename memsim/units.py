"""Quantities with units: one parser for files and flags, one formatter for output.

Every physical figure a user writes (``"80 GB"``, ``"3.35 TB/s"``, ``"120 ns"``) goes through
:func:`parse_quantity`, which returns a float in the base SI unit of its dimension (bytes,
bytes/s, Hz, s, J/bit, J/op, J, op/s, W) or raises :class:`~memsim.errors.ConfigError` naming the
field and the expected form. :func:`format_quantity` writes a value back in a readable unit.

Design: one read-only table maps each unit string to ``(dimension, exact factor)``. Factors are
exact rationals (``Fraction``), and the number a user wrote is read exactly (``Decimal``), so the
product is rounded to float only once: ``parse_quantity("120 ns", "time") == 120e-9`` and
``parse_quantity("1 GiB", "capacity") == 2**30`` exactly. Units are case-sensitive where it
matters: ``b`` is a bit, ``B`` a byte; ``kB`` and ``KB`` are both 1000 B, ``KiB`` is 1024 B.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable, Mapping
from decimal import ROUND_DOWN, ROUND_HALF_EVEN, Context, Decimal, localcontext
from fractions import Fraction
from types import MappingProxyType
from typing import NamedTuple

from memsim.errors import ConfigError

__all__ = ["DIMENSIONS", "NUMBER", "parse_quantity", "format_quantity", "units_of"]

DIMENSIONS: tuple[str, ...] = (
    "capacity",        # bytes
    "bandwidth",       # bytes/s
    "frequency",       # Hz
    "time",            # s
    "energy_per_bit",  # J/bit
    "energy_per_op",   # J/op
    "energy",          # J
    "compute_rate",    # op/s
    "power",           # W
    "count",           # plain number, no unit
    "ratio",           # plain number or percent
)


class _Unit(NamedTuple):
    """One unit: the dimension it measures and its exact factor to the base SI unit."""

    dimension: str
    factor: Fraction


# --- the unit table -------------------------------------------------------------------------

_DECIMAL_UP = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_BINARY_UP = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_SUB = {"f": Fraction(1, 10**15), "p": Fraction(1, 10**12), "n": Fraction(1, 10**9),
        "u": Fraction(1, 10**6), "\u00b5": Fraction(1, 10**6), "\u03bc": Fraction(1, 10**6),
        "m": Fraction(1, 10**3)}


def _build_units() -> dict[str, _Unit]:
    """Build the unit table once; refuse a unit string that would mean two things."""
    table: dict[str, _Unit] = {}

    def add(unit: str, dimension: str, factor: int | Fraction) -> None:
        assert unit not in table, f"duplicate unit {unit!r}"
        table[unit] = _Unit(dimension, Fraction(factor))

    # capacity: bytes and bits, decimal ("K" is accepted as a synonym of "k") and binary prefixes
    byte_units: dict[str, Fraction] = {"B": Fraction(1)}
    for p, f in _DECIMAL_UP.items():
        byte_units[p + "B"] = Fraction(f)
        if p == "k":
            byte_units["KB"] = Fraction(f)
    for p, f in _BINARY_UP.items():
        byte_units[p + "B"] = Fraction(f)
    bit_units: dict[str, Fraction] = {"b": Fraction(1, 8)}
    for p, f in _DECIMAL_UP.items():
        bit_units[p + "b"] = Fraction(f, 8)
        if p == "k":
            bit_units["Kb"] = Fraction(f, 8)
    for p, f in _BINARY_UP.items():
        bit_units[p + "b"] = Fraction(f, 8)
    for u, f in {**byte_units, **bit_units}.items():
        add(u, "capacity", f)
    # bandwidth: every capacity unit per second, and the networking "bps" forms (bits)
    for u, f in {**byte_units, **bit_units}.items():
        add(u + "/s", "bandwidth", f)
    add("bps", "bandwidth", Fraction(1, 8))
    for p, f in {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}.items():
        add(p + "bps", "bandwidth", Fraction(f, 8))
    # frequency
    add("Hz", "frequency", 1)
    for p in ("k", "M", "G", "T"):
        add(p + "Hz", "frequency", _DECIMAL_UP[p])
    # time
    add("s", "time", 1)
    for p in ("f", "p", "n", "u", "\u00b5", "\u03bc", "m"):
        add(p + "s", "time", _SUB[p])
    add("min", "time", 60)
    add("h", "time", 3600)
    # energy, and energy per bit / per byte / per operation
    joules: dict[str, Fraction] = {"J": Fraction(1)}
    for p in ("f", "p", "n", "u", "\u00b5", "\u03bc", "m"):
        joules[p + "J"] = _SUB[p]
    for u, f in joules.items():
        add(u + "/bit", "energy_per_bit", f)
        add(u + "/b", "energy_per_bit", f)
        add(u + "/B", "energy_per_bit", f / 8)
        for op in ("FLOP", "OP", "op"):
            add(u + "/" + op, "energy_per_op", f)
    for p in ("k", "M", "G"):
        joules[p + "J"] = Fraction(_DECIMAL_UP[p])
    for u, f in joules.items():
        add(u, "energy", f)
    add("Wh", "energy", 3600)
    add("kWh", "energy", 3600 * 10**3)
    add("MWh", "energy", 3600 * 10**6)
    # compute rate
    for p, f in {"": 1, **_DECIMAL_UP}.items():
        for base in ("FLOPS", "FLOP/s", "OPS", "OP/s"):
            add(p + base, "compute_rate", f)
    # power
    add("W", "power", 1)
    for p in ("u", "\u00b5", "\u03bc", "m"):
        add(p + "W", "power", _SUB[p])
    for p in ("k", "M", "G"):
        add(p + "W", "power", _DECIMAL_UP[p])
    # ratio
    add("%", "ratio", Fraction(1, 100))
    return table


_UNITS: Mapping[str, _Unit] = MappingProxyType(_build_units())

# Strings that look like units but measure something else; parsing them explains why.
_NOT_UNITS: Mapping[str, str] = MappingProxyType({
    u: "is a transfer rate (transfers per second), not a bandwidth; give the bandwidth in bytes "
       "per second, such as '3.35 TB/s' or '900 GB/s'"
    for u in ("T/s", "kT/s", "MT/s", "GT/s", "TT/s")
})

# How a dimension is named in messages and an example of its expected form.
_NAMES: Mapping[str, str] = MappingProxyType({
    "capacity": "capacity", "bandwidth": "bandwidth", "frequency": "frequency", "time": "time",
    "energy_per_bit": "energy per bit", "energy_per_op": "energy per operation",
    "energy": "energy", "compute_rate": "compute rate", "power": "power", "count": "count",
    "ratio": "ratio",
})
_EXAMPLES: Mapping[str, str] = MappingProxyType({
    "capacity": "'80 GB' or '50 MiB'", "bandwidth": "'3.35 TB/s' or '900 GB/s'",
    "frequency": "'1.98 GHz'", "time": "'120 ns' or '2 us'",
    "energy_per_bit": "'3.9 pJ/bit'", "energy_per_op": "'0.5 pJ/FLOP'",
    "energy": "'15 mJ' or '1.2 kWh'", "compute_rate": "'989 TFLOPS' or '1979 TOPS'",
    "power": "'700 W'", "count": "'132' or '1e3'", "ratio": "'0.85' or '85%'",
})

# Units the formatter writes, smallest first (decimal ladder, binary ladder or None).
_LADDERS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...] | None]] = MappingProxyType({
    "capacity": (("B", "kB", "MB", "GB", "TB", "PB", "EB"),
                 ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")),
    "bandwidth": (("B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s", "EB/s"),
                  ("B/s", "KiB/s", "MiB/s", "GiB/s", "TiB/s", "PiB/s", "EiB/s")),
    "frequency": (("Hz", "kHz", "MHz", "GHz", "THz"), None),
    "time": (("ps", "ns", "us", "ms", "s"), None),
    "energy_per_bit": (("fJ/bit", "pJ/bit", "nJ/bit", "uJ/bit", "mJ/bit", "J/bit"), None),
    "energy_per_op": (("fJ/FLOP", "pJ/FLOP", "nJ/FLOP", "uJ/FLOP", "mJ/FLOP", "J/FLOP"), None),
    "energy": (("fJ", "pJ", "nJ", "uJ", "mJ", "J", "kJ", "MJ", "GJ"), None),
    "compute_rate": (("FLOP/s", "kFLOP/s", "MFLOP/s", "GFLOP/s", "TFLOP/s", "PFLOP/s",
                      "EFLOP/s"), None),
    "power": (("uW", "mW", "W", "kW", "MW", "GW"), None),
    "count": (("",), None),
    "ratio": (("",), None),
})

# sign, digits with an optional point, optional exponent; the rest of the string is the unit
#: The number that starts a quantity's text (an optional exponent; no separators).
NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_MAX_EXPONENT = 400  # beyond any float; refuses "1e999999" before building a huge integer


def units_of(dimension: str) -> tuple[str, ...]:
    """Return the unit strings accepted for ``dimension``, for help texts and messages.

    ``count`` has none; ``ratio`` has only ``%``.
    """
    _check_dimension(dimension)
    return tuple(u for u, spec in _UNITS.items() if spec.dimension == dimension)


def _check_dimension(dimension: str) -> None:
    if dimension not in DIMENSIONS:
        # a programming error, not a user's: plain ValueError
        raise ValueError(f"unknown dimension {dimension!r}; expected one of {', '.join(DIMENSIONS)}")


def _a(name: str) -> str:
    return ("an " if name[0] in "aeiou" else "a ") + name


def parse_quantity(value: str | int | float, dimension: str, *, field: str,
                   file: str | None = None) -> float:
    """Read a quantity such as ``"80 GB"`` and return it in the base SI unit of ``dimension``.

    Parameters
    ----------
    value
        A string ``"<number> <unit>"`` (the space is optional; the number may have an exponent,
        ``"1e3 GB"``; no ``_`` or ``,`` separators). Bare numbers (``int``/``float`` or a string
        without unit) are accepted only for ``"count"`` and ``"ratio"``, so that a forgotten unit
        never passes silently.
    dimension
        One of :data:`DIMENSIONS`.
    field, file
        Where the value came from; carried by the error so the user can find it.

    Returns
    -------
    float
        The value in bytes, bytes/s, Hz, s, J/bit, J/op, J, op/s, W, or as a plain number; the
        exact decimal value times the exact unit factor, rounded to float once.

    Raises
    ------
    ConfigError
        For an unknown unit, a unit of another dimension, a missing unit, an unreadable,
        negative or non-finite number, or a boolean.
    """
    _check_dimension(dimension)
    name, example = _NAMES[dimension], _EXAMPLES[dimension]
    plain = dimension in ("count", "ratio")

    def fail(message: str) -> ConfigError:
        return ConfigError(message, file=file, field=field)

    expected = f"expected {_a(name)} such as {example}"
    if isinstance(value, bool):
        raise fail(f"got a boolean ({value}); {expected}")
    if isinstance(value, numbers.Real) and not isinstance(value, str):
        if not plain:
            raise fail(f"the number {value!r} has no unit; give {_a(name)} with its unit, "
                       f"such as {example}")
        try:
            number = Fraction(value)
        except (ValueError, OverflowError, TypeError):
            raise fail(f"{value!r} is not a finite number; {expected}") from None
        return _finish(number, Fraction(1), repr(value), expected, fail)
    if not isinstance(value, str):
        raise fail(f"got {type(value).__name__} {value!r}; {expected}")

    text = value.strip()
    if not text:
        raise fail(f"empty value; {expected}")
    if "_" in text or "," in text:
        raise fail(f"{value!r}: write the number without '_' or ',' separators; {expected}")
    match = NUMBER.match(text)
    if match is None:
        word = text.lstrip("+-").lower()
        if word.startswith(("nan", "inf")):
            raise fail(f"{value!r} is not a finite number; {expected}")
        raise fail(f"cannot read a number in {value!r}; {expected}")
    decimal = Decimal(match.group())
    if decimal and abs(decimal.adjusted()) > _MAX_EXPONENT:
        raise fail(f"{value!r} is out of range; {expected}")
    unit = text[match.end():].strip()

    if not unit:
        if not plain:
            raise fail(f"{value!r} has no unit; give {_a(name)} with its unit, such as {example}")
        factor = Fraction(1)
    elif unit in _NOT_UNITS:
        raise fail(f"{value!r} {_NOT_UNITS[unit]}")
    elif unit not in _UNITS:
        raise fail(_unknown_unit_message(value, unit, dimension))
    elif _UNITS[unit].dimension != dimension:
        other = _NAMES[_UNITS[unit].dimension]
        raise fail(f"{value!r} is {_a(other)}; {expected}")
    else:
        factor = _UNITS[unit].factor
    return _finish(Fraction(decimal), factor, repr(value), expected, fail)


def _finish(number: Fraction, factor: Fraction, shown: str, expected: str,
            fail: Callable[[str], ConfigError]) -> float:
    """Scale exactly, round once, and refuse negative or overflowing results."""
    if number < 0:
        raise fail(f"{shown} is negative; {expected}")
    try:
        result = float(number * factor)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result):
        raise fail(f"{shown} is too large to represent; {expected}")
    return result


def _unknown_unit_message(value: str, unit: str, dimension: str) -> str:
    """Explain an unknown unit: the accepted ones, and a case hint for 'gb'-style typos."""
    name, example = _NAMES[dimension], _EXAMPLES[dimension]
    if dimension == "count":
        return f"{value!r}: a count takes no unit (got {unit!r}); write a plain number such as {example}"
    accepted = units_of(dimension)
    hint = ""
    same_letters = [u for u in accepted if u.lower() == unit.lower()]
    per_second = unit[:-2] + "/s" if unit.lower().endswith("ps") else ""
    if per_second in accepted:          # '5TBps': bytes per second written as 'bps' is
        hint = (f" (did you mean {per_second!r}? 'ps' units are bits per second: "
                f"{unit[:-3] + 'bps'!r} is {unit[:-3] + 'b/s'!r})")
    elif same_letters:
        hint = (f" (units are case-sensitive: 'B' is a byte, 'b' a bit; did you mean "
                f"{' or '.join(repr(u) for u in same_letters)}?)")
    return (f"unknown {name} unit {unit!r} in {value!r}{hint}; accepted units: "
            f"{', '.join(accepted)}; for example {example}")


def format_quantity(value: float, dimension: str, *, binary: bool = False, digits: int = 6) -> str:
    """Write ``value`` (in the base SI unit of ``dimension``) in a readable unit.

    The prefix is chosen so that the mantissa lies in [1, 1000), or [1, 1024) with
    ``binary=True``; values beyond the first or last unit of the ladder keep that unit with a
    smaller or larger mantissa (``"5e-6 ps"``, ``"2000 s"``). ``binary=True`` writes only binary
    prefixes (``KiB``, ``MiB/s``, ...) and ``binary=False`` only decimal ones, so the two never mix;
    dimensions without binary units (all but capacity and bandwidth) ignore ``binary``. Compute
    rates and energies per operation are written as ``FLOP`` forms; count and ratio as plain
    numbers. A negative value gets a ``-`` sign (for differences; :func:`parse_quantity` refuses it).

    Round trip: the mantissa is the shortest decimal, of at most ``digits`` significant digits,
    that :func:`parse_quantity` reads back as exactly ``value``; if there is none, it is
    ``value / unit`` correctly rounded to ``digits`` significant digits. Hence
    ``parse_quantity(format_quantity(x, d), d) == x`` bit for bit whenever ``x`` was itself parsed
    from (or is) a number of at most ``digits`` significant digits in the chosen unit (``"3.35
    TB/s"``, ``"120 ns"``), always bit for bit with ``digits >= 17``, and otherwise within a
    relative ``5 * 10**-digits`` plus one float rounding (e.g. ``1234567.891`` -> ``"1.23457 MB"``).

    Raises
    ------
    ValueError
        For an unknown dimension, a non-finite value, or ``digits < 1``.
    """
    _check_dimension(dimension)
    if digits < 1:
        raise ValueError(f"digits must be at least 1, got {digits}")
    if isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"cannot format {value!r} as {_a(_NAMES[dimension])}")
    decimal_ladder, binary_ladder = _LADDERS[dimension]
    ladder = binary_ladder if binary and binary_ladder is not None else decimal_ladder
    step = 1024 if ladder is binary_ladder else 1000
    factors = [_UNITS[u].factor if u else Fraction(1) for u in ladder]
    target = float(value) + 0.0  # no "-0"
    exact = abs(Fraction(target))

    index = factors.index(Fraction(1)) if exact == 0 else 0
    for i, f in enumerate(factors):
        if f <= exact:
            index = i
    mantissa = _mantissa(exact, factors[index], abs(target), digits)
    if abs(mantissa) >= step and index + 1 < len(ladder):  # rounding carried into the next prefix
        index += 1
        mantissa = _mantissa(exact, factors[index], abs(target), digits)
    text = ("-" if target < 0 else "") + _decimal_text(mantissa)
    return f"{text} {ladder[index]}" if ladder[index] else text


def _mantissa(exact: Fraction, factor: Fraction, target: float, digits: int) -> Decimal:
    """Shortest decimal of <= digits significant digits whose value * factor rounds to target."""
    scaled = exact / factor
    if scaled == 0:
        return Decimal(0)
    rounded = Decimal(0)
    for k in range(1, digits + 1):
        with localcontext() as ctx:
            ctx.prec, ctx.rounding = k, ROUND_HALF_EVEN
            rounded = Decimal(scaled.numerator) / Decimal(scaled.denominator)
        try:
            if float(Fraction(rounded) * factor) == target:
                return rounded
        except OverflowError:  # rounded up past the largest float
            continue
    try:
        float(Fraction(rounded) * factor)
    except OverflowError:  # keep the text readable: round towards zero instead
        with localcontext() as ctx:
            ctx.prec, ctx.rounding = digits, ROUND_DOWN
            rounded = Decimal(scaled.numerator) / Decimal(scaled.denominator)
    return rounded


def _decimal_text(number: Decimal) -> str:
    """Plain notation unless that would need padding zeros (``1e-08``, ``8.67e+11``); no trailing 0s."""
    if number == 0:
        return "0"
    number = number.normalize(Context(prec=len(number.as_tuple().digits)))
    if -5 <= number.adjusted() < max(6, len(number.as_tuple().digits)):
        return format(number, "f")
    return format(number, "e")
