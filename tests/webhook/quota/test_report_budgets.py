"""GPU-hour budgets in the quota report: a class with a budget is reported even when nothing
holds it, `*` too, and what was used of a budget is said in GPU-hours."""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction as F
from typing import Any

import pytest

from policies import load_quotas
from webhook.cli.quota import table
from webhook.quota.holdings import Holding
from webhook.quota.report import namespace_report

QUOTAS = """
mode: enforce
default: {t4: 1, budget: {"*": 100h/1d}}
namespaces:
  team-b: {budget: {h100: 500h/7d}}
  team-c: {a100: 2, budget: {a100: 30m/12h, "*": 900h/30d}}
  team-d: {h100: 1}
"""


def rows(
    namespace: str,
    used: Mapping[str, F] | None,
    holdings: tuple[Holding, ...] = (),
) -> dict[str, dict[str, Any]]:
    reports = namespace_report(namespace, load_quotas(QUOTAS), holdings, [], [], budget_used=used)
    return {r.class_name: r.to_json() for r in reports}


def budget_fields(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("limit", "budget", "budgetUsed") if k in row}


@pytest.mark.parametrize(
    ("namespace", "used", "holdings", "expected"),
    [
        pytest.param(
            "team-b",
            {"h100": F(1_845_900)},
            (),
            {"h100": {"budget": "500h/7d", "budgetUsed": "512.75h"}},
            id="a-class-with-only-a-budget-is-reported-though-nothing-holds-it",
        ),
        pytest.param(
            "team-b",
            None,
            (),
            {"h100": {"budget": "500h/7d"}},
            id="used-not-known-leaves-budget-used-out",
        ),
        pytest.param(
            "team-b",
            {"h100": F(0)},
            (),
            {"h100": {"budget": "500h/7d", "budgetUsed": "0h"}},
            id="nothing-used-is-0h",
        ),
        pytest.param(
            "team-c",
            {"a100": F(1800), "*": F(3_240_000)},
            (),
            {
                "a100": {"limit": "2", "budget": "30m/12h", "budgetUsed": "30m"},
                "*": {"budget": "900h/30d", "budgetUsed": "900h"},
            },
            id="a-budget-across-classes-is-reported-as-star-without-a-cap",
        ),
        pytest.param(
            "team-c",
            {"a100": F(1, 3), "h100": F(7200)},
            (Holding("team-c", "h100", F(1), "trainer"),),
            {
                "a100": {"limit": "2", "budget": "30m/12h", "budgetUsed": "0.01m"},
                "h100": {},
                "*": {"budget": "900h/30d"},
            },
            id="used-of-a-class-without-a-budget-is-not-said",
        ),
        pytest.param(
            "team-z",
            {"*": F(36_036)},
            (),
            {
                "t4": {"limit": "1"},
                "*": {"budget": "100h/1d", "budgetUsed": "10.01h"},
            },
            id="the-default-budget-of-an-unlisted-namespace",
        ),
        pytest.param(
            "team-d",
            {"h100": F(3600)},
            (),
            {"h100": {"limit": "1"}},
            id="no-budget-no-budget-fields",
        ),
    ],
)
def test_budgets_in_the_report(
    namespace: str,
    used: Mapping[str, F] | None,
    holdings: tuple[Holding, ...],
    expected: dict[str, dict[str, Any]],
) -> None:
    reported = rows(namespace, used, holdings)
    # Classes in name order, `*` last, as for limits.
    assert list(reported) == list(expected)
    assert {name: budget_fields(row) for name, row in reported.items()} == expected


def test_a_budget_only_class_reports_empty_counts() -> None:
    (row,) = rows("team-b", {"h100": F(108)}).values()
    assert row == {
        "namespace": "team-b",
        "class": "h100",
        "mode": "enforce",
        "inUse": "0",
        "reserved": "0",
        "waiting": 0,
        "waitingGpus": "0",
        "holders": [],
        "queue": [],
        "budget": "500h/7d",
        "budgetUsed": "0.03h",
    }


def test_the_star_budget_counts_every_class_like_a_cap() -> None:
    reported = rows(
        "team-c",
        {"*": F(0)},
        (Holding("team-c", "a100", F(1), "b"), Holding("team-c", "l4", F(1, 2), "a")),
    )
    assert list(reported) == ["a100", "l4", "*"]
    assert reported["*"]["inUse"] == "1.5"
    assert [h["pod"] for h in reported["*"]["holders"]] == ["a", "b"]
    assert "limit" not in reported["*"]


def test_the_admins_table_shows_each_budget_and_what_was_used() -> None:
    reports = namespace_report(
        "team-c",
        load_quotas(QUOTAS),
        (Holding("team-c", "a100", F(1), "train"),),
        [],
        [],
        budget_used={"a100": F(900), "*": F(3600 * 12)},
    )
    lines = table(reports).splitlines()
    assert re.split(" {2,}", lines[0])[7:9] == ["BUDGET", "BUDGET USED"]
    cells = {c[1]: c for c in (line.split() for line in lines[1:])}
    assert cells["a100"][3:] == ["2", "1", "0", "0", "30m/12h", "15m", "train", "(1)"]
    assert cells["*"][7:9] == ["900h/30d", "12h"]
