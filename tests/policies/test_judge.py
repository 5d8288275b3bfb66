"""Quota judgement, as a table: limits, totals, shares, unlimited vs 0, warn mode, messages."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from policies.quota.judge import judge, room_to_set_aside


@pytest.mark.parametrize(
    ("requested", "in_use", "limits", "allowed", "message"),
    [
        pytest.param(
            F(2),
            {"a100": F(7, 2)},
            {"a100": F(4)},
            False,
            'namespace "team-a": a100 quota exceeded: requested 2, in use 3.5 of 4',
            id="spec-example-message",
        ),
        pytest.param(F(1, 2), {"a100": F(7, 2)}, {"a100": F(4)}, True, None, id="fills-exactly"),
        pytest.param(
            F(1),
            {},
            {"a100": F(0)},
            False,
            'namespace "team-a": a100 quota exceeded: requested 1, in use 0 of 0',
            id="zero-forbids",
        ),
        pytest.param(F(100), {}, {"t4": F(1)}, True, None, id="unlisted-class-is-unlimited"),
        pytest.param(F(100), {}, {}, True, None, id="no-limits-at-all"),
        pytest.param(
            F(1),
            {"a100": F(1), "t4": F(4)},
            {"a100": F(4), "*": F(5)},
            False,
            'namespace "team-a": all classes ("*") quota exceeded: requested 1, in use 5 of 5',
            id="total-across-classes",
        ),
        pytest.param(
            F(1, 10), {"a100": F(9, 10)}, {"a100": F(1)}, True, None, id="tenth-fills-one-exactly"
        ),
        pytest.param(
            F(1, 10),
            {"a100": F(1)},
            {"a100": F(1)},
            False,
            "requested 0.1, in use 1 of 1",
            id="tenth-over-a-full-quota",
        ),
        pytest.param(
            F(1, 7), {"a100": F(6, 7)}, {"a100": F(1)}, True, None, id="sevenths-add-up-exactly"
        ),
        pytest.param(F(1, 4), {"a100": F(2)}, {"a100": F(9, 4)}, True, None, id="fractional-limit"),
    ],
)
def test_judge(
    requested: F, in_use: dict[str, F], limits: dict[str, F], allowed: bool, message: str | None
) -> None:
    verdict = judge(
        namespace="team-a", class_name="a100", requested=requested, in_use=in_use, limits=limits
    )
    assert verdict.allowed == allowed
    if message is None:
        assert verdict.message is None
    else:
        assert verdict.message is not None
        assert message in verdict.message


def test_ten_pods_of_a_tenth_fill_a_quota_of_one() -> None:
    used = F(0)
    admitted = 0
    for _ in range(11):
        verdict = judge(
            namespace="n",
            class_name="a100",
            requested=F("0.1"),
            in_use={"a100": used},
            limits={"a100": F(1)},
        )
        if verdict.allowed:
            used += F("0.1")
            admitted += 1
    assert admitted == 10
    assert used == 1


@pytest.mark.parametrize(
    ("requested", "in_use", "warned"),
    [
        pytest.param(F(1), F(2), False, id="75-percent-is-quiet"),
        pytest.param(F(1, 2), F(3), False, id="exactly-90-percent-is-quiet"),
        pytest.param(F(1), F(27, 10), True, id="above-90-percent-warns"),
        pytest.param(F(1), F(3), True, id="full-warns"),
    ],
)
def test_nearly_full_warning(requested: F, in_use: F, warned: bool) -> None:
    verdict = judge(
        namespace="team-a",
        class_name="a100",
        requested=requested,
        in_use={"a100": in_use},
        limits={"a100": F(4)},
    )
    assert verdict.allowed
    assert bool(verdict.warnings) == warned
    if warned:
        assert "a100 quota is" in verdict.warnings[0]


def test_warn_mode_admits_and_says_what_enforce_would_do() -> None:
    verdict = judge(
        namespace="team-a",
        class_name="a100",
        requested=F(2),
        in_use={"a100": F(7, 2)},
        limits={"a100": F(4)},
        mode="warn",
    )
    assert verdict.allowed
    assert verdict.would_deny
    assert "a100 quota exceeded: requested 2, in use 3.5 of 4" in verdict.warnings[0]
    assert "enforce would deny" in verdict.warnings[0]


def test_verdict_reports_usage_and_limit_of_the_class() -> None:
    verdict = judge(
        namespace="n",
        class_name="a100",
        requested=F(1),
        in_use={"a100": F(1)},
        limits={"a100": F(4), "*": F(8)},
    )
    assert (verdict.in_use, verdict.limit) == (F(1), F(4))


@pytest.mark.parametrize(
    ("largest", "in_use", "limits", "room"),
    [
        pytest.param({"a100": F(1)}, {"a100": F(1)}, {"a100": F(10)}, {"a100": F(9, 2)}, id="half"),
        pytest.param({"a100": F(1)}, {"a100": F(9)}, {"a100": F(10)}, {}, id="too-small"),
        pytest.param({"a100": F(1)}, {}, {"h100": F(10)}, {}, id="unlimited"),
        pytest.param(
            {"a100": F(1), "h100": F(1)},
            {"a100": F(1), "h100": F(1)},
            {"a100": F(5), "h100": F(10), "*": F(6)},
            {"a100": F(2), "h100": F(1)},
            id="the-cap-shared-in-turn",
        ),
        pytest.param({"a100": F(1, 4)}, {}, {"*": F(1)}, {"a100": F(1, 2)}, id="cap-only"),
    ],
)
def test_room_set_aside_is_half_of_what_is_free_if_a_pod_fits_it(
    largest: dict[str, F], in_use: dict[str, F], limits: dict[str, F], room: dict[str, F]
) -> None:
    assert room_to_set_aside(largest, in_use, limits) == room
