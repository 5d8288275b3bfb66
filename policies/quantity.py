"""Kubernetes resource quantities as exact fractions.

Quota arithmetic must not drift (ten pods of 0.1 fill a quota of 1), so every quantity is
parsed into a `fractions.Fraction`, never a float.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# The grammar of k8s.io/apimachinery/pkg/api/resource: a signed decimal number followed by a
# binary suffix, a decimal suffix, or a decimal exponent (1e3, 5E-2).
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?$"
)
# The same grammar without group names, for JSON schemas (the chart's values.schema.json),
# with the blanks around it that parsing strips.
QUANTITY_PATTERN = r"^\s*" + re.sub(r"\?P<[a-z]+>", "", _QUANTITY.pattern)[1:-1] + r"\s*$"

MiB = 2**20
# Kubernetes caps every quantity at 2^63 - 1 in magnitude: nothing larger is a resource.
MAX_AMOUNT = 2**63 - 1
# 2^63 written out is 19 digits, and a nano amount has nine decimals: no quantity worth
# reading is longer than this. Longer text is refused before any arithmetic, whose cost grows
# with the digits (and Python reads no integer of more than 4300 digits).
MAX_QUANTITY_CHARS = 64
# Past 10^19, every quantity is out of range, however many decimals its number has.
MAX_EXPONENT = 19 + MAX_QUANTITY_CHARS
QUANTITY_FORM = "a number with an optional suffix such as 500m, 2, 10Gi or 1e3"


class QuantityError(ValueError):
    """A value is not a Kubernetes quantity."""


def parse_quantity(value: object) -> Fraction:
    """Parse a Kubernetes quantity (``"500m"``, ``"10Gi"``, ``2``, ``"1e3"``) exactly.

    Its cost is bounded whatever the value: text longer than any quantity, and exponents
    beyond the largest quantity, are refused before any arithmetic.
    """
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity (expected {QUANTITY_FORM})")
    if isinstance(value, int):
        return _in_range(Fraction(value), value)
    if isinstance(value, float):
        # YAML and JSON turn 0.5 into a float; its shortest repr is what the user wrote.
        value = repr(value)
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity (expected {QUANTITY_FORM})")
    if len(value) > MAX_QUANTITY_CHARS:
        # Checked before the cache, which would otherwise keep every long text it was given.
        raise QuantityError(
            f"{value[:20]!r}… ({len(value)} characters) is not a quantity: a quantity is "
            f"{QUANTITY_FORM}, in at most {MAX_QUANTITY_CHARS} characters"
        )
    return _parse_text(value)


@functools.lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    """Parse quantity text; cached, since the same few values recur in every pod."""
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(f"{value!r} is not a quantity (expected {QUANTITY_FORM})")
    number = Fraction(match["number"])
    if match["exponent"] is not None:
        exponent = int(match["exponent"])
        # Checked before the power is taken, whose cost grows with the exponent.
        if abs(exponent) > MAX_EXPONENT:
            raise QuantityError(
                f"{value!r} is out of range: the exponent of a quantity is between "
                f"-{MAX_EXPONENT} and {MAX_EXPONENT}"
            )
        return _in_range(number * Fraction(10) ** exponent, value)
    suffix = match["suffix"] or ""
    return _in_range(number * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix]), value)


def _in_range(amount: Fraction, written: object) -> Fraction:
    if abs(amount) > MAX_AMOUNT:
        raise QuantityError(_out_of_range(written))
    return amount


def _out_of_range(written: object) -> str:
    return f"{written!r} is out of range: a quantity is at most 2^63-1 ({MAX_AMOUNT})"


@functools.lru_cache(maxsize=1024)
def format_amount(amount: Fraction) -> str:
    """Write an amount as a plain decimal when it has one (``0.5``, ``2``), else ``p/q``."""
    if amount.denominator == 1:
        return str(amount.numerator)
    denominator = amount.denominator
    twos = fives = 0
    while denominator % 2 == 0:
        denominator //= 2
        twos += 1
    while denominator % 5 == 0:
        denominator //= 5
        fives += 1
    if denominator != 1:
        return f"{amount.numerator}/{amount.denominator}"
    places = max(twos, fives)
    scaled = amount * 10**places
    sign = "-" if scaled < 0 else ""
    digits = str(abs(scaled.numerator)).rjust(places + 1, "0")
    return f"{sign}{digits[:-places]}.{digits[-places:]}".rstrip("0").rstrip(".")


def format_bytes(amount: Fraction) -> str:
    """Write a byte count the way a user would (``10Gi``, ``512Mi``, ``1500``)."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if amount >= unit and (amount / unit).denominator == 1:
            return f"{(amount / unit).numerator}{suffix}"
    return format_amount(amount)


def format_memory(amount: Fraction) -> str:
    """Write an amount of memory for a message, always with a unit: the shortest of its
    whole forms (``10Gi``, ``16G``), else in a binary unit with at most two decimals
    (``79.99Gi``), else in bytes (``1000.5 bytes``)."""
    units = [*((suffix, Fraction(unit)) for suffix, unit in _BINARY.items()), *_DECIMAL.items()]
    whole = [
        f"{(amount / unit).numerator}{suffix}"
        for suffix, unit in units
        if unit > 1 and amount >= unit and (amount / unit).denominator == 1
    ]
    if whole:
        return min(whole, key=len)
    for suffix, unit in reversed(_BINARY.items()):
        if amount >= unit and (amount * 100 / unit).denominator == 1:
            return f"{format_amount(amount / unit)}{suffix}"
    return f"{format_amount(amount)} bytes"


def memory_unit_name(unit: Fraction) -> str:
    """Name the unit a stack counts GPU memory in, for a message: ``MiB``, ``GiB``, ``GB``,
    else ``units of 256Mi``."""
    names = {Fraction(MiB): "MiB", Fraction(2**30): "GiB", Fraction(10**9): "GB"}
    return names.get(unit) or f"units of {format_memory(unit)}"


def canonical_quantity(amount: Fraction) -> str:
    """Write a positive whole amount as the apiserver stores it: with the largest binary
    suffix that keeps it whole when it is a multiple of 1024 (``40Gi``), else with the
    largest decimal one (``2k``, ``1500``), as its canonical form keeps the written format."""
    if amount.denominator != 1 or amount <= 0:
        raise ValueError(f"{amount} is not a positive whole amount")
    if amount % 1024 == 0:
        return format_bytes(amount)
    value, suffix = int(amount), ""
    for next_suffix in ("k", "M", "G", "T", "P", "E"):
        if value % 1000:
            break
        value, suffix = value // 1000, next_suffix
    return f"{value}{suffix}"


def ceil_div(amount: Fraction, unit: Fraction | int) -> int:
    """Return how many whole units cover `amount`: rounding only ever up."""
    quotient = amount / unit
    return -((-quotient.numerator) // quotient.denominator)


def floor_div(amount: Fraction, unit: Fraction | int) -> int:
    """Return how many whole units fit in `amount`: rounding only ever down.

    A share of a GPU is written so: N shares of 1/N, each rounded down to the units a stack
    counts, add up to at most one GPU's worth, so they fit on one GPU as the stack fits them.
    """
    quotient = amount / unit
    return quotient.numerator // quotient.denominator
