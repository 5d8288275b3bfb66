"""The end-to-end suite's waits stretch with the machine's load, within a bound."""

from __future__ import annotations

import pytest

from tests.e2e import patience


@pytest.mark.parametrize(
    ("load", "stretch"),
    [(0.5, 1.0), (2.0, 1.0), (3.0, 1.5), (5.0, 2.5), (40.0, patience.MOST)],
)
def test_a_budget_stretches_by_the_load_per_cpu_within_its_bound(
    monkeypatch: pytest.MonkeyPatch, load: float, stretch: float
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("os.getloadavg", lambda: (load, 0.0, 0.0))
    assert patience.stretch() == stretch
    assert not patience.spent(60 * stretch, 60)
    assert patience.spent(60 * stretch + 0.01, 60)
