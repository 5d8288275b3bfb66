"""GPU-hour budgets on the GPUQuota objects: each budget is shown with what its record counts
in its window, a namespace with only a budget is published, and what ran since the record's
checkpoint does not change an object."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction as F
from typing import Any

from policies import load_quotas
from policies.quota.budget import Budget
from policies.quota.gpu_hours import Bucket, ClassHours, Hours, RecordError, Run
from tests.builders import POLICY_YAML
from tests.webhook.leader.test_publish import GPUQuotas
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.gpu_hours.ledger import HoursLedger
from webhook.gpu_hours.runs import RunIndex
from webhook.gpu_hours.store import Stored
from webhook.kube.rest import AsyncApi
from webhook.leader.publish import QuotaPublisher
from webhook.quota.holdings import Holding
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex

QUOTAS = """
default: {budget: {h100: 10h/1d}}
namespaces:
  team-b: {budget: {h100: 500h/7d}}
  team-c: {a100: 2, budget: {a100: 30m/12h, "*": 900h/30d}}
"""
HOUR = 3600
NOW = 1_000 * HOUR


def publisher(
    api: GPUQuotas,
    usage: UsageIndex,
    budget_used: Callable[[str], Mapping[str, F]],
) -> QuotaPublisher:
    snapshot = snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")
    stand_in: Any = api
    typed: AsyncApi = stand_in
    return QuotaPublisher(
        QuotaLedger(usage, MemoryStore(), pods_visible=True).line,
        usage,
        ConfigHolder(snapshot),
        typed,
        ready=lambda: True,
        # The first pass is a full one; the next ones look at the namespaces woken.
        clock=lambda: 100.0,
        budget_used=budget_used,
    )


def statuses(api: GPUQuotas) -> dict[tuple[str, str], dict[str, Any]]:
    return {key: obj["status"] for key, obj in api.objects.items()}


async def test_the_objects_show_each_budget_and_what_was_used_of_it() -> None:
    api = GPUQuotas()
    used = {
        "team-b": {"h100": F(1_845_900)},
        "team-c": {"a100": F(900), "*": F(36 * HOUR)},
    }
    await publisher(api, UsageIndex(), lambda ns: used.get(ns, {})).pass_once()
    shown = statuses(api)
    # team-b has nothing but a budget, and holds nothing: it is shown all the same.
    assert sorted(shown) == [
        ("team-b", "h100"),
        ("team-c", "a100"),
        ("team-c", "all.classes"),
    ]
    assert shown["team-b", "h100"]["budget"] == "500h/7d"
    assert shown["team-b", "h100"]["budgetUsed"] == "512.75h"
    assert "limit" not in shown["team-b", "h100"]
    assert (shown["team-c", "a100"]["limit"], shown["team-c", "a100"]["budget"]) == ("2", "30m/12h")
    # Said in the unit the budget's amount is written in.
    assert shown["team-c", "a100"]["budgetUsed"] == "15m"
    assert shown["team-c", "all.classes"]["class"] == "*"
    assert shown["team-c", "all.classes"]["budget"] == "900h/30d"
    assert shown["team-c", "all.classes"]["budgetUsed"] == "36h"


async def test_an_unreadable_record_shows_the_budget_without_what_was_used() -> None:
    api = GPUQuotas()
    await publisher(api, UsageIndex(), lambda ns: {}).pass_once()
    status = statuses(api)["team-b", "h100"]
    assert status["budget"] == "500h/7d"
    assert "budgetUsed" not in status


async def test_a_namespace_under_the_default_budget_is_shown_while_its_window_holds_use() -> None:
    api = GPUQuotas()
    usage = UsageIndex()
    usage.replace_all({"uid-t": Holding("team-z", "h100", F(1), "trainer")}, now=0)
    used = {"team-z": {"h100": F(2 * HOUR)}}
    quotas = publisher(api, usage, lambda ns: used.get(ns, {}))
    await quotas.pass_once()
    assert statuses(api)["team-z", "h100"]["budgetUsed"] == "2h"
    # The pod is gone; its GPU-hours are still in the budget's window.
    usage.replace_all({}, now=1)
    quotas.wake("team-z")
    await quotas.pass_once()
    assert statuses(api)["team-z", "h100"]["inUse"] == "0"
    assert statuses(api)["team-z", "h100"]["budgetUsed"] == "2h"
    # The window has moved past them: nothing is left to show.
    used["team-z"] = {"h100": F(0)}
    quotas.wake("team-z")
    await quotas.pass_once()
    assert ("team-z", "h100") not in api.objects


class Records:
    """The GPU-hour records as `HoursStore.read_all` returns them."""

    def __init__(self, *records: Stored) -> None:
        self.records = {r.namespace: r for r in records}

    async def read_all(self, known: Mapping[str, Stored] | None = None) -> dict[str, Stored]:
        return dict(self.records)


def record(checkpoint: int = NOW - 60, extra: int = 0) -> Hours:
    return Hours(
        checkpoint,
        {
            "a100": ClassHours(
                F(9 * HOUR),
                (
                    # Ended 12h ago, at the edge of a 12h window: out of it.
                    Bucket(NOW - 13 * HOUR, HOUR, F(4 * HOUR)),
                    Bucket(NOW - 2 * HOUR, HOUR, F(HOUR)),
                    Bucket(NOW - HOUR, HOUR, F(HOUR, 2) + extra),
                ),
            ),
            "h100": ClassHours(F(3 * HOUR), (Bucket(NOW - 3 * HOUR, HOUR, F(3 * HOUR)),)),
        },
    )


class Clock:
    def __init__(self) -> None:
        self.now = float(NOW)

    def __call__(self) -> float:
        return self.now


async def ledger(records: Records, clock: Clock) -> HoursLedger:
    """A replica's ledger that has read `records`, with an A100 running since before the
    records' checkpoint."""
    runs = RunIndex()
    runs.replace([("uid-a", Run("team-c", "a100", F(1), NOW - 2 * HOUR, pod="trainer"))])
    stand_in: Any = records
    hours = HoursLedger(runs, stand_in, clock=clock)
    await hours.read()
    return hours


def reader(hours: HoursLedger) -> Callable[[str], Mapping[str, F]]:
    """What the publisher reads of a namespace's budgets, as a replica wires it."""
    return lambda namespace: hours.recorded_use(namespace, budgets(namespace))


def budgets(namespace: str) -> Mapping[str, Budget]:
    return load_quotas(QUOTAS).budgets_for(namespace) if namespace != "team-x" else {}


async def test_budget_use_is_read_from_the_record_in_each_window() -> None:
    clock = Clock()
    hours = await ledger(Records(Stored("team-c", record(), "1")), clock)
    read = reader(hours)
    # a100: 30m/12h, `*`: 900h/30d. The bucket that ended 12h ago is out of the 12h window.
    assert read("team-c") == {"a100": F(3 * HOUR, 2), "*": F(17 * HOUR, 2)}
    # The trainer's minute since the checkpoint is not counted, nor its next hour: the
    # objects change at checkpoints only. The ledger's own judgement counts it.
    clock.now += HOUR
    assert read("team-c") == {"a100": F(3 * HOUR, 2), "*": F(17 * HOUR, 2)}
    judged = hours.spending("team-c", int(clock.now), load_quotas(QUOTAS))
    assert not isinstance(judged, RecordError)
    assert judged.hours.within("a100", NOW - 11 * HOUR) > F(3 * HOUR, 2)
    # A namespace without budgets reads nothing.
    assert read("team-x") == {}


async def test_an_unreadable_record_reads_as_nothing_known() -> None:
    broken = Stored("team-c", RecordError("class 'a100' has no list of buckets"), "1")
    clock = Clock()
    hours = await ledger(Records(broken), clock)
    assert reader(hours)("team-c") == {}


async def test_an_object_changes_at_a_checkpoint_not_while_pods_run() -> None:
    api = GPUQuotas()
    records = Records(Stored("team-c", record(), "1"))
    clock = Clock()
    hours = await ledger(records, clock)
    quotas = publisher(api, UsageIndex(), reader(hours))
    await quotas.pass_once()
    assert api.objects["team-c", "a100"]["status"]["budgetUsed"] == "90m"
    written = {key: obj["metadata"]["resourceVersion"] for key, obj in api.objects.items()}
    clock.now += 600
    quotas.wake("team-c")
    await quotas.pass_once()
    assert {key: obj["metadata"]["resourceVersion"] for key, obj in api.objects.items()} == written
    # The leader's checkpoint counts the ten minutes into the record, which every replica
    # reads.
    records.records["team-c"] = Stored("team-c", record(NOW + 600, extra=600), "2")
    await hours.read()
    quotas.wake("team-c")
    await quotas.pass_once()
    assert api.objects["team-c", "a100"]["status"]["budgetUsed"] == "100m"
    assert api.objects["team-c", "all.classes"]["status"]["budgetUsed"] == "8.67h"
