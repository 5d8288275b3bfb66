"""Queue mode's pure core: the gate and its patches, the order of a line, who goes next."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from fractions import Fraction as F
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import ConfigError, Denial, Policy, check_update, load_policy, load_quotas
from policies.pods.pod_view import PodView, view_pod
from policies.quota.judge import judge, never_fits
from policies.quota.queue import (
    Place,
    Waiting,
    add_gate,
    in_line_order,
    is_gated,
    next_releases,
    remove_gate,
    waiting_pod,
)
from policies.quota.quotas import ALL_CLASSES
from tests.builders import POLICY_YAML, pod

GATE = "gpuadm.io/quota"
OTHER = {"name": "example.com/provisioning"}


Read = Callable[[dict[str, Any]], Mapping[str, Any] | PodView]


def as_written(pod: dict[str, Any]) -> Mapping[str, Any]:
    return pod


@pytest.fixture(params=[as_written, view_pod], ids=["dict", "view"])
def read(request: pytest.FixtureRequest) -> Read:
    """The gate is read alike from the pod as written and from its view."""
    reader: Read = request.param
    return reader


def with_gates(gates: Any) -> dict[str, Any]:
    body = pod({"gpuadm.io/a100": "1"})
    if gates is not ...:
        body["spec"]["schedulingGates"] = gates
    return body


# --- the gate -----------------------------------------------------------------------------------


def test_the_gate_is_named_under_the_policy_domain(policy: Policy) -> None:
    assert policy.quota_gate == GATE
    other = load_policy(POLICY_YAML.replace("domain: gpuadm.io", "domain: gpus.example.com"))
    assert other.quota_gate == "gpus.example.com/quota"


@pytest.mark.parametrize(
    ("gates", "after"),
    [
        pytest.param(..., [{"name": GATE}], id="no-gates-field"),
        pytest.param(None, [{"name": GATE}], id="gates-null"),
        pytest.param([], [{"name": GATE}], id="empty-list"),
        pytest.param([OTHER], [OTHER, {"name": GATE}], id="another-gate-first"),
    ],
)
def test_add_gate_appends_the_gate_and_keeps_the_others(
    gates: Any, after: list[Any], read: Read
) -> None:
    body = with_gates(gates)
    original = copy.deepcopy(body)
    patched = jsonpatch.apply_patch(body, [add_gate(read(body), GATE)])
    assert patched["spec"]["schedulingGates"] == after
    assert is_gated(patched, GATE)
    del patched["spec"]["schedulingGates"]
    original["spec"].pop("schedulingGates", None)
    assert patched == original


@pytest.mark.parametrize(
    ("gates", "after"),
    [
        pytest.param([{"name": GATE}], [], id="ours-alone"),
        pytest.param([OTHER, {"name": GATE}], [OTHER], id="ours-second"),
        pytest.param([{"name": GATE}, OTHER], [OTHER], id="ours-first"),
    ],
)
def test_remove_gate_removes_ours_only(gates: list[Any], after: list[Any], read: Read) -> None:
    body = with_gates(gates)
    patch = remove_gate(read(body), GATE)
    assert [op["op"] for op in patch] == ["test", "remove"]
    patched = jsonpatch.apply_patch(body, patch)
    assert patched["spec"]["schedulingGates"] == after
    assert not is_gated(patched, GATE)


@pytest.mark.parametrize(
    "gates",
    [
        pytest.param(..., id="no-gates-field"),
        pytest.param(None, id="gates-null"),
        pytest.param([OTHER], id="another-gate-only"),
    ],
)
def test_remove_gate_of_a_pod_without_it_is_empty(gates: Any, read: Read) -> None:
    assert remove_gate(read(with_gates(gates)), GATE) == []


def test_remove_gate_fails_rather_than_remove_another_gate_once_the_pod_changed() -> None:
    read = with_gates([OTHER, {"name": GATE}])
    patch = remove_gate(read, GATE)
    now = with_gates([{"name": GATE}, OTHER])  # the gates moved since the pod was read
    with pytest.raises(jsonpatch.JsonPatchException):
        jsonpatch.apply_patch(now, patch)
    assert now["spec"]["schedulingGates"] == [{"name": GATE}, OTHER]


@pytest.mark.parametrize(
    ("gates", "gated"),
    [
        pytest.param(..., False, id="no-gates-field"),
        pytest.param(None, False, id="gates-null"),
        pytest.param("gpuadm.io/quota", False, id="gates-not-a-list"),
        pytest.param(["gpuadm.io/quota"], False, id="gate-not-an-object"),
        pytest.param([OTHER], False, id="another-gate"),
        pytest.param([{"name": "gpuadm.io/quota-x"}], False, id="a-longer-name"),
        pytest.param([OTHER, {"name": GATE}], True, id="ours-among-others"),
    ],
)
def test_is_gated(gates: Any, gated: bool, read: Read) -> None:
    assert is_gated(read(with_gates(gates)), GATE) is gated


def test_a_pod_without_spec_is_not_gated() -> None:
    assert not is_gated({"metadata": {"name": "p"}}, GATE)
    assert add_gate({"metadata": {"name": "p"}}, GATE)["path"] == "/spec/schedulingGates"


def test_only_gpuadm_may_remove_its_gate(policy: Policy) -> None:
    gated = with_gates([OTHER, {"name": GATE}])
    released = with_gates([OTHER])
    with pytest.raises(Denial) as denial:
        check_update(gated, released, policy)
    assert denial.value.message.startswith(
        "the scheduling gate gpuadm.io/quota may be removed by gpuadm only"
    )
    check_update(gated, gated, policy)  # keeping it is fine
    check_update(gated, with_gates([{"name": GATE}]), policy)  # removing another gate too
    check_update(with_gates([OTHER]), with_gates([]), policy)


# --- a place in line ------------------------------------------------------------------------


def line_pod(
    name: str,
    class_name: str = "a100",
    charge: F | str = F(1),
    *,
    created: str = "2026-01-01T00:00:00Z",
    priority: int = 0,
) -> Waiting:
    return Waiting(
        uid=f"uid-{name}",
        namespace="team-q",
        name=name,
        class_name=class_name,
        charge=F(charge),
        priority=priority,
        created=created,
    )


def test_waiting_pod_reads_uid_name_priority_and_creation() -> None:
    body = pod({"gpuadm.io/a100": "0.5"}, priority=1000)
    body["metadata"].update(
        uid="u-1", namespace="team-q", name="train", creationTimestamp="2026-01-02T03:04:05Z"
    )
    assert waiting_pod(body, "a100", F(1, 2)) == Waiting(
        "u-1", "team-q", "train", "a100", F(1, 2), 1000, "2026-01-02T03:04:05Z"
    )


@pytest.mark.parametrize(
    "spec", [pytest.param({}, id="none"), pytest.param({"priority": "high"}, id="not-a-number")]
)
def test_a_pod_without_a_numeric_priority_waits_at_priority_zero(spec: dict[str, Any]) -> None:
    assert waiting_pod(pod({}, **spec), "a100", F(1)).priority == 0


@pytest.mark.parametrize(
    ("pods", "order"),
    [
        pytest.param(
            [
                line_pod("old-low", created="2026-01-01T00:00:00Z", priority=0),
                line_pod("new-high", created="2026-01-01T09:00:00Z", priority=10),
            ],
            ["new-high", "old-low"],
            id="priority-beats-age",
        ),
        pytest.param(
            [
                line_pod("a-new", created="2026-01-01T00:00:02Z"),
                line_pod("z-old", created="2026-01-01T00:00:01Z"),
            ],
            ["z-old", "a-new"],
            id="age-beats-name",
        ),
        pytest.param(
            [line_pod("b"), line_pod("a"), line_pod("c")], ["a", "b", "c"], id="name-last"
        ),
        pytest.param(
            [line_pod("neg", priority=-5), line_pod("zero"), line_pod("pos", priority=5)],
            ["pos", "zero", "neg"],
            id="negative-priority-last",
        ),
    ],
)
def test_line_order(pods: list[Waiting], order: list[str]) -> None:
    assert [w.name for w in in_line_order(pods)] == order
    assert [w.name for w in in_line_order(reversed(pods))] == order


@pytest.mark.parametrize(
    ("ahead", "said"),
    [(0, "0 pods ahead"), (1, "1 pod ahead"), (2, "2 pods ahead")],
)
def test_place_message_says_why_and_how_many_are_ahead(ahead: int, said: str) -> None:
    place = Place(line_pod("p"), ahead, "no room")
    assert place.message() == f"waiting for GPU quota: no room; {said} of it in line"


# --- who goes next --------------------------------------------------------------------------


def at(second: int) -> str:
    return f"2026-01-01T00:00:{second:02d}Z"


def line(*pods: tuple[str, str, str]) -> list[Waiting]:
    """A line of (name, class, charge), created in the order given."""
    return [
        line_pod(name, class_name, charge, created=at(i))
        for i, (name, class_name, charge) in enumerate(pods)
    ]


HELD_A100 = 'namespace "team-q": a100 quota is held for the pods ahead'
HELD_ALL = 'namespace "team-q": all classes ("*") quota is held for the pods ahead'


@pytest.mark.parametrize(
    ("waiting", "in_use", "limits", "released", "kept"),
    [
        pytest.param(
            line(("a", "a100", "1"), ("b", "a100", "0.5"), ("c", "a100", "1")),
            {"a100": F(1, 2)},
            {"a100": F(2)},
            ["a", "b"],
            {"c": (0, "a100 quota exceeded: requested 1, in use 2 of 2")},
            id="room-for-some",
        ),
        pytest.param(
            line(("big", "a100", "2"), ("small", "a100", "0.5"), ("t4", "t4", "1")),
            {"a100": F(1)},
            {"a100": F(2), "t4": F(1)},
            ["t4"],
            {
                "big": (0, "a100 quota exceeded: requested 2, in use 1 of 2"),
                "small": (1, f"{HELD_A100} (in use 1 of 2)"),
            },
            id="head-of-line-holds-its-class-while-another-class-passes",
        ),
        pytest.param(
            line(("a", "a100", "1"), ("t4", "t4", "0.5"), ("h", "h100", "0.25")),
            {"a100": F(1), "t4": F(1, 2)},
            {ALL_CLASSES: F(2)},
            [],
            {
                "a": (0, 'all classes ("*") quota exceeded: requested 1, in use 1.5 of 2'),
                "t4": (1, f"{HELD_ALL} (in use 1.5 of 2)"),
                "h": (2, f"{HELD_ALL} (in use 1.5 of 2)"),
            },
            id="cap-across-classes-holds-everyone",
        ),
        pytest.param(
            line(("huge", "a100", "2"), ("a", "a100", "1"), ("b", "a100", "0.5")),
            {},
            {"a100": F(1)},
            ["a"],
            {
                "huge": (
                    0,
                    "requested 2, more than the whole limit of 1, so the pod could never run; "
                    "it waits until the limit grows",
                ),
                "b": (1, "a100 quota exceeded: requested 0.5, in use 1 of 1"),
            },
            id="never-fits-holds-no-one",
        ),
        pytest.param(
            line(("zero", "a100", "0.5"), ("t4", "t4", "0.5")),
            {},
            {"a100": F(0), "t4": F(1)},
            ["t4"],
            {"zero": (0, "more than the whole limit of 0, so the pod could never run")},
            id="limit-zero-never-fits",
        ),
        pytest.param(
            line(("a", "a100", "1"), ("l4", "l4", "8"), ("h", "h100", "3")),
            {"a100": F(1)},
            {"a100": F(1)},
            ["l4", "h"],
            {"a": (0, "a100 quota exceeded: requested 1, in use 1 of 1")},
            id="unlimited-classes-go",
        ),
        pytest.param(
            line(*((f"p{i:02d}", "a100", "0.1") for i in range(11))),
            {},
            {"a100": F(1)},
            [f"p{i:02d}" for i in range(10)],
            {"p10": (0, "a100 quota exceeded: requested 0.1, in use 1 of 1")},
            id="ten-tenths-fill-one-exactly",
        ),
        pytest.param(
            line(("s1", "a100", "1/3"), ("s2", "a100", "1/3"), ("s3", "a100", "1/3")),
            {},
            {"a100": F(1)},
            ["s1", "s2", "s3"],
            {},
            id="thirds-fill-one-exactly",
        ),
        pytest.param(
            line(("a", "a100", "1"), ("t4", "t4", "1"), ("h", "h100", "1")),
            {},
            {"a100": F(1), ALL_CLASSES: F(2)},
            ["a", "t4"],
            {"h": (0, 'all classes ("*") quota exceeded: requested 1, in use 2 of 2')},
            id="class-limit-and-cap-both-count",
        ),
        pytest.param(
            line(("a", "a100", "2"), ("b", "a100", "1"), ("t", "t4", "1"), ("c", "a100", "1")),
            {"a100": F(1)},
            {"a100": F(2), ALL_CLASSES: F(5)},
            ["t"],
            {
                "a": (0, "a100 quota exceeded: requested 2, in use 1 of 2"),
                "b": (1, f"{HELD_A100} (in use 1 of 2)"),
                "c": (2, f"{HELD_A100} (in use 1 of 2)"),
            },
            id="with-a-cap-everyone-waiting-ahead-counts",
        ),
        pytest.param(
            line(("a", "a100", "1"), ("b", "a100", "1")),
            {},
            {},
            ["a", "b"],
            {},
            id="no-limits-at-all",
        ),
    ],
)
def test_next_releases(
    waiting: list[Waiting],
    in_use: dict[str, F],
    limits: dict[str, F],
    released: list[str],
    kept: dict[str, tuple[int, str]],
) -> None:
    outcome = next_releases("team-q", waiting, in_use, limits)
    assert [w.name for w in outcome.released] == released
    assert [p.pod.name for p in outcome.waiting] == list(kept)
    for place in outcome.waiting:
        ahead, reason = kept[place.pod.name]
        assert place.ahead == ahead, place.pod.name
        assert reason in place.reason, place.reason
        assert place.message().endswith(
            f"; {ahead} pod{'' if ahead == 1 else 's'} ahead of it in line"
        )


def test_the_reason_of_a_held_pod_is_in_its_message() -> None:
    outcome = next_releases(
        "team-q",
        line(("big", "a100", "2"), ("small", "a100", "0.5")),
        {"a100": F(1)},
        {"a100": F(2)},
    )
    assert [p.message() for p in outcome.waiting] == [
        'waiting for GPU quota: namespace "team-q": a100 quota exceeded: requested 2, in use 1 '
        "of 2; 0 pods ahead of it in line",
        f"waiting for GPU quota: {HELD_A100} (in use 1 of 2); 1 pod ahead of it in line",
    ]


def test_a_higher_priority_pod_created_later_goes_first() -> None:
    early = line_pod("early", charge="1", created=at(0))
    urgent = line_pod("urgent", charge="1", created=at(9), priority=100)
    outcome = next_releases("team-q", [early, urgent], {}, {"a100": F(1)})
    assert [w.name for w in outcome.released] == ["urgent"]
    assert [p.pod.name for p in outcome.waiting] == ["early"]


def test_the_line_is_judged_in_order_whatever_order_it_comes_in() -> None:
    pods = line(("a", "a100", "0.5"), ("b", "a100", "1"), ("c", "a100", "0.5"))
    forward = next_releases("team-q", pods, {}, {"a100": F(1)})
    backward = next_releases("team-q", pods[::-1], {}, {"a100": F(1)})
    assert forward == backward
    assert [w.name for w in forward.released] == ["a"]


lines = st.lists(
    st.tuples(
        st.sampled_from(["a100", "t4", "h100"]),
        st.integers(min_value=1, max_value=30).map(lambda tenths: F(tenths, 10)),
        st.integers(min_value=0, max_value=2),
    ),
    max_size=12,
)
limit_sets = st.dictionaries(
    st.sampled_from(["a100", "t4", ALL_CLASSES]),
    st.integers(min_value=0, max_value=40).map(lambda tenths: F(tenths, 10)),
)
usages = st.dictionaries(
    st.sampled_from(["a100", "t4", "h100"]),
    st.integers(min_value=0, max_value=20).map(lambda tenths: F(tenths, 10)),
)


@given(lines, usages, limit_sets)
def test_released_pods_fit_together_and_no_pod_overtakes_one_of_its_class(
    drawn: list[tuple[str, F, int]], in_use: dict[str, F], limits: dict[str, F]
) -> None:
    pods = [
        line_pod(f"p{i:02d}", class_name, charge, created=at(i), priority=priority)
        for i, (class_name, charge, priority) in enumerate(drawn)
    ]
    outcome = next_releases("team-q", pods, in_use, limits)
    order = in_line_order(pods)
    # Every pod is either released or still waiting, once.
    decided = [w.name for w in outcome.released] + [p.pod.name for p in outcome.waiting]
    assert sorted(decided) == sorted(w.name for w in pods)
    # Released in line order, and together within every limit.
    assert list(outcome.released) == [w for w in order if w in outcome.released]
    after = dict(in_use)
    for w in outcome.released:
        after[w.class_name] = after.get(w.class_name, F(0)) + w.charge
    for key, limit in limits.items():
        before = sum(in_use.values(), F(0)) if key == ALL_CLASSES else in_use.get(key, F(0))
        now = sum(after.values(), F(0)) if key == ALL_CLASSES else after.get(key, F(0))
        assert now <= limit or now == before
    # A pod that could fit but waits holds back every later pod of its class.
    position = {w.name: i for i, w in enumerate(order)}
    for place in outcome.waiting:
        if "could never run" in place.reason:
            continue
        for w in outcome.released:
            assert not (
                w.class_name == place.pod.class_name and position[w.name] > position[place.pod.name]
            ), (place, w)


# --- judgement --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "limits", "message"),
    [
        pytest.param(
            F(2),
            {"a100": F(1)},
            'namespace "team-q": a100 quota exceeded: requested 2, more than the whole limit '
            "of 1, so the pod could never run",
            id="over-the-class-limit",
        ),
        pytest.param(F(1), {"a100": F(1)}, None, id="exactly-the-whole-limit"),
        pytest.param(
            F(3),
            {"a100": F(4), ALL_CLASSES: F(5, 2)},
            'namespace "team-q": all classes ("*") quota exceeded: requested 3, more than the '
            "whole limit of 2.5, so the pod could never run",
            id="over-the-cap",
        ),
        pytest.param(
            F(1, 10),
            {"a100": F(0)},
            'namespace "team-q": a100 quota exceeded: requested 0.1, more than the whole limit '
            "of 0, so the pod could never run",
            id="limit-zero",
        ),
        pytest.param(F(100), {"t4": F(1)}, None, id="no-limit-for-the-class"),
        pytest.param(F(11, 10), {"a100": F(1)}, "requested 1.1", id="a-tenth-over"),
    ],
)
def test_never_fits(requested: F, limits: dict[str, F], message: str | None) -> None:
    said = never_fits(namespace="team-q", class_name="a100", requested=requested, limits=limits)
    if message is None:
        assert said is None
    else:
        assert said is not None
        assert message in said


@pytest.mark.parametrize(
    ("in_use", "limits", "exceeded"),
    [
        pytest.param({"a100": F(1)}, {"a100": F(1)}, ("a100",), id="class"),
        pytest.param({"t4": F(2)}, {"a100": F(4), ALL_CLASSES: F(2)}, ("*",), id="cap"),
    ],
)
def test_queue_mode_is_judged_as_enforce_and_names_the_limit_exceeded(
    in_use: dict[str, F], limits: dict[str, F], exceeded: tuple[str, ...]
) -> None:
    verdict = judge(
        namespace="team-q",
        class_name="a100",
        requested=F(1, 2),
        in_use=in_use,
        limits=limits,
        mode="queue",
    )
    assert not verdict.allowed
    assert verdict.exceeded == exceeded
    assert not verdict.queued
    assert not verdict.would_deny


# --- the quota file's mode per namespace -----------------------------------------------------

MODES = """
mode: warn
default: {t4: 1}
namespaces:
  team-q: {mode: queue, defaultClass: a100, a100: 2, "*": 3}
  team-e: {mode: enforce, a100: 1}
  team-w: {a100: 1}
"""


@pytest.mark.parametrize(
    ("namespace", "mode", "limits"),
    [
        pytest.param("team-q", "queue", {"a100": F(2), ALL_CLASSES: F(3)}, id="own-queue"),
        pytest.param("team-e", "enforce", {"a100": F(1)}, id="own-enforce"),
        pytest.param("team-w", "warn", {"a100": F(1)}, id="entry-without-mode"),
        pytest.param("team-x", "warn", {"t4": F(1)}, id="no-entry"),
    ],
)
def test_mode_per_namespace_is_not_a_limit(namespace: str, mode: str, limits: dict[str, F]) -> None:
    quotas = load_quotas(MODES)
    assert quotas.mode_for(namespace) == mode
    assert dict(quotas.limits_for(namespace)) == limits


def test_mode_and_default_class_sit_beside_the_limits() -> None:
    quotas = load_quotas(MODES)
    assert quotas.default_class_for("team-q") == "a100"
    assert load_quotas("namespaces:\n  team-q: {a100: 1}\n").mode_for("team-q") == "enforce"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "namespaces:\n  team-q: {mode: fifo, a100: 1}\n",
            "namespaces.team-q.mode: 'fifo' is not one of enforce, warn, queue",
            id="unknown-namespace-mode",
        ),
        pytest.param(
            "namespaces:\n  team-q: {mode: 1, a100: 1}\n",
            "namespaces.team-q.mode: 1 is not one of enforce, warn, queue",
            id="number-as-mode",
        ),
        pytest.param(
            "mode: later\n",
            "mode: 'later' is not one of enforce, warn, queue",
            id="unknown-file-mode",
        ),
        pytest.param(
            "default: {mode: queue, a100: 1}\n",
            "default.mode: 'queue' is not a quantity",
            id="default-holds-limits-only",
        ),
    ],
)
def test_invalid_modes_are_refused_with_the_field_and_value(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_quotas(text)
    assert any(expected in problem for problem in error.value.problems), error.value.problems


@pytest.mark.parametrize(
    ("text", "namespace", "queueing"),
    [
        pytest.param("namespaces:\n  team-q: {a100: 1}\n", "team-q", "besteffort", id="default"),
        pytest.param(
            "queueing: strict\nnamespaces:\n  team-q: {a100: 1}\n", "team-q", "strict", id="file"
        ),
        pytest.param(
            "queueing: strict\nnamespaces:\n  team-q: {queueing: besteffort, a100: 1}\n",
            "team-q",
            "besteffort",
            id="own-over-file",
        ),
        pytest.param("queueing: strict\n", "team-x", "strict", id="no-entry"),
    ],
)
def test_queueing_per_namespace_is_not_a_limit(text: str, namespace: str, queueing: str) -> None:
    quotas = load_quotas(text)
    assert quotas.terms(namespace).queueing == queueing
    assert "queueing" not in quotas.limits_for(namespace)


def test_an_unknown_queueing_is_refused_with_the_field_and_value() -> None:
    with pytest.raises(ConfigError) as error:
        load_quotas("namespaces:\n  team-q: {queueing: fifo, a100: 1}\n")
    expected = "namespaces.team-q.queueing: 'fifo' is not one of besteffort, strict"
    assert any(expected in problem for problem in error.value.problems), error.value.problems
