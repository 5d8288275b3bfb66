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

MiB = 2**20


class QuantityError(ValueError):
    """A value is not a Kubernetes quantity."""


def parse_quantity(value: object) -> Fraction:
    """Parse a Kubernetes quantity (``"500m"``, ``"10Gi"``, ``2``, ``"1e3"``) exactly."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        # YAML and JSON turn 0.5 into a float; its shortest repr is what the user wrote.
        value = repr(value)
    if not isinstance(value, str):
        raise QuantityError(f"{value!r} is not a quantity")
    return _parse_text(value)


@functools.lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    """Parse quantity text; cached, since the same few values recur in every pod."""
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise QuantityError(
            f"{value!r} is not a quantity (expected a number with an optional suffix "
            "such as 500m, 2, 10Gi or 1e3)"
        )
    number = Fraction(match["number"])
    if match["exponent"] is not None:
        exponent = int(match["exponent"])
        if abs(exponent) > 30:
            raise QuantityError(f"{value!r} is out of range")
        return number * Fraction(10) ** exponent
    suffix = match["suffix"] or ""
    return number * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])


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


def ceil_div(amount: Fraction, unit: Fraction | int) -> int:
    """Return how many whole units cover `amount`: rounding only ever up."""
    quotient = amount / unit
    return -((-quotient.numerator) // quotient.denominator)
