"""Cohorts' rules: who may hold what, which pods are borrowed, and what reclaim evicts."""

from __future__ import annotations

from fractions import Fraction as F

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.loading import ConfigError, load_quotas
from policies.quota.cohorts import (
    Cohort,
    Entry,
    Held,
    Member,
    Reclaim,
    Unit,
    borrowed_pods,
    candidates,
    problems,
    reclaim_plan,
    settled,
)

QUOTAS = """\
mode: queue
namespaces:
  team-a:
    cohort: research
    a100: 4
    borrow: {a100: 2}
  team-b:
    cohort: research
    a100: 4
    lend: {a100: 3}
    reclaim: lowerPriority
"""


def cohort(quotas: str = QUOTAS) -> Cohort:
    found = load_quotas(quotas).cohort_of("team-a")
    assert found is not None
    return found


def test_the_issue_s_example_reads_with_kueue_s_defaults() -> None:
    quotas = load_quotas(QUOTAS)
    research = cohort()
    assert quotas.cohort_of("team-b") == research
    assert quotas.record_key("team-a") == quotas.record_key("team-b") == "cohort.research"
    assert quotas.record_key("team-z") == "team-z"
    a, b = research.members["team-a"], research.members["team-b"]
    assert a.reclaim == "never"
    assert b.reclaim == "lowerPriority"
    assert a.lendable("a100") == 4  # no `lend`: all of its nominal quota
    assert b.lendable("a100") == 3
    assert b.guaranteed("a100") == 1
    assert b.ceiling("a100") is None  # no `borrow`: bounded by the pool alone
    assert research.pool("a100") == 7


@pytest.mark.parametrize(
    ("change", "line", "words"),
    [
        (("{a100: 2}", "{a100: 2x}"), 6, "namespaces.team-a.borrow.a100: '2x' is not a quantity"),
        (("borrow: {a100: 2}", "borrow: {t4: 2}"), 6, "team-a has no t4 limit"),
        (("borrow: {a100: 2}", 'borrow: {"*": 2}'), 6, '"*" is not a class'),
        (("lend: {a100: 3}", "lend: {a100: 5}"), 10, "lends 5, more than its a100 limit of 4"),
        (
            ("    a100: 4\n    borrow", '    "*": 5\n    a100: 4\n    borrow'),
            5,
            '"*": 5 is below a100: 4 plus borrow 2',
        ),
        (("  team-b:\n    cohort: research\n", "  team-b:\n"), 9, "lend needs a cohort"),
        (("    reclaim: lowerPriority\n", "    reclaim: sometimes\n"), 11, "reclaim"),
        (
            ("cohort: research\n    a100: 4\n    lend", "cohort: other\n    a100: 4\n    lend"),
            4,
            "cohort 'research' has no other member",
        ),
        (
            (
                "cohort: research\n    a100: 4\n    borrow",
                "cohort: Research!\n    a100: 4\n    borrow",
            ),
            4,
            "is not a cohort name",
        ),
        (
            ("mode: queue\n", "mode: queue\ndefault:\n  cohort: research\n"),
            3,
            "does not go under `default`",
        ),
    ],
)
def test_check_config_refuses_contradictions_naming_the_line(
    change: tuple[str, str], line: int, words: str
) -> None:
    text = QUOTAS.replace(*change, 1)
    assert text != QUOTAS
    with pytest.raises(ConfigError) as refused:
        load_quotas(text)
    problem = refused.value.problems[0]
    assert problem.startswith(f"quotas.yaml:{line}:"), problem
    assert words in problem


def entry(
    cohort: str | None,
    limits: dict[str, int],
    borrow: dict[str, int] | None = None,
    lend: dict[str, int] | None = None,
    reclaim: Reclaim | None = None,
) -> Entry:
    def fractions(amounts: dict[str, int] | None) -> dict[str, F]:
        return {c: F(v) for c, v in (amounts or {}).items()}

    return Entry(cohort, fractions(limits), fractions(borrow), fractions(lend), reclaim)


def test_every_contradiction_is_found_whatever_comes_before_it() -> None:
    no_limit = "has no t4 limit, so it holds as many as it likes and {} nothing"
    found = problems(
        {
            "team-0": entry(None, {"a100": 1}),  # fine, and first: the others are still read
            "team-y": entry(None, {"a100": 1}, borrow={"a100": 1}),
            "team-z": entry(None, {"a100": 1}, reclaim="any"),
            "team-a": entry(
                "research",
                {"a100": 4, "*": 5},
                borrow={"t4": 1, "a100": 2},
                lend={"a100": 4},  # all of its nominal quota: allowed
            ),
            "team-b": entry("research", {"a100": 4}, lend={"t4": 1}),
            "team-c": entry("research", {"a100": 4, "*": 6}, borrow={"a100": 2}),  # just fits
        }
    )
    assert [(".".join(path), why.split(":")[0]) for path, why in found] == [
        ("namespaces.team-y.borrow", "borrow needs a cohort"),
        ("namespaces.team-z.reclaim", "reclaim needs a cohort"),
        ("namespaces.team-a.borrow.t4", "team-a " + no_limit.format("borrows")),
        ("namespaces.team-a.*", '"*"'),
        ("namespaces.team-b.lend.t4", "team-b " + no_limit.format("lends")),
    ]
    assert found[0][1] == "borrow needs a cohort: add `cohort: <name>` to team-y"
    assert found[1][1] == "reclaim needs a cohort: add `cohort: <name>` to team-z"
    assert found[3][1] == (
        '"*": 5 is below a100: 4 plus borrow 2: it could never borrow all of that; '
        'raise "*" to 6 or lower borrow'
    )


def test_a_class_the_policy_lacks_is_named_in_borrow_and_lend() -> None:
    from policies.loading import load_policy
    from tests.builders import POLICY_YAML

    quotas = load_quotas(QUOTAS.replace("a100", "a200"))
    paths = [path for path, _ in quotas.unknown_class_paths(load_policy(POLICY_YAML))]
    assert ("namespaces", "team-a", "borrow", "a200") in paths
    assert ("namespaces", "team-b", "lend", "a200") in paths


def usage(a: int | F, b: int | F) -> dict[str, dict[str, F]]:
    return {"team-a": {"a100": F(a)}, "team-b": {"a100": F(b)}}


@pytest.mark.parametrize(
    ("a", "b", "reach_a", "reach_b"),
    [
        (0, 0, 6, 8),  # a: 4 + borrow 2; b: its 1 guaranteed + the whole pool of 7
        (6, 0, 6, 2),  # a borrows 2 of b's 3 lent: b keeps 1 guaranteed + 1 lent and idle
        (6, 2, 6, 2),
        (4, 4, 4, 4),  # everyone at nominal: no one borrows
        (0, 8, 0, 8),  # b draws the whole pool of 7: a, which guarantees itself none, gets 0
    ],
)
def test_reach_is_the_guaranteed_part_plus_what_others_leave_of_the_pool(
    a: int, b: int, reach_a: int, reach_b: int
) -> None:
    research = cohort()
    assert research.reach("team-a", "a100", usage(a, b)) == reach_a
    assert research.reach("team-b", "a100", usage(a, b)) == reach_b


def test_needs_back_only_what_is_the_claimant_s_own() -> None:
    research = cohort()
    # a holds 6 (2 borrowed); b holding 1 may reach 2: its 1 guaranteed, and 1 left of 7.
    assert research.needs_back("team-b", "a100", F(1), usage(6, 1)) == 0
    # b holding 2 is at its reach: what it asks within its nominal 4 must come back.
    assert research.needs_back("team-b", "a100", F(1), usage(6, 2)) == 1
    assert research.needs_back("team-b", "a100", F(2), usage(6, 2)) == 2
    assert research.needs_back("team-b", "a100", F(3), usage(6, 2)) == 0  # past nominal: none


def test_lent_adds_up_to_what_is_borrowed() -> None:
    research = cohort()
    lent = research.lent("a100", usage(6, 1))
    assert sum(lent.values()) == 2
    assert lent["team-b"] == 2
    assert lent["team-a"] == 0
    assert research.lent("a100", usage(4, 4)) == {"team-a": 0, "team-b": 0}


def three() -> Cohort:
    """A lends all of its 4; b and c lend 2 of their 4 and keep 2 guaranteed: a pool of 8."""
    return Cohort(
        "three",
        {
            "a": Member("a", {"a100": F(4)}, {}, {}),
            "b": Member("b", {"a100": F(4)}, {}, {"a100": F(2)}),
            "c": Member("c", {"a100": F(4)}, {}, {"a100": F(2)}),
        },
    )


@pytest.mark.parametrize(
    ("held", "lent"),
    [
        # a borrows 2; b draws 1 of its 2 lent, c none: 1 and 2 idle, shared 1/3 and 2/3.
        ({"a": 6, "b": 3, "c": 0}, {"a": 0, "b": F(2, 3), "c": F(4, 3)}),
        # a borrows 3, all that is idle: b's 1 and c's 2.
        ({"a": 7, "b": 3, "c": 0}, {"a": 0, "b": 1, "c": 2}),
        # c holds nothing and is not in the record at all: it is idle like one that holds 0.
        ({"a": 6, "b": 3}, {"a": 0, "b": F(2, 3), "c": F(4, 3)}),
        # Borrowers hold more than is idle (an admin lowered `lend`): the idle is lent.
        ({"a": 6, "b": 4, "c": 3}, {"a": 0, "b": 0, "c": 1}),
        # Borrowed with nothing idle: nothing is lent, and nothing divides by zero.
        ({"a": 6, "b": 4, "c": 4}, {"a": 0, "b": 0, "c": 0}),
        ({"a": 4, "b": 4, "c": 4}, {"a": 0, "b": 0, "c": 0}),
    ],
)
def test_what_is_borrowed_is_lent_by_the_idle_in_proportion(
    held: dict[str, int], lent: dict[str, int | F]
) -> None:
    usage = {ns: {"a100": F(amount)} for ns, amount in held.items()}
    assert three().lent("a100", usage) == lent


def test_a_member_missing_from_the_record_holds_nothing() -> None:
    research = cohort()
    only_a = {"team-a": {"a100": F(6)}}
    assert research.reach("team-b", "a100", only_a) == 2
    assert research.reach("team-b", "a100", {}) == 8
    assert research.needs_back("team-b", "a100", F(3), only_a) == 1
    assert research.needs_back("team-b", "a100", F(1), {"team-a": {}}) == 0


SPLIT_QUOTAS = """\
mode: queue
namespaces:
  team-a:
    cohort: research
    a100: 4
    t4: 2
    reclaim: any
  team-b:
    cohort: research
    a100: 4
"""


def test_a_class_a_member_has_no_limit_of_is_neither_lent_nor_borrowed_by_it() -> None:
    """team-b may run as many T4s as it likes: they are its own, not team-a's lent quota."""
    research = load_quotas(SPLIT_QUOTAS).cohort_of("team-a")
    assert research is not None
    assert research.classes() == ["a100", "t4"]
    usage = {"team-a": {"t4": F(0)}, "team-b": {"t4": F(5)}}
    assert research.pool("t4") == 2
    assert research.reach("team-a", "t4", usage) == 2
    assert research.drawn("team-b", "t4", F(5)) == 0
    assert research.borrowed("team-b", "t4", F(5)) == 0
    assert research.lent("t4", usage) == {"team-a": 0, "team-b": 0}
    assert research.needs_back("team-a", "t4", F(2), usage) == 0
    assert research.needs_back("team-b", "t4", F(1), usage) == 0
    t4s = [Held(f"t{i}", "team-b", f"t{i}", "t4", F(1), created=i) for i in range(5)]
    assert research.borrowed_pods("team-b", "t4", t4s) == []
    assert candidates(research, "team-a", "t4", 100, {"team-b": t4s}) == []
    # team-b's limits of the moment: a100 at its reach, and still no t4 limit.
    assert research.limits_now("team-b", {"a100": F(4)}, usage) == {"a100": 8}
    # The class they share is shared as before.
    assert research.borrowed("team-b", "a100", F(5)) == 1


def pod(
    name: str,
    ns: str = "team-a",
    *,
    charge: int | F = 1,
    priority: int = 0,
    created: float = 0,
    gang: str = "",
    ending: bool = False,
) -> Held:
    return Held(name, ns, name, "a100", F(charge), priority, created, gang, ending)


def test_the_borrowed_pods_are_the_newest_of_the_lowest_priority() -> None:
    pods = [
        pod("old", created=1),
        pod("new", created=3),
        pod("vip", created=4, priority=10),
        pod("mid", created=2),
    ]
    assert [p.name for p in borrowed_pods(F(2), pods)] == ["mid", "new"]
    assert borrowed_pods(F(4), pods) == []
    # A pod partly beyond the nominal quota is borrowed; one being deleted is left out.
    assert [p.name for p in borrowed_pods(F(3, 2), pods)] == ["old", "mid", "new"]
    assert [p.name for p in borrowed_pods(F(2), [*pods[:3], pod("mid", ending=True)])] == ["new"]


def big() -> Cohort:
    nominal = {"a100": F(2)}
    return Cohort(
        "big",
        {
            "lender": Member("lender", {"a100": F(4)}, {}, {}, "lowerPriority"),
            "x": Member("x", nominal, {}, {}, "never"),
            "y": Member("y", nominal, {}, {}, "never"),
        },
    )


def test_candidates_go_lowest_priority_then_newest_and_gangs_whole() -> None:
    held = {
        "x": [pod("x1", "x", created=1), pod("x2", "x", created=2), pod("x3", "x", created=5)],
        "y": [
            pod("g1", "y", gang="g", created=1),
            pod("g2", "y", gang="g", created=2),
            pod("g3", "y", gang="g", created=3),
        ],
    }
    units = candidates(big(), "lender", "a100", 5, held)
    # x3, created at 5, is newer than the gang, whose newest pod was created at 3.
    assert [[p.name for p in u.pods] for u in units] == [["x3"], ["g1", "g2", "g3"]]
    # lowerPriority: pods of the claimant's priority or above are not candidates.
    assert candidates(big(), "lender", "a100", 0, held) == []
    assert [u.pods[0].name for u in candidates(big(), "lender", "a100", 1, held)] == ["x3", "g1"]
    assert candidates(big(), "x", "a100", 9, held) == []  # reclaim: never


def test_a_reclaim_evicts_only_what_the_waiting_pod_needs_or_nothing() -> None:
    research = big()
    held = {"x": [pod(f"x{i}", "x", created=i) for i in range(5)], "y": []}
    now = {"lender": {"a100": F(1)}, "x": {"a100": F(5)}, "y": {}}
    units = candidates(research, "lender", "a100", 5, held)
    assert [u.pods[0].name for u in units] == ["x4", "x3", "x2"]
    assert [u.pods[0].name for u in reclaim_plan(research, "lender", "a100", F(2), now, units)] == [
        "x4",
        "x3",
    ]
    assert reclaim_plan(research, "lender", "a100", F(4), now, units) == []  # 3 at most
    assert reclaim_plan(research, "lender", "a100", F(0), now, units) == []


def test_settled_counts_pods_being_deleted_as_gone() -> None:
    held = {"x": [pod("x1", "x", ending=True), pod("x2", "x")]}
    assert settled({"x": {"a100": F(2)}}, "a100", held) == {"x": {"a100": F(1)}}
    # A member the record shows nothing of, or nothing of the class, holds none after.
    assert settled({}, "a100", held) == {"x": {"a100": 0}}
    assert settled({"x": {"t4": F(1)}}, "a100", held) == {"x": {"t4": 1, "a100": 0}}


def test_a_member_gives_back_only_what_it_draws_however_many_of_its_pods_go() -> None:
    """b keeps 2 guaranteed: holding 4, it draws 2 from the pool, and its third pod to go
    gives none back. A member missing from the record holds nothing."""
    research = three()
    units = [Unit((pod(f"b{i}", "b"),)) for i in range(3)]
    usage = {"b": {"a100": F(4)}}
    assert reclaim_plan(research, "a", "a100", F(2), usage, units) == units[:2]
    assert reclaim_plan(research, "a", "a100", F(3), usage, units) == []


def test_a_gang_goes_whole_and_alone() -> None:
    """The gang's pods go together, its ending one aside; the namespace's other pods are not
    in its unit. A member with no pods of the class has none to give."""
    held = {
        "x": [
            pod("solo", "x", created=0),
            pod("g1", "x", gang="g", created=1),
            pod("g2", "x", gang="g", created=2),
            pod("g3", "x", gang="g", created=3, ending=True),
            pod("g4", "x", gang="g", created=4),
        ]
    }
    units = candidates(big(), "lender", "a100", 5, held)
    assert [[p.name for p in u.pods] for u in units] == [["g1", "g2", "g4"]]


def test_a_members_cap_over_all_classes_is_its_own() -> None:
    quotas = QUOTAS.replace("    a100: 4\n    borrow", '    "*": 6\n    a100: 4\n    borrow')
    research = load_quotas(quotas).cohort_of("team-a")
    assert research is not None
    assert research.classes() == ["a100"]
    limits = {"a100": F(4), "*": F(6)}
    assert research.limits_now("team-a", limits, usage(0, 0)) == {"a100": 6, "*": 6}
    assert research.widest("team-a", limits) == {"a100": 6, "*": 6}


def test_namespaces_outside_a_cohort_leave_the_cohorts_whole() -> None:
    quotas = load_quotas(QUOTAS.replace("namespaces:\n", "namespaces:\n  team-0: {a100: 1}\n"))
    research = quotas.cohort_of("team-b")
    assert research is not None
    assert sorted(research.members) == ["team-a", "team-b"]
    assert quotas.cohort_of("team-0") is None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(1, 4)), max_size=40),
    st.lists(st.integers(0, 4), min_size=3, max_size=3),
    st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=3, max_size=3),
    st.lists(st.one_of(st.none(), st.integers(0, 4)), min_size=3, max_size=3),
)
def test_admitting_by_reach_never_draws_more_than_the_pool(
    asks: list[tuple[int, int]],
    nominal: list[int],
    lend: list[int | None],
    borrow: list[int | None],
) -> None:
    names = ["n0", "n1", "n2"]
    members = {
        n: Member(
            n,
            {"a100": F(nominal[i])},
            {} if (most := borrow[i]) is None else {"a100": F(most)},
            {} if (given := lend[i]) is None else {"a100": F(min(given, nominal[i]))},
        )
        for i, n in enumerate(names)
    }
    research = Cohort("c", members)
    held = {n: {"a100": F(0)} for n in names}
    for who, quarters in asks:
        ns, charge = names[who], F(quarters, 4)
        used = held[ns]["a100"]
        fits = used + charge <= research.reach(ns, "a100", held)
        if fits:
            held[ns]["a100"] = used + charge
        drawn = sum(research.drawn(n, "a100", held[n]["a100"]) for n in names)
        assert drawn <= research.pool("a100")
        for n in names:
            ceiling = members[n].ceiling("a100")
            assert ceiling is None or held[n]["a100"] <= ceiling
        # A pod within the namespace's guaranteed part always fits.
        if used + charge <= members[ns].guaranteed("a100"):
            assert fits
        # And one that draws nothing past what the pool has left fits: the bound is tight.
        if not fits:
            others = research.drawn_by_others(ns, "a100", held)
            over = research.drawn(ns, "a100", used + charge)
            ceiling = members[ns].ceiling("a100")
            assert over + others > research.pool("a100") or (
                ceiling is not None and used + charge > ceiling
            )


def test_widest_limits_are_a_members_reach_at_its_most_and_a_loners_own() -> None:
    quotas = load_quotas(QUOTAS + "  solo:\n    a100: 2\n")
    # The pool is 7: team-a lends all its 4 (no `lend`), team-b 3 of its 4.
    # team-a: guaranteed 0, plus the pool, within 4 + borrow 2.
    assert quotas.widest_limits_for("team-a")["a100"] == 6
    # team-b: guaranteed 1, plus the pool, and no bound of its own (no `borrow`).
    assert quotas.widest_limits_for("team-b")["a100"] == 8
    assert quotas.widest_limits_for("solo") == quotas.limits_for("solo")
