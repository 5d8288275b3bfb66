"""Tables as kubectl prints them: each column but the last padded to its widest cell, three
spaces apart."""

from __future__ import annotations

from collections.abc import Sequence


def column_widths(rows: Sequence[Sequence[str]], columns: int) -> list[int]:
    """Return the width of each column but the last, over `rows` of `columns` cells."""
    return [max((len(row[i]) for row in rows), default=0) for i in range(columns - 1)]


def line(cells: Sequence[str], widths: Sequence[int]) -> str:
    """Lay one row out in columns of `widths`; the last cell is not padded."""
    padded = (cell.ljust(width) for cell, width in zip(cells[:-1], widths, strict=True))
    return "   ".join([*padded, cells[-1]])
