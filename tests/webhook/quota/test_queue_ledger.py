"""Queue mode in the ledger: who gets the gate, who waits, releasing the line, charging once."""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
from collections.abc import Awaitable, Mapping
from fractions import Fraction
from typing import Any, TypeVar

import jsonpatch
import pytest

from policies import Plan, plan, require_fixed_point
from policies.policy import GATE_SUFFIX
from policies.quota.judge import QuotaVerdict
from policies.quota.queue import Place, Waiting, add_gate, remove_gate
from tests.builders import POLICY_YAML, pod
from webhook.config.snapshot import ConfigSnapshot, snapshot_from_text
from webhook.kube.errors import KubeError
from webhook.observe.metrics import Metrics
from webhook.quota.book import MAX_ATTEMPTS
from webhook.quota.holdings import Holding, pod_state
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import (
    NO_MARK,
    STORED_DIGITS,
    Allowance,
    Conflict,
    Mark,
    MemoryStore,
    RecordFull,
    Reservation,
    storable,
)
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest

QUOTAS = """
namespaces:
  team-q: {mode: queue, a100: 1, h100: 2}
  team-s: {mode: queue, "*": 2}
  team-e: {a100: 1}
"""
GATE = f"gpuadm.io/{GATE_SUFFIX}"
ROUNDS = 20
_serial = itertools.count()
T = TypeVar("T")


@functools.cache
def config(quotas: str = QUOTAS) -> ConfigSnapshot:
    return snapshot_from_text(POLICY_YAML, quotas, policy_source="p", quotas_source="q")


def stored_pod(
    limits: dict[str, str],
    namespace: str = "team-q",
    *,
    gated: bool = False,
    priority: int | None = None,
) -> dict[str, Any]:
    """A pod as the apiserver stores it after gpuadm's rewrite; created one second apart."""
    body = pod(limits)
    body = dict(jsonpatch.apply_patch(body, plan(body, config().policy).patch))
    serial = next(_serial)
    body["metadata"].update(
        namespace=namespace,
        uid=f"uid-{serial}",
        name=f"p{serial:05d}",
        creationTimestamp=f"2026-01-01T{serial // 3600 % 24:02d}:{serial // 60 % 60:02d}:"
        f"{serial % 60:02d}Z",
    )
    if priority is not None:
        body["spec"]["priority"] = priority
    if gated:
        body = jsonpatch.apply_patch(body, [add_gate(body, GATE)])
    return body


def ungated(body: dict[str, Any]) -> dict[str, Any]:
    """The pod once gpuadm removed its gate."""
    result: dict[str, Any] = jsonpatch.apply_patch(body, remove_gate(body, GATE))
    return result


def request(body: dict[str, Any], *, dry_run: bool = False) -> AdmissionRequest:
    return AdmissionRequest(
        uid=f"req-{body['metadata']['uid']}",
        operation="CREATE",
        namespace=body["metadata"]["namespace"],
        name=body["metadata"]["name"],
        object=body,
        old_object=None,
        dry_run=dry_run,
        user="alice",
        groups=(),
    )


def observe(usage: UsageIndex, *pods: dict[str, Any], now: float = 0) -> None:
    snapshot = config()
    for body in pods:
        usage.observe(body, snapshot.policy, snapshot.quotas, now=now)


def uid(body: dict[str, Any]) -> str:
    return str(body["metadata"]["uid"])


async def waiting_in(namespace: str, ledger: QuotaLedger) -> list[Place]:
    """What each pod of the line is told: its place, from the record as it is now."""
    await ledger.book.refresh(namespace)
    place = ledger.line.placer(namespace, config().quotas.limits_for(namespace))
    return [p for pod in ledger.book.usage.line(namespace).ordered() if (p := place(pod))]


async def stored_charges(store: MemoryStore, namespace: str) -> dict[str, Fraction]:
    return {u: r.charge for u, r in (await store.read(namespace)).reservations.items()}


# --- what the pod watch shows ---------------------------------------------------------------


def test_a_gated_pod_waits_holds_nothing_and_is_not_seen() -> None:
    usage = UsageIndex()
    body = stored_pod({"gpuadm.io/a100": "0.5"}, gated=True, priority=7)
    observe(usage, body)
    (waiting,) = usage.waiting("team-q")
    assert waiting == Waiting(
        uid(body),
        "team-q",
        body["metadata"]["name"],
        "a100",
        Fraction(1, 2),
        7,
        body["metadata"]["creationTimestamp"],
    )
    assert usage.waiting_namespaces() == ["team-q"]
    assert usage.in_use("team-q") == {}
    assert usage.holdings("team-q") == []
    assert uid(body) not in usage
    assert not usage.seen(uid(body))


def test_a_pod_released_from_the_line_is_held_and_seen() -> None:
    usage = UsageIndex()
    body = stored_pod({"gpuadm.io/a100": "0.5"}, gated=True)
    observe(usage, body)
    observe(usage, ungated(body))
    assert usage.waiting("team-q") == []
    assert usage.waiting_namespaces() == []
    assert usage.in_use("team-q") == {"a100": Fraction(1, 2)}
    assert [
        (h.namespace, h.class_name, h.charge, h.pod, h.uid) for h in usage.holdings("team-q")
    ] == [("team-q", "a100", Fraction(1, 2), body["metadata"]["name"], uid(body))]
    assert usage.seen(uid(body))


@pytest.mark.parametrize(
    ("change", "state"),
    [
        pytest.param(lambda body: body, Waiting, id="gated"),
        pytest.param(ungated, Holding, id="released"),
        pytest.param(
            lambda body: {**body, "metadata": {**body["metadata"], "deletionTimestamp": "x"}},
            type(None),
            id="gated-and-being-deleted",
        ),
        pytest.param(lambda body: {**body, "status": {"phase": "Failed"}}, type(None), id="ended"),
    ],
)
def test_pod_state(change: Any, state: type) -> None:
    snapshot = config()
    body = change(stored_pod({"gpuadm.io/a100": "0.5"}, gated=True))
    assert isinstance(pod_state(body, snapshot.policy, snapshot.quotas), state)


def test_a_pod_deleted_while_waiting_leaves_the_line_and_the_listeners_hear_it() -> None:
    usage = UsageIndex()
    heard: list[str] = []
    usage.on_change(heard.append)
    body = stored_pod({"gpuadm.io/a100": "0.5"}, gated=True)
    observe(usage, body)
    observe(usage, body)  # the same again changes nothing
    assert heard == ["team-q"]
    deleting = copy.deepcopy(body)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T01:00:00Z"
    observe(usage, deleting)
    assert usage.waiting("team-q") == []
    assert heard == ["team-q", "team-q"]
    assert usage.in_use("team-q") == {}


# --- who gets the gate -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "holding", "asked", "gated"),
    [
        pytest.param("team-q", [], {"gpuadm.io/a100": "1"}, True, id="fits"),
        pytest.param(
            "team-q", [{"gpuadm.io/a100": "1"}], {"gpuadm.io/a100": "0.5"}, True, id="full"
        ),
        pytest.param("team-s", [], {"gpuadm.io/t4": "0.5"}, True, id="under-a-cap"),
        pytest.param(
            "team-q", [{"gpuadm.io/a100": "1"}], {"gpuadm.io/t4": "8"}, False, id="unlimited-class"
        ),
        pytest.param(
            "team-e", [{"gpuadm.io/a100": "1"}], {"gpuadm.io/a100": "1"}, False, id="enforce"
        ),
        pytest.param("team-x", [], {"gpuadm.io/a100": "1"}, False, id="no-quota"),
    ],
)
def test_every_pod_a_limit_applies_to_gets_the_gate_in_a_queue_namespace(
    namespace: str, holding: list[dict[str, str]], asked: dict[str, str], gated: bool
) -> None:
    usage = UsageIndex()
    quota = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    observe(usage, *(stored_pod(limits, namespace) for limits in holding))
    snapshot = config()
    body = stored_pod(asked, namespace)
    verdict = quota.should_gate(
        namespace, require_fixed_point(plan(body, snapshot.policy)), snapshot
    )
    if not gated:
        assert verdict is None
    else:
        assert verdict is not None
        assert verdict.allowed
        assert verdict.queued


@pytest.mark.parametrize(
    ("namespace", "asked", "message"),
    [
        pytest.param(
            "team-q",
            {"gpuadm.io/a100": "2"},
            'namespace "team-q": a100 quota exceeded: requested 2, more than the whole limit '
            "of 1, so the pod could never run",
            id="class",
        ),
        pytest.param(
            "team-s",
            {"gpuadm.io/t4": "3"},
            'namespace "team-s": all classes ("*") quota exceeded: requested 3, more than the '
            "whole limit of 2, so the pod could never run",
            id="cap",
        ),
    ],
)
async def test_a_pod_that_could_never_fit_gets_no_gate_and_is_refused(
    namespace: str, asked: dict[str, str], message: str
) -> None:
    store = MemoryStore()
    quota = QuotaLedger(UsageIndex(), store, pods_visible=True)
    snapshot = config()
    body = stored_pod(asked, namespace)
    verdict = quota.should_gate(
        namespace, require_fixed_point(plan(body, snapshot.policy)), snapshot
    )
    assert verdict is not None
    assert not verdict.allowed
    assert not verdict.queued
    assert verdict.message == message
    # Created gated all the same (by hand), it is refused at validation, uncharged.
    gated = stored_pod(asked, namespace, gated=True)
    refused = await quota.admit(
        request(gated), require_fixed_point(plan(gated, snapshot.policy)), snapshot
    )
    assert refused is not None
    assert not refused.allowed
    assert refused.message == message
    assert store.writes == 0


# --- admitting a gated pod ---------------------------------------------------------------


async def admit_gated(
    quota: QuotaLedger, body: dict[str, Any], *, dry_run: bool = False
) -> QuotaVerdict:
    snapshot = config()
    verdict = await quota.admit(
        request(body, dry_run=dry_run), require_fixed_point(plan(body, snapshot.policy)), snapshot
    )
    assert verdict is not None, "a limit applies to this pod, so the ledger must judge it"
    return verdict


@pytest.mark.parametrize(
    ("holding", "in_line", "asked", "message"),
    [
        pytest.param([], [], {"gpuadm.io/a100": "1"}, None, id="fits"),
        pytest.param(
            [{"gpuadm.io/a100": "0.75"}],
            [],
            {"gpuadm.io/a100": "0.5"},
            'waiting for GPU quota: namespace "team-q": a100 quota exceeded: requested 0.5, in '
            "use 0.75 of 1; 0 pods ahead of it in line",
            id="does-not-fit",
        ),
        pytest.param(
            [{"gpuadm.io/a100": "0.5"}],
            [{"gpuadm.io/a100": "1"}],
            {"gpuadm.io/a100": "0.25"},
            'waiting for GPU quota: namespace "team-q": a100 quota is held for the pods ahead '
            "(in use 0.5 of 1); 1 pod ahead of it in line",
            id="fits-but-would-overtake",
        ),
        pytest.param(
            [],
            [{"gpuadm.io/a100": "0.75"}],
            {"gpuadm.io/a100": "0.5"},
            'waiting for GPU quota: namespace "team-q": a100 quota exceeded: requested 0.5, in '
            "use 0.75 of 1; 0 pods ahead of it in line",
            id="room-kept-for-the-line",
        ),
        pytest.param(
            [{"gpuadm.io/a100": "1"}],
            [{"gpuadm.io/a100": "1"}],
            {"gpuadm.io/h100": "2"},
            None,
            id="another-class-in-line",
        ),
    ],
)
async def test_a_gated_pod_is_charged_at_once_if_the_line_lets_it_else_waits_uncharged(
    holding: list[dict[str, str]],
    in_line: list[dict[str, str]],
    asked: dict[str, str],
    message: str | None,
) -> None:
    usage = UsageIndex()
    store = MemoryStore()
    quota = QuotaLedger(usage, store, pods_visible=True)
    observe(usage, *(stored_pod(limits) for limits in holding))
    observe(usage, *(stored_pod(limits, gated=True) for limits in in_line))
    before = dict(quota.book.in_use("team-q"))
    body = stored_pod(asked, gated=True)
    verdict = await admit_gated(quota, body)
    assert verdict.allowed
    if message is None:
        assert not verdict.queued
        assert await stored_charges(store, "team-q") == {uid(body): quota_of(asked)}
        assert store.writes == 1
    else:
        assert verdict.queued
        assert verdict.message == message
        assert verdict.warnings == (f"{message}; the scheduling gate {GATE} holds it",)
        assert store.writes == 0
        assert quota.book.in_use("team-q") == before


def quota_of(limits: dict[str, str]) -> Fraction:
    (amount,) = limits.values()
    return Fraction(amount)


async def test_a_higher_priority_pod_is_charged_ahead_of_the_line() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    quota = QuotaLedger(usage, store, pods_visible=True)
    observe(usage, stored_pod({"gpuadm.io/a100": "0.5"}))
    (first,) = line_of(usage, {"gpuadm.io/a100": "1"})
    urgent = stored_pod({"gpuadm.io/a100": "0.5"}, gated=True, priority=1000)
    verdict = await admit_gated(quota, urgent)
    assert verdict.allowed
    assert not verdict.queued
    assert set(await stored_charges(store, "team-q")) == {uid(urgent)}
    # The pod it went ahead of stays in line: the room is gone.
    released, _ = await quota.line.release("team-q", config().quotas)
    assert released == []
    assert [p.pod.uid for p in await waiting_in("team-q", quota)] == [uid(first)]


async def test_a_gated_dry_run_is_judged_but_charges_nothing() -> None:
    store = MemoryStore()
    quota = QuotaLedger(UsageIndex(), store, pods_visible=True)
    body = stored_pod({"gpuadm.io/a100": "1"}, gated=True)
    verdict = await admit_gated(quota, body, dry_run=True)
    assert verdict.allowed
    assert not verdict.queued
    assert store.writes == 0
    assert quota.book.in_use("team-q") == {}


async def test_a_gated_pod_is_not_judged_on_a_view_not_in_sync() -> None:
    store = MemoryStore()
    quota = QuotaLedger(UsageIndex(), store, pods_visible=True, usage_ready=lambda: False)
    verdict = await admit_gated(quota, stored_pod({"gpuadm.io/a100": "0.5"}, gated=True))
    assert not verdict.allowed
    assert verdict.message == (
        "gpuadm's view of GPU usage is not in sync with the cluster yet; retry"
    )
    assert store.writes == 0


async def test_a_burst_of_gated_pods_is_charged_in_order_with_one_write_the_rest_waits() -> None:
    store = MemoryStore()
    quota = QuotaLedger(UsageIndex(), store, pods_visible=True)
    shares = ["0.5", "0.25", "0.75", "0.25", "0.1"]
    bodies = [stored_pod({"gpuadm.io/a100": s}, gated=True) for s in shares]
    verdicts = await asyncio.gather(*(admit_gated(quota, body) for body in bodies))
    assert [v.allowed for v in verdicts] == [True] * 5
    # 0.75 does not fit after 0.75: it waits, and the pods behind it wait behind it, though
    # the 0.25 after it would fit.
    assert [v.queued for v in verdicts] == [False, False, True, True, True]
    assert [v.message.rsplit("; ", 1)[1] for v in verdicts[2:] if v.message] == [
        "0 pods ahead of it in line",
        "1 pod ahead of it in line",
        "2 pods ahead of it in line",
    ]
    assert await stored_charges(store, "team-q") == {
        uid(bodies[0]): Fraction(1, 2),
        uid(bodies[1]): Fraction(1, 4),
    }
    assert store.writes == 1


async def test_a_pod_charged_when_created_is_handed_to_the_leader_to_ungate_not_charged_again() -> (
    None
):
    usage = UsageIndex()
    store = MemoryStore()
    quota = QuotaLedger(usage, store, pods_visible=True)
    leader = QuotaLedger(usage, store, pods_visible=True)
    body = stored_pod({"gpuadm.io/a100": "0.75"}, gated=True)
    verdict = await admit_gated(quota, body)
    assert not verdict.queued
    observe(usage, body)  # the watch shows it stored, still gated
    assert [w.uid for w in usage.waiting("team-q")] == [uid(body)]
    released, outcome = await leader.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(body)]
    assert outcome.released == ()
    assert store.writes == 1
    await leader.book.refresh("team-q")
    assert leader.book.in_use("team-q") == {"a100": Fraction(3, 4)}


@pytest.mark.parametrize(
    ("namespace", "message"),
    [
        pytest.param(
            "team-q",
            'namespace "team-q": a100 quota exceeded: requested 0.5, in use 1 of 1; it was taken '
            "by another pod while this one was being created: create the pod again, and it waits "
            "in line",
            id="queue",
        ),
        pytest.param(
            "team-e",
            'namespace "team-e": a100 quota exceeded: requested 0.5, in use 1 of 1',
            id="enforce",
        ),
    ],
)
async def test_an_ungated_pod_that_does_not_fit_is_refused_and_told_how_to_wait(
    namespace: str, message: str
) -> None:
    store = MemoryStore()
    snapshot = config()
    winner = QuotaLedger(UsageIndex(), store, pods_visible=True)
    loser = QuotaLedger(UsageIndex(), store, pods_visible=True)
    first = stored_pod({"gpuadm.io/a100": "1"}, namespace)
    second = stored_pod({"gpuadm.io/a100": "0.5"}, namespace)
    won = await winner.admit(
        request(first), require_fixed_point(plan(first, snapshot.policy)), snapshot
    )
    assert won is not None
    assert won.allowed
    lost = await loser.admit(
        request(second), require_fixed_point(plan(second, snapshot.policy)), snapshot
    )
    assert lost is not None
    assert not lost.allowed
    assert lost.message == message
    assert await stored_charges(store, namespace) == {uid(first): 1}


MIXED_MODES = """
mode: warn
namespaces:
  team-e: {mode: enforce, a100: 1}
  team-w: {a100: 1}
"""


@pytest.mark.parametrize(
    ("namespace", "allowed"),
    [pytest.param("team-e", False, id="own-enforce"), pytest.param("team-w", True, id="file-warn")],
)
async def test_the_validating_judgement_follows_the_namespace_mode(
    namespace: str, allowed: bool
) -> None:
    store = MemoryStore()
    quota = QuotaLedger(UsageIndex(), store, pods_visible=True)
    snapshot = config(MIXED_MODES)
    verdicts = []
    for _ in range(2):
        body = stored_pod({"gpuadm.io/a100": "1"}, namespace)
        verdict = await quota.admit(
            request(body), require_fixed_point(plan(body, snapshot.policy)), snapshot
        )
        assert verdict is not None
        verdicts.append(verdict)
    assert verdicts[0].allowed
    assert verdicts[1].allowed is allowed
    assert verdicts[1].would_deny is allowed
    assert sum((await stored_charges(store, namespace)).values()) == (2 if allowed else 1)


# --- releasing the line ---------------------------------------------------------------------


def line_of(usage: UsageIndex, *limits: dict[str, str], namespace: str = "team-q") -> list[Any]:
    pods = [stored_pod(each, namespace, gated=True) for each in limits]
    observe(usage, *pods)
    return pods


async def test_release_charges_the_pods_that_fit_in_order_with_one_write() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    quota = QuotaLedger(usage, store, pods_visible=True)
    a, b, c, d = line_of(
        usage,
        {"gpuadm.io/a100": "0.5"},
        {"gpuadm.io/a100": "0.5"},
        {"gpuadm.io/a100": "0.5"},
        {"gpuadm.io/h100": "2"},
    )
    urgent = stored_pod({"gpuadm.io/a100": "0.5"}, gated=True, priority=10)
    observe(usage, urgent)
    released, outcome = await quota.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(urgent), uid(a), uid(d)]
    assert [w.uid for w in outcome.released] == [uid(urgent), uid(a), uid(d)]
    assert [(p.pod.uid, p.ahead) for p in await waiting_in("team-q", quota)] == [
        (uid(b), 0),
        (uid(c), 1),
    ]
    assert store.writes == 1
    assert await stored_charges(store, "team-q") == {uid(urgent): 0.5, uid(a): 0.5, uid(d): 2}
    assert quota.book.in_use("team-q") == {"a100": 1, "h100": 2}


async def test_a_line_with_nothing_to_release_writes_nothing() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    quota = QuotaLedger(usage, store, pods_visible=True)
    observe(usage, stored_pod({"gpuadm.io/a100": "1"}))
    line_of(usage, {"gpuadm.io/a100": "0.5"})
    released, _ = await quota.line.release("team-q", config().quotas)
    assert released == []
    assert len(await waiting_in("team-q", quota)) == 1
    assert store.writes == 0


async def test_a_pod_released_but_still_shown_gated_is_returned_again_and_charged_once() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    quota = QuotaLedger(usage, store, pods_visible=True)
    a, b, c = line_of(
        usage, {"gpuadm.io/a100": "0.5"}, {"gpuadm.io/a100": "0.5"}, {"gpuadm.io/a100": "0.5"}
    )
    first, _ = await quota.line.release("team-q", config().quotas)
    assert [w.uid for w in first] == [uid(a), uid(b)]

    # The gates are not removed yet (the replica died, or the watch lags): the next pass
    # hands the same pods back to be ungated, and charges nothing more.
    again, outcome = await quota.line.release("team-q", config().quotas)
    assert [w.uid for w in again] == [uid(a), uid(b)]
    assert outcome.released == ()
    assert [p.pod.uid for p in await waiting_in("team-q", quota)] == [uid(c)]
    assert store.writes == 1
    assert quota.book.in_use("team-q") == {"a100": 1}

    # A new ledger (another leader) reads the record and does the same.
    successor = QuotaLedger(usage, store, pods_visible=True)
    handed, _ = await successor.line.release("team-q", config().quotas)
    assert [w.uid for w in handed] == [uid(a), uid(b)]
    assert store.writes == 1
    await successor.book.refresh("team-q")
    assert successor.book.in_use("team-q") == {"a100": 1}

    # Left out while their gate removal is on its way: still charged, not handed back.
    skipped, outcome = await quota.line.release(
        "team-q", config().quotas, skip=frozenset({uid(a), uid(b)})
    )
    assert skipped == []
    assert [p.pod.uid for p in await waiting_in("team-q", quota)] == [uid(c)]
    assert quota.book.in_use("team-q") == {"a100": 1}


async def test_a_released_pod_counts_by_its_reservation_until_shown_ungated_then_as_a_pod() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    quota = QuotaLedger(usage, store, pods_visible=True)
    (body,) = line_of(usage, {"gpuadm.io/a100": "0.75"})
    released, _ = await quota.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(body)]
    assert usage.in_use("team-q") == {}
    assert set(quota.book.reserved("team-q")) == {uid(body)}
    assert quota.book.in_use("team-q") == {"a100": Fraction(3, 4)}

    observe(usage, ungated(body), now=1)
    assert usage.in_use("team-q") == {"a100": Fraction(3, 4)}
    assert quota.book.reserved("team-q") == {}
    assert quota.book.in_use("team-q") == {"a100": Fraction(3, 4)}
    assert usage.waiting("team-q") == []

    # Room left: 0.25, exactly.
    quarter, more = line_of(usage, {"gpuadm.io/a100": "0.25"}, {"gpuadm.io/a100": "0.25"})
    released, _ = await quota.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(quarter)]
    assert [p.pod.uid for p in await waiting_in("team-q", quota)] == [uid(more)]
    assert quota.book.in_use("team-q") == {"a100": 1}


async def test_unreserve_gives_the_room_back_to_the_line() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    quota = QuotaLedger(usage, store, pods_visible=True)
    gone, behind = line_of(usage, {"gpuadm.io/a100": "1"}, {"gpuadm.io/a100": "1"})
    released, _ = await quota.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(gone)]
    usage.forget(uid(gone))  # deleted before its gate was removed

    await quota.line.unreserve("team-q", uid(gone))
    assert await stored_charges(store, "team-q") == {}
    assert quota.book.in_use("team-q") == {}
    writes = store.writes
    await quota.line.unreserve("team-q", uid(gone))  # again: nothing to do
    assert store.writes == writes

    released, _ = await quota.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(behind)]
    assert await waiting_in("team-q", quota) == []
    assert await stored_charges(store, "team-q") == {uid(behind): 1}


async def test_an_expired_reservation_of_a_pod_still_gated_is_charged_anew_not_twice() -> None:
    now = [1000.0]
    usage = UsageIndex()
    store = MemoryStore()
    quota = QuotaLedger(usage, store, pods_visible=True, clock=lambda: now[0])
    (body,) = line_of(usage, {"gpuadm.io/a100": "1"})
    await quota.line.release("team-q", config().quotas)
    now[0] += 200  # far past the reservation's life, and the pod still shows its gate
    released, _ = await quota.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(body)]
    assert await stored_charges(store, "team-q") == {uid(body): 1}
    assert (await store.read("team-q")).reservations[uid(body)].at == now[0]
    assert quota.book.in_use("team-q") == {"a100": 1}


def watched(*bodies: dict[str, Any], version: int, label: str | None = None) -> UsageIndex:
    """A replica's view as its pod watch makes it: of the policy's label (or `label`),
    complete up to `version`, showing `bodies`."""
    usage = UsageIndex()
    usage.watching(config().policy.class_annotation if label is None else label)
    observe(usage, *bodies)
    usage.advance(version)
    return usage


async def test_a_new_leader_that_never_saw_a_released_pod_gives_its_room_back_at_once() -> None:
    """The leader releases a pod and dies; the pod is deleted; a replica that started after
    that, and so never saw the pod, leads: the pod's reservation must not hold the line
    until it expires."""
    store = MemoryStore()
    first, second = [stored_pod({"gpuadm.io/a100": "1"}, gated=True) for _ in range(2)]
    old = QuotaLedger(watched(first, second, version=10), store, pods_visible=True)
    released, _ = await old.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(first)]
    stored = (await store.read("team-q")).reservations[uid(first)]
    assert (stored.stored, stored.stored_by) == (10, config().policy.class_annotation)

    # The first pod is deleted (at version 12); the new replica lists after that.
    new = QuotaLedger(watched(second, version=13), store, pods_visible=True)
    released, _ = await new.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(second)]
    assert await stored_charges(store, "team-q") == {uid(first): 1, uid(second): 1}
    assert new.book.in_use("team-q") == {"a100": 1}


@pytest.mark.parametrize(
    ("view", "why"),
    [
        pytest.param({"version": 9}, "its view is older than the release", id="lagging"),
        pytest.param(
            {"version": 13, "label": "example.com/other"},
            "it watches pods of another label, which may hold the pod",
            id="other-label",
        ),
    ],
)
async def test_a_replica_that_cannot_know_a_released_pod_gone_keeps_counting_it(
    view: dict[str, Any], why: str
) -> None:
    store = MemoryStore()
    first, second = [stored_pod({"gpuadm.io/a100": "1"}, gated=True) for _ in range(2)]
    old = QuotaLedger(watched(first, second, version=10), store, pods_visible=True)
    await old.line.release("team-q", config().quotas)

    new = QuotaLedger(watched(second, **view), store, pods_visible=True)
    released, _ = await new.line.release("team-q", config().quotas)
    assert released == [], why
    await new.book.refresh("team-q")
    assert new.book.in_use("team-q") == {"a100": 1}


async def test_a_pod_charged_in_flight_is_marked_stored_by_the_leader_once() -> None:
    store = MemoryStore()
    body = stored_pod({"gpuadm.io/a100": "0.75"}, gated=True)
    admitting = QuotaLedger(UsageIndex(), store, pods_visible=True)
    assert not (await admit_gated(admitting, body)).queued
    assert (await store.read("team-q")).reservations[uid(body)].stored == 0

    leader = QuotaLedger(watched(body, version=20), store, pods_visible=True)
    for _ in range(3):
        released, outcome = await leader.line.release("team-q", config().quotas)
        assert [w.uid for w in released] == [uid(body)]
        assert outcome.released == ()
    assert store.writes == 2  # the admission's, and the leader's mark: once
    assert (await store.read("team-q")).reservations[uid(body)].stored == 20

    # Deleted before the leader removed its gate, and unseen by a replica that lists later.
    later = QuotaLedger(watched(version=21), store, pods_visible=True)
    await later.book.refresh("team-q")
    assert later.book.in_use("team-q") == {}
    assert later.book.reserved("team-q") == {}


class FailingStore(MemoryStore):
    """A store whose next write fails as `failure` says (a lost race, a full record)."""

    def __init__(self) -> None:
        super().__init__()
        self.failure: Exception | None = None

    async def write(
        self,
        namespace: str,
        reservations: dict[str, Reservation],
        version: str | None,
        mark: Mark = NO_MARK,
        allowances: Mapping[str, Allowance] | None = None,
    ) -> str:
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure
        return await super().write(namespace, reservations, version, mark, allowances)


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(Conflict("team-q"), id="a-race-lost"),
        pytest.param(RecordFull("team-q", 9000, 1024 * 1024), id="a-full-record"),
    ],
)
async def test_marks_that_cannot_be_written_never_hold_back_a_gate(failure: Exception) -> None:
    store = FailingStore()
    body = stored_pod({"gpuadm.io/a100": "0.75"}, gated=True)
    admitting = QuotaLedger(UsageIndex(), store, pods_visible=True)
    assert not (await admit_gated(admitting, body)).queued

    leader = QuotaLedger(watched(body, version=20), store, pods_visible=True)
    store.failure = failure
    released, _ = await leader.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(body)]  # its gate goes all the same
    assert (await store.read("team-q")).reservations[uid(body)].stored == 0
    assert store.writes == 1

    released, _ = await leader.line.release("team-q", config().quotas)  # the next turn
    assert [w.uid for w in released] == [uid(body)]
    assert (await store.read("team-q")).reservations[uid(body)].stored == 20


async def test_a_version_no_record_can_carry_is_never_written_as_a_mark() -> None:
    """Written, it would read back unmarked, and every turn would write it again."""
    assert (storable(10**STORED_DIGITS - 1), storable(10**STORED_DIGITS), storable(0)) == (
        10**STORED_DIGITS - 1,
        0,
        0,
    )
    store = MemoryStore()
    body = stored_pod({"gpuadm.io/a100": "0.75"}, gated=True)
    assert not (await admit_gated(QuotaLedger(UsageIndex(), store, pods_visible=True), body)).queued
    leader = QuotaLedger(watched(body, version=10**STORED_DIGITS), store, pods_visible=True)
    for _ in range(3):
        released, _ = await leader.line.release("team-q", config().quotas)
        assert [w.uid for w in released] == [uid(body)]
    assert store.writes == 1


@pytest.mark.parametrize(
    ("view_version", "why"),
    [
        pytest.param(20, "its own reservation is of a pod this view knows gone", id="gone"),
        pytest.param(5, "its own reservation still counts: the view is older than it", id="not"),
    ],
)
async def test_a_create_judged_again_over_its_own_marked_reservation_is_counted_once(
    view_version: int, why: str
) -> None:
    """The record holds a marked reservation under the pod's own uid (a create judged
    again). It is left out of what the namespace holds, or its charge replaced by the new
    one: either way the pod counts once, and the room after it is exactly the rest."""
    store = MemoryStore()
    first = stored_pod({"gpuadm.io/a100": "1"}, "team-e")
    label = config().policy.class_annotation
    marked = Reservation("a100", Fraction(1), 1000.0, "p", 10, label)
    await store.write("team-e", {uid(first): marked}, None)
    quota = QuotaLedger(
        watched(version=view_version), store, pods_visible=True, clock=lambda: 1000.0
    )
    snapshot = config()
    verdict = await quota.admit(request(first), plan_of(first), snapshot)
    assert verdict is not None
    assert verdict.allowed, why
    assert quota.book.in_use("team-e") == {"a100": 1}, why

    second = stored_pod({"gpuadm.io/a100": "1"}, "team-e")
    verdict = await quota.admit(request(second), plan_of(second), snapshot)
    assert verdict is not None
    assert not verdict.allowed, why
    assert verdict.message == 'namespace "team-e": a100 quota exceeded: requested 1, in use 1 of 1'


# --- several replicas ---------------------------------------------------------------------


SHARES = ["0.1", "0.3", "0.2", "0.1", "0.3", "0.2", "0.1", "0.4", "0.1"]


@pytest.mark.parametrize("replicas", [2, 3])
async def test_replicas_releasing_one_line_together_charge_it_once_in_order(
    replicas: int,
) -> None:
    raced = False
    for round_ in range(ROUNDS):
        store = MemoryStore()
        # The shares add up to exactly 1 in several ways, so an error of a tenth would show.
        shares = SHARES[round_ % len(SHARES) :] + SHARES[: round_ % len(SHARES)]
        bodies = [stored_pod({"gpuadm.io/a100": s}, gated=True) for s in shares]
        ledgers = []
        for _ in range(replicas):
            usage = UsageIndex()
            observe(usage, *bodies)
            ledgers.append(QuotaLedger(usage, store, pods_visible=True))
        results = await asyncio.gather(
            *(each.line.release("team-q", config().quotas) for each in ledgers)
        )
        charges = await stored_charges(store, "team-q")
        expected = next_fill(shares)
        assert sum(charges.values()) == expected
        # Every replica hands back exactly the pods charged, to be ungated.
        for released, _ in results:
            assert {w.uid for w in released} == set(charges)
        for each in ledgers:
            await each.book.refresh("team-q")
            assert each.book.in_use("team-q") == {"a100": expected}
        raced = raced or store.conflicts > 0
    assert raced, "the replicas never raced; the test proves nothing"


@pytest.mark.parametrize("replicas", [2, 3])
async def test_replicas_that_see_different_parts_of_the_line_never_charge_past_the_limit(
    replicas: int,
) -> None:
    """Watches lag each other: each replica sees its own part of the line, so each would
    release other pods. The record must end up holding every pod any of them hands back to
    be ungated, and no more than the limit."""
    raced = False
    for round_ in range(ROUNDS):
        store = MemoryStore()
        shares = SHARES[round_ % len(SHARES) :] + SHARES[: round_ % len(SHARES)]
        bodies = [stored_pod({"gpuadm.io/a100": s}, gated=True) for s in shares]
        ledgers = []
        for replica in range(replicas):
            usage = UsageIndex()
            observe(usage, *(b for i, b in enumerate(bodies) if (i + replica) % 3 != 0))
            ledgers.append(QuotaLedger(usage, store, pods_visible=True))
        results = await asyncio.gather(
            *(each.line.release("team-q", config().quotas) for each in ledgers)
        )
        charges = await stored_charges(store, "team-q")
        assert sum(charges.values()) <= 1
        handed = [{w.uid for w in released} for released, _ in results]
        for each in handed:
            assert each <= set(charges), "a pod would lose its gate without being charged"
        assert set().union(*handed) == set(charges)
        raced = raced or store.conflicts > 0
    assert raced, "the replicas never raced; the test proves nothing"


def next_fill(shares: list[str]) -> Fraction:
    """What releasing the line in order charges, with a limit of 1: first come, first served."""
    total = Fraction(0)
    for share in map(Fraction, shares):
        if total + share > 1:
            break
        total += share
    return total


@pytest.mark.parametrize("gated", [True, False])
async def test_an_admission_and_a_release_racing_for_the_same_room_never_both_get_it(
    gated: bool,
) -> None:
    raced = False
    winners = set()
    for round_ in range(ROUNDS):
        store = MemoryStore()
        snapshot = config()
        leader_usage = UsageIndex()
        leader = QuotaLedger(leader_usage, store, pods_visible=True)
        # The admitting replica's watch has not shown the waiting pod yet.
        admitting = QuotaLedger(UsageIndex(), store, pods_visible=True)
        (waiting,) = line_of(leader_usage, {"gpuadm.io/a100": "0.75"})
        arriving = stored_pod({"gpuadm.io/a100": "0.5"}, gated=gated)
        # Each round starts one side a few steps of the event loop after the other.
        (released, _), verdict = await asyncio.gather(
            after(round_ % 3, leader.line.release("team-q", snapshot.quotas)),
            after(round_ // 3 % 3, admitting.admit(request(arriving), plan_of(arriving), snapshot)),
        )
        assert verdict is not None
        charges = await stored_charges(store, "team-q")
        assert sum(charges.values()) <= 1
        assert len(charges) == 1
        assert (verdict.allowed and not verdict.queued) is (uid(arriving) in charges)
        assert bool(released) is (uid(waiting) in charges)
        winners.add("arriving" if uid(arriving) in charges else "waiting")
        raced = raced or store.conflicts > 0
    assert raced, "the two never raced; the test proves nothing"
    assert winners == {"arriving", "waiting"}


def plan_of(body: dict[str, Any]) -> Plan:
    return require_fixed_point(plan(body, config().policy))


async def after(steps: int, work: Awaitable[T]) -> T:
    for _ in range(steps):
        await asyncio.sleep(0)
    return await work


async def test_the_leader_sees_pods_other_replicas_charged_even_when_it_releases_nothing() -> None:
    # The leader has a record cached from an earlier write; another replica then charges a
    # gated pod at admission. A pass that releases nothing must still hand that pod over
    # for its gate to be removed, not tell it to wait.
    usage = UsageIndex()
    store = MemoryStore()
    leader = QuotaLedger(usage, store, pods_visible=True)
    other = QuotaLedger(UsageIndex(), store, pods_visible=True)
    holder = stored_pod({"gpuadm.io/a100": "0.25"}, gated=True)
    observe(usage, holder)
    released, _ = await leader.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(holder)]  # the leader has written once
    observe(usage, ungated(holder))
    big = stored_pod({"gpuadm.io/a100": "1"}, gated=True)
    observe(usage, big)  # waits: 0.25 is in use
    charged = stored_pod({"gpuadm.io/a100": "0.5"}, gated=True)
    # Charged on the other replica, whose watch does not show `big` yet.
    assert not (await admit_gated(other, charged)).queued
    observe(usage, charged)
    released, _ = await leader.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(charged)]
    assert [p.pod.uid for p in await waiting_in("team-q", leader)] == [uid(big)]


async def test_a_gated_dry_run_takes_no_place_in_line() -> None:
    usage = UsageIndex()
    store = MemoryStore()
    quota = QuotaLedger(usage, store, pods_visible=True)
    holder = stored_pod({"gpuadm.io/a100": "0.5"})
    observe(usage, holder)
    await quota.admit(request(holder), plan_of(holder), config())
    probe = stored_pod({"gpuadm.io/a100": "1"}, gated=True)
    real = stored_pod({"gpuadm.io/a100": "0.5"}, gated=True)
    dry, verdict = await asyncio.gather(
        admit_gated(quota, probe, dry_run=True), admit_gated(quota, real)
    )
    assert dry.queued
    assert not verdict.queued, verdict.message
    assert uid(real) in await stored_charges(store, "team-q")


async def test_a_charged_pod_still_gated_keeps_its_reservation_fresh_until_shown_ungated() -> None:
    # The leader is slow to remove a charged pod's gate: its reservation must not expire
    # meanwhile, or the pod would count nowhere and a pod behind it could take its room.
    now = [0.0]
    usage = UsageIndex()
    store = MemoryStore()
    quota = QuotaLedger(usage, store, pods_visible=True, clock=lambda: now[0])
    charged = stored_pod({"gpuadm.io/a100": "1"}, gated=True)
    assert not (await admit_gated(quota, charged)).queued
    behind = stored_pod({"gpuadm.io/a100": "1"}, gated=True)
    observe(usage, charged, behind)
    released, _ = await quota.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(charged)]
    # The leader removed the gate; its watch does not show it yet, so it skips the pod.
    skip = frozenset({uid(charged)})
    for step in range(1, 10):
        now[0] = step * 40.0  # well past the 90 s a reservation lives unrenewed
        released, _ = await quota.line.release("team-q", config().quotas, skip=skip)
        assert released == []
        assert [p.pod.uid for p in await waiting_in("team-q", quota)] == [uid(behind)]


def test_a_charged_pod_deleted_while_gated_stops_counting_at_once() -> None:
    usage = UsageIndex()
    body = stored_pod({"gpuadm.io/a100": "1"}, gated=True)
    observe(usage, body)
    assert not usage.seen(uid(body))
    usage.forget(uid(body), now=5.0)
    assert usage.seen(uid(body))
    assert usage.waiting("team-q") == []


class OvertakenStore(MemoryStore):
    """A record store where, once `overtaken` is set, another replica writes first every
    time: each write loses its race."""

    overtaken = False

    async def write(
        self,
        namespace: str,
        reservations: dict[str, Reservation],
        version: str | None,
        mark: Mark = NO_MARK,
        allowances: Mapping[str, Allowance] | None = None,
    ) -> str:
        if self.overtaken:
            self.conflicts += 1
            raise Conflict(namespace)
        return await super().write(namespace, reservations, version, mark, allowances)


async def test_a_record_that_stays_busy_ends_each_kind_of_write_after_ten_lost_races(
    caplog: pytest.LogCaptureFixture,
) -> None:
    usage = UsageIndex()
    store = OvertakenStore()
    metrics = Metrics()
    quota = QuotaLedger(usage, store, pods_visible=True, metrics=metrics)
    gone, _ = line_of(usage, {"gpuadm.io/a100": "1"}, {"gpuadm.io/a100": "1"})
    released, _ = await quota.line.release("team-q", config().quotas)
    assert [w.uid for w in released] == [uid(gone)]
    usage.forget(uid(gone))
    store.overtaken = True

    # An admission is refused, asking for a retry.
    snapshot = config()
    body = stored_pod({"gpuadm.io/a100": "1"}, namespace="team-e")
    verdict = await quota.admit(
        request(body), require_fixed_point(plan(body, snapshot.policy)), snapshot
    )
    assert verdict is not None
    assert not verdict.allowed
    assert verdict.message == ('the quota record of namespace "team-e" is busy; retry the request')
    assert store.conflicts == MAX_ATTEMPTS
    # A release pass fails as an apiserver error does, and the leader tries again later.
    line_of(usage, {"gpuadm.io/h100": "1"})  # a pod it would charge and release
    with pytest.raises(KubeError, match='the quota record of namespace "team-q" is busy'):
        await quota.line.release("team-q", config().quotas)
    assert store.conflicts == 2 * MAX_ATTEMPTS
    # Giving back a deleted pod's room gives up with a log line: its reservation expires.
    await quota.line.unreserve("team-q", uid(gone))
    assert store.conflicts == 3 * MAX_ATTEMPTS
    assert f"cannot give back the room of pod {uid(gone)}" in caplog.text
    assert "Traceback" not in caplog.text
    # Every lost race is counted.
    assert metrics.record_conflicts._value.get() == 3 * MAX_ATTEMPTS


class FullStore(MemoryStore):
    """A record store with room for no reservation at all."""

    async def write(
        self,
        namespace: str,
        reservations: dict[str, Reservation],
        version: str | None,
        mark: Mark = NO_MARK,
        allowances: Mapping[str, Allowance] | None = None,
    ) -> str:
        if reservations:
            raise RecordFull(namespace, len(reservations), 1024 * 1024)
        return await super().write(namespace, reservations, version, mark, allowances)


async def test_a_pod_created_behind_the_gate_waits_while_the_record_is_full() -> None:
    usage = UsageIndex()
    quota = QuotaLedger(usage, FullStore(), pods_visible=True)
    body = stored_pod({"gpuadm.io/a100": "1"}, gated=True)
    # It fits, so it would be charged now; the record cannot hold its charge, so it waits
    # in line, uncharged, instead of being refused: queue mode refuses none for want of room.
    verdict = await admit_gated(quota, body)
    assert verdict.allowed
    assert verdict.queued
    assert verdict.message == (
        'the quota record of namespace "team-q" is full: the pod waits in line until the '
        "record has room"
    )
    assert verdict.warnings == (f"{verdict.message}; the scheduling gate {GATE} holds it",)
    # The leader's pass cannot charge it either, and fails for the leader to retry.
    observe(usage, body)
    with pytest.raises(KubeError, match="is full"):
        await quota.line.release("team-q", config().quotas)


@pytest.mark.parametrize(
    ("namespace", "mode"), [pytest.param("team-e", "enforce"), pytest.param("team-w", "warn")]
)
async def test_a_pod_that_brings_the_gate_outside_queue_mode_gets_no_place_in_line(
    namespace: str, mode: str
) -> None:
    store = MemoryStore()
    quota = QuotaLedger(UsageIndex(), store, pods_visible=True)
    snapshot = config(MIXED_MODES)
    for limits in ({"gpuadm.io/a100": "1"}, {"gpuadm.io/a100": "0.5"}):  # fits, then not
        body = stored_pod(limits, namespace, gated=True)
        verdict = await quota.admit(
            request(body), require_fixed_point(plan(body, snapshot.policy)), snapshot
        )
        assert verdict is not None
        assert not verdict.allowed
        assert not verdict.queued
        assert verdict.message == (
            f"the scheduling gate {GATE} is gpuadm's: it holds pods in line only in namespaces "
            f'whose GPU quota mode is queue, and namespace "{namespace}" is in {mode} mode: '
            "create the pod without it"
        )
    assert store.writes == 0
