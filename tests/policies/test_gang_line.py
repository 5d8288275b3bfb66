"""Gangs in queue mode's line: a gang's pods go together once it is whole and fits, or none."""

from __future__ import annotations

from fractions import Fraction as F

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.quota.queue import Gangs, Waiting, next_releases
from policies.quota.quotas import ALL_CLASSES

A100 = {"a100": F(2)}


def pod(name: str, second: int, *, gang: str = "", charge: str = "1", cls: str = "a100") -> Waiting:
    return Waiting(
        uid=f"uid-{name}",
        namespace="team-q",
        name=name,
        class_name=cls,
        charge=F(charge),
        priority=0,
        created=f"2026-01-01T00:00:{second:02d}Z",
        gang=gang,
    )


def job(name: str, count: int, first: int = 0, charge: str = "1") -> list[Waiting]:
    return [pod(f"{name}-{i}", first + i, gang=f"job/{name}", charge=charge) for i in range(count)]


def known(*, strict: bool = False, running: dict[str, int] | None = None, **sizes: int) -> Gangs:
    return Gangs({f"job/{k}": v for k, v in sizes.items()}, running or {}, strict)


@pytest.mark.parametrize(
    ("line", "in_use", "limits", "gangs", "released"),
    [
        pytest.param(
            job("train", 3),
            {"a100": F(1)},
            {"a100": F(3)},
            known(train=3),
            [],
            id="three-against-room-for-two",
        ),
        pytest.param(
            job("train", 3),
            {},
            {"a100": F(3)},
            known(train=3),
            ["train-0", "train-1", "train-2"],
            id="three-with-room-for-three-go-together",
        ),
        pytest.param(
            job("train", 2), {}, {"a100": F(3)}, known(train=3), [], id="not-whole-none-goes"
        ),
        pytest.param(
            job("train", 1),
            {},
            {"a100": F(3)},
            known(train=3, running={"job/train": 2}),
            ["train-0"],
            id="a-replaced-worker-completes-its-running-gang",
        ),
        pytest.param(
            [*job("train", 3), pod("small", 9)],
            {"a100": F(1)},
            {"a100": F(3)},
            known(train=3),
            [],
            id="a-whole-gang-that-waits-for-room-holds-back-small-pods",
        ),
        pytest.param(
            [*job("train", 2), pod("small", 9)],
            {},
            A100,
            known(train=3),
            ["small"],
            id="besteffort-small-pods-pass-a-gang-not-yet-whole",
        ),
        pytest.param(
            [*job("train", 2), pod("small", 9)],
            {},
            A100,
            known(train=3, strict=True),
            [],
            id="strict-nothing-passes-a-gang-not-yet-whole",
        ),
        pytest.param(
            [*job("train", 2), pod("small", 9)],
            {},
            A100,
            None,
            [],
            id="unknown-at-admission-the-gang-is-a-head-that-waits",
        ),
        pytest.param(
            [*job("huge", 3), pod("small", 9)],
            {},
            A100,
            known(huge=3),
            ["small"],
            id="a-gang-that-can-never-fit-holds-back-no-one",
        ),
        pytest.param(
            [*job("train", 2), pod("t4", 9, cls="t4")],
            {},
            A100,
            known(train=2, strict=True),
            ["train-0", "train-1", "t4"],
            id="other-limits-go-past",
        ),
        pytest.param(
            [pod("first", 0), *job("train", 2, first=1)],
            {},
            A100,
            known(train=2),
            ["first"],
            id="the-pod-ahead-takes-room-first",
        ),
        pytest.param(
            job("train", 2),
            {},
            {ALL_CLASSES: F(1)},
            known(train=2),
            [],
            id="the-cap-counts-the-gang",
        ),
        pytest.param(
            [*job("a", 2), *job("b", 2, first=5)],
            {},
            A100,
            known(a=2, b=2),
            ["a-0", "a-1"],
            id="two-gangs-for-one-room-the-first-goes-the-second-waits",
        ),
    ],
)
def test_a_gang_goes_whole_or_not_at_all(
    line: list[Waiting],
    in_use: dict[str, F],
    limits: dict[str, F],
    gangs: Gangs | None,
    released: list[str],
) -> None:
    outcome = next_releases("team-q", line, in_use, limits, gangs)
    assert [p.name for p in outcome.released] == released


@pytest.mark.parametrize(
    ("line", "gangs", "limits", "reason"),
    [
        pytest.param(
            job("train", 3),
            known(train=3),
            A100,
            "namespace \"team-q\": a100 quota: the gang 'train' (job) needs 3 at once for its 3 "
            "waiting pods, more than the whole limit of 2, so it could never run; it waits "
            "until the limit grows",
            id="never",
        ),
        pytest.param(
            job("train", 3),
            known(train=3),
            {"a100": F(4)},
            "namespace \"team-q\": a100 quota has no room for the gang 'train' (job): its 3 "
            "waiting pods need 3 at once, in use 2 of 4",
            id="no-room",
        ),
        pytest.param(
            job("train", 2),
            known(train=3),
            {"a100": F(4)},
            "the gang 'train' (job) is not whole: 2 of its 3 pods exist, it waits for 1 more",
            id="missing",
        ),
        pytest.param(
            job("train", 2),
            Gangs({}, {}, unknown={"job/train": "its Job is gone"}),
            {"a100": F(4)},
            "the gang 'train' (job) waits: its Job is gone",
            id="unknown-size",
        ),
    ],
)
def test_why_a_gang_waits_is_said_to_each_of_its_pods(
    line: list[Waiting], gangs: Gangs, limits: dict[str, F], reason: str
) -> None:
    outcome = next_releases("team-q", line, {"a100": F(2)}, limits, gangs)
    assert outcome.released == ()
    assert [p.reason for p in outcome.waiting] == [reason] * len(line)
    assert {p.ahead for p in outcome.waiting} == {0}


def test_the_pods_behind_a_gang_are_told_it_holds_the_room() -> None:
    outcome = next_releases(
        "team-q",
        [*job("train", 3), pod("small", 9)],
        {"a100": F(1)},
        {"a100": F(3)},
        known(train=3),
    )
    small = outcome.waiting[-1]
    assert small.pod.name == "small"
    assert small.ahead == 3
    assert "quota is held for the pods ahead (in use 1 of 3)" in small.reason


@given(
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=0, max_value=6),
    st.integers(min_value=0, max_value=8),
    st.integers(min_value=0, max_value=3),
)
def test_a_gang_goes_exactly_when_whole_and_its_demand_fits(
    size: int, waiting: int, room: int, running: int
) -> None:
    """The boundary both ways: whole is `present >= size`, fits is `demand <= room`."""
    line = job("g", waiting)
    outcome = next_releases(
        "team-q", line, {}, {"a100": F(room)}, known(g=size, running={"job/g": running})
    )
    goes = waiting > 0 and waiting + running >= size and waiting <= room
    assert len(outcome.released) == (waiting if goes else 0)
