"""A GPU-hour budget as `quotas.yaml` writes it: GPU-hours of a class over a rolling window.

`500h/7d` is 500 GPU-hours in any 7 days. Seconds are whole: Kubernetes' timestamps have no
finer grain. What is counted against a budget, and when, is `policies.quota.gpu_hours`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction

HOUR = 3600
DAY = 24 * HOUR
_AMOUNT_UNITS = {"h": HOUR, "m": 60, "s": 1}
_WINDOW_UNITS = {"w": 7 * DAY, "d": DAY, "h": HOUR, "m": 60, "s": 1}
_AMOUNT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([hms])\s*")
_DURATION = re.compile(r"([0-9]+)([wdhms])")
# Longer windows would keep years of buckets in every record.
MAX_WINDOW = 366 * DAY


@dataclass(frozen=True, slots=True)
class Budget:
    """GPU-seconds of a class a namespace may use in any `window` seconds."""

    gpu_seconds: Fraction
    window: int
    # As the admin wrote it, spaces taken out: what GPUQuota objects and messages show.
    text: str = field(default="", compare=False)
    # The unit of the amount as written (h, m or s): usage against it is said in it too.
    unit: str = field(default="h", compare=False)

    def __str__(self) -> str:
        return self.text or f"{hours(self.gpu_seconds)}/{duration(self.window)}"

    def say(self, gpu_seconds: Fraction) -> str:
        """Say an amount of GPU-seconds in this budget's unit: `512.25h`, `90.5m`, `150s`."""
        return amount_in(gpu_seconds, self.unit)


def parse_budget(value: object) -> Budget:
    """Read a budget as written in `quotas.yaml`: `<GPU-hours>h/<window>`, e.g. `500h/7d`.

    The amount may also be in GPU-minutes (`m`) or GPU-seconds (`s`); the window is a whole
    number of weeks, days, hours, minutes or seconds. Raise `ValueError` naming the value.
    """
    text = value if isinstance(value, str) else None
    amount_text, slash, window_text = (text or "").partition("/")
    amount = _AMOUNT.fullmatch(amount_text) if text is not None and len(text) <= 64 else None
    try:
        span = (
            parse_duration("".join(window_text.split())) if amount is not None and slash else None
        )
    except ValueError:
        span = None
    if amount is None or span is None or text is None:
        raise ValueError(
            f"{value!r} is not a GPU-hour budget: write GPU-hours over a window, "
            "e.g. 500h/7d (amount in h, m or s; window in w, d, h, m or s)"
        )
    amount_unit = amount.group(2)
    seconds = Fraction(amount.group(1)) * _AMOUNT_UNITS[amount_unit]
    if span <= 0 or span > MAX_WINDOW:
        raise ValueError(f"{value!r}: the window must be from 1s to {MAX_WINDOW // DAY}d")
    if seconds.denominator != 1:
        raise ValueError(f"{value!r}: the amount must be a whole number of GPU-seconds")
    return Budget(seconds, span, "".join(text.split()) if text is not None else "", amount_unit)


def parse_duration(text: str) -> int:
    """Read a whole number of weeks, days, hours, minutes or seconds (`7d`, `90m`) as
    seconds; raise `ValueError` if it is not one."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a whole number of w, d, h, m or s")
    return int(match.group(1)) * _WINDOW_UNITS[match.group(2)]


def hours(gpu_seconds: Fraction) -> str:
    """Say GPU-seconds as GPU-hours, to the hundredth: `512.25h`."""
    return amount_in(gpu_seconds, "h")


def amount_in(gpu_seconds: Fraction, unit: str) -> str:
    """Say GPU-seconds in GPU-hours (`h`) or GPU-minutes (`m`) to the hundredth, or in
    whole GPU-seconds (`s`)."""
    if unit == "s":
        return f"{round(Fraction(gpu_seconds))}s"
    value = float(round(Fraction(gpu_seconds) / _AMOUNT_UNITS[unit], 2))
    return f"{value:.2f}".rstrip("0").rstrip(".") + unit


def duration(seconds: int) -> str:
    """Say a whole number of seconds in the largest unit that divides it, of days, hours,
    minutes and seconds: `7d`, `90s` (weeks are said in days, as admins count windows)."""
    for unit, size in _WINDOW_UNITS.items():
        if unit != "w" and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"  # pragma: no cover - the last unit divides everything
