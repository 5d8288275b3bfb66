"""The index of a line (policies/quota/line.py) against the reference, `next_releases`'s sort."""

from __future__ import annotations

from fractions import Fraction as F
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.quota import line as line_module
from policies.quota import queue as queue_module
from policies.quota.judge import judge
from policies.quota.line import Line, key_of
from policies.quota.queue import Gangs, Waiting, in_line_order, next_releases
from policies.quota.quotas import ALL_CLASSES

CLASSES = ["a100", "t4", "h100"]


GANGS = ["job/g1", "gpuadm/g2"]


def waiting(
    name: str, class_name: str, charge: F, priority: int, second: int, gang: str = ""
) -> Waiting:
    return Waiting(
        uid=f"uid-{name}",
        namespace="team-q",
        name=name,
        class_name=class_name,
        charge=charge,
        priority=priority,
        created=f"2026-01-01T00:00:{second:02d}Z",
        gang=gang,
    )


pods = st.lists(
    st.tuples(
        st.sampled_from(CLASSES),
        st.integers(min_value=1, max_value=30).map(lambda tenths: F(tenths, 10)),
        st.integers(min_value=-1, max_value=2),
        st.integers(min_value=0, max_value=5),
        st.sampled_from(["", "", "", *GANGS]),
    ),
    max_size=25,
)
# What the leader knows of the gangs: a size (or none), pods running, the namespace's order.
gang_views = st.builds(
    lambda sizes, running, strict: Gangs(sizes, running, strict),
    st.dictionaries(st.sampled_from(GANGS), st.integers(min_value=1, max_value=6)),
    st.dictionaries(st.sampled_from(GANGS), st.integers(min_value=0, max_value=3)),
    st.booleans(),
)
knowledge = st.one_of(st.none(), gang_views)


def charged_counted(gangs: Gangs | None, charged: list[Waiting]) -> Gangs | None:
    """The reference is given the line less the pods charged already: count them as running."""
    if gangs is None:
        return None
    running = dict(gangs.running)
    for pod in charged:
        if pod.gang:
            running[pod.gang] = running.get(pod.gang, 0) + 1
    return Gangs(gangs.sizes, running, gangs.strict)


def units(released: tuple[Waiting, ...]) -> list[list[Waiting]]:
    """Split released pods into what goes together: a gang's pods, or one pod."""
    found: list[list[Waiting]] = []
    for pod in released:
        if pod.gang and found and found[-1][0].gang == pod.gang:
            found[-1].append(pod)
        else:
            found.append([pod])
    return found


def bounded_by(released: tuple[Waiting, ...], most: int) -> tuple[Waiting, ...]:
    """What a walk bounded to `most` releases: whole units, the first one even if larger."""
    taken: list[Waiting] = []
    for unit in units(released):
        if taken and len(taken) + len(unit) > most:
            break
        taken += unit
        if len(taken) >= most:
            break
    return tuple(taken)


limit_sets = st.dictionaries(
    st.sampled_from(["a100", "t4", ALL_CLASSES]),
    st.integers(min_value=0, max_value=40).map(lambda tenths: F(tenths, 10)),
)
usages = st.dictionaries(
    st.sampled_from(CLASSES),
    st.integers(min_value=0, max_value=20).map(lambda tenths: F(tenths, 10)),
)


def build(drawn: list[tuple[str, F, int, int, str]], prefix: str) -> list[Waiting]:
    return [waiting(f"{prefix}{i:02d}", *each) for i, each in enumerate(drawn)]


@settings(max_examples=400)
@given(
    pods,
    pods,
    usages,
    limit_sets,
    st.sets(st.integers(min_value=0, max_value=24)),
    knowledge,
    st.data(),
)
def test_a_place_in_the_index_is_the_place_the_sort_gives(
    indexed: list[tuple[str, F, int, int, str]],
    extra: list[tuple[str, F, int, int, str]],
    in_use: dict[str, F],
    limits: dict[str, F],
    left_out: set[int],
    gangs: Gangs | None,
    data: st.DataObject,
) -> None:
    line_pods = build(indexed, "p")
    extras = build(extra[:4], "x")
    index = Line(line_pods[: len(line_pods) // 2])
    for pod in line_pods[len(line_pods) // 2 :]:  # some built at once, some added one by one
        index.add(pod)
    excluded = {line_pods[i].uid for i in left_out if i < len(line_pods)}
    # The index sorted for other limits before (a quota change) answers for these ones.
    index.walk("team-q", in_use, data.draw(limit_sets))
    # The pod asked about: a new one, or one of the line.
    of_the_line: bool = data.draw(st.booleans())
    if line_pods and of_the_line:
        me = data.draw(st.sampled_from(line_pods))
    else:
        me = waiting("me", *data.draw(pods.filter(bool))[0])
    rest = [p for p in line_pods if p.uid not in excluded and p.uid != me.uid]
    charged = [p for p in line_pods if p.uid in excluded and p.uid != me.uid]
    known = charged_counted(gangs, charged)
    expected = next_releases("team-q", [*rest, *extras, me], in_use, limits, known)
    place = index.place("team-q", me, in_use, limits, excluded=excluded, extras=extras, gangs=gangs)
    if any(p.uid == me.uid for p in expected.released):
        assert place is None
    else:
        (wanted,) = [p for p in expected.waiting if p.pod.uid == me.uid]
        assert place == wanted


@settings(max_examples=400)
@given(
    pods,
    usages,
    limit_sets,
    st.sets(st.integers(min_value=0, max_value=24)),
    knowledge,
    st.data(),
)
def test_a_walk_releases_what_the_sort_releases_and_stops_at_its_bound(
    indexed: list[tuple[str, F, int, int, str]],
    in_use: dict[str, F],
    limits: dict[str, F],
    left_out: set[int],
    gangs: Gangs | None,
    data: st.DataObject,
) -> None:
    line_pods = build(indexed, "p")
    index = Line(line_pods)
    excluded = {line_pods[i].uid for i in left_out if i < len(line_pods)}
    charged = [p for p in line_pods if p.uid in excluded]
    expected = next_releases(
        "team-q",
        [p for p in line_pods if p.uid not in excluded],
        in_use,
        limits,
        charged_counted(gangs, charged),
    )
    walked = index.walk("team-q", in_use, limits, excluded=excluded, gangs=gangs)
    assert walked.released == expected.released
    assert walked.complete
    most = data.draw(st.integers(min_value=1, max_value=5))
    bounded = index.walk("team-q", in_use, limits, excluded=excluded, most=most, gangs=gangs)
    assert bounded.released == bounded_by(expected.released, most)
    # Stopped at its bound, it says more may fit; else it went as far as the sort.
    assert bounded.complete is (len(expected.released) < most)


@given(pods, st.data())
def test_the_index_keeps_line_order_as_pods_come_and_go(
    drawn: list[tuple[str, F, int, int, str]], data: st.DataObject
) -> None:
    line_pods = build(drawn, "p")
    index = Line()
    for pod in line_pods:
        index.add(pod)
    gone = data.draw(st.sets(st.sampled_from(line_pods))) if line_pods else set()
    for pod in gone:
        index.remove(pod.uid)
    index.remove("uid-absent")
    kept = [p for p in line_pods if p not in gone]
    assert list(index.ordered()) == in_line_order(kept)
    assert len(index) == len(kept)
    assert all(p.uid in index for p in kept)
    assert not any(p.uid in index for p in gone)
    # Walking from a cursor gives the rest of the line in order.
    order = in_line_order(kept)
    for at in range(len(order)):
        assert index.after(key_of(order[at]), 3) == order[at + 1 : at + 4]
    assert index.after(None, 2) == order[:2]


def test_a_place_in_a_long_line_visits_only_the_pods_that_decide_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No pass over the line: with 2,000 pods waiting, a newcomer's place is decided by the
    head of each class (the pod that does not fit), whatever the line's length."""
    judged: list[str] = []
    real = judge

    def counting(**kwargs: Any) -> Any:
        judged.append(kwargs["class_name"])
        return real(**kwargs)

    # The walk judges each pod it visits through the line's shared step, in queue.py.
    monkeypatch.setattr(line_module, "judge", counting)
    monkeypatch.setattr(queue_module, "judge", counting)
    long = [waiting(f"p{i:04d}", "a100", F(1), 0, i % 60) for i in range(2000)]
    huge = [waiting(f"h{i:04d}", "t4", F(5), 0, i % 60) for i in range(2000)]  # never fit
    index = Line([*long, *huge])
    limits = {"a100": F(1), "t4": F(2)}
    me = waiting("zz-new", "a100", F(1, 2), 0, 59)
    place = index.place("team-q", me, {"a100": F(1, 2)}, limits)
    assert place is not None
    assert place.ahead == 2000
    assert judged == ["a100"]  # the head of the a100 line; the t4 pods can never fit
    judged.clear()
    place = index.place("team-q", waiting("zz-t4", "t4", F(1), 0, 59), {}, limits)
    assert place is None  # fits: the 2,000 t4 pods ahead of it hold back no one
    # Nothing in use: the a100 line's head would go, the next holds its class, then the
    # newcomer itself. None of the t4 pods that can never fit is visited.
    assert judged == ["a100", "a100", "t4"]
