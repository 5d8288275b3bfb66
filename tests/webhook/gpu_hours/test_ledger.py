"""GPU-hours across replicas: runs from pods, the leader's checkpoints into records kept by
an apiserver that refuses stale writes, and the budget judged from them."""

from __future__ import annotations

from fractions import Fraction as F
from typing import Any

import pytest

from policies.quota.gpu_hours import Hours, Run
from tests.builders import POLICY_YAML, container
from tests.webhook.gpu_hours.apiserver import ConfigMaps
from webhook.config.snapshot import ConfigSnapshot, snapshot_from_text
from webhook.gpu_hours.ledger import NOT_READ, HoursLedger
from webhook.gpu_hours.runs import RunIndex
from webhook.gpu_hours.store import HoursStore, Moved
from webhook.kube.errors import KubeError
from webhook.kube.objects import HOURS_DATA_KEY, HOURS_RECORD_LABEL, Page, hours_record_name

QUOTAS = """
mode: enforce
namespaces:
  team-a: {budget: {h100: 100s/1h}}
  team-w: {mode: warn, budget: {h100: 100s/1h}}
  team-q: {mode: queue, budget: {h100: 100s/1h}}
  team-s: {budget: {"*": 100s/1h}}
"""


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def config() -> ConfigSnapshot:
    return snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")


def ledger(
    api: ConfigMaps, runs: RunIndex, clock: Clock, *, bucket: int = 60, ready: bool = True
) -> HoursLedger:
    return HoursLedger(
        runs,
        HoursStore(api, "gpuadm-system"),
        pods_ready=lambda: ready,
        clock=clock,
        bucket_seconds=bucket,
    )


def running(namespace: str, started: int, share: str = "1", ended: int | None = None) -> Run:
    return Run(namespace, "h100", F(share), started, ended, "train")


async def test_each_checkpoint_counts_only_the_time_since_the_last() -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(1000)
    runs.replace([("u1", running("team-a", 990)), ("u2", running("team-a", 995, "1/2"))])
    hours = ledger(api, runs, clock)
    assert await hours.checkpoint(config().quotas) == 1
    assert api.hours("team-a").total("h100") == 10 + F(5, 2)
    clock.now = 1030
    assert await hours.checkpoint(config().quotas) == 1
    assert api.hours("team-a").total("h100") == 40 + F(35, 2)
    assert api.hours("team-a").checkpoint == 1030
    # Nothing ran since: no write, and the checkpoint stays where it was.
    runs.replace([])
    clock.now = 1090
    assert await hours.checkpoint(config().quotas) == 0
    assert api.hours("team-a").checkpoint == 1030


async def test_a_new_leader_counts_from_the_record_so_a_failover_loses_and_doubles_nothing() -> (
    None
):
    api, clock = ConfigMaps(), Clock(1000)
    old_runs, new_runs = RunIndex(), RunIndex()
    for index in (old_runs, new_runs):  # every replica's watch shows the same pod
        index.replace([("u1", running("team-a", 900))])
    old = ledger(api, old_runs, clock)
    await old.checkpoint(config().quotas)
    first_version = api.objects[hours_record_name("team-a")]["metadata"]["resourceVersion"]
    # The old leader dies; the pod ends at 1050 and is deleted before anyone checkpoints.
    new_runs.deleted("u1", now=1050)
    clock.now = 1100
    new = ledger(api, new_runs, clock)
    await new.checkpoint(config().quotas)
    assert api.hours("team-a").total("h100") == 150
    # A write at a version read before the new leader's, as the old leader would make if it
    # came back for a moment, is refused: it counts nothing.
    with pytest.raises(Moved):
        await HoursStore(api, "gpuadm-system").write("team-a", Hours(), first_version)
    assert api.hours("team-a").total("h100") == 150


async def test_a_write_that_loses_its_race_is_counted_at_the_next_checkpoint_once() -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(1000)
    runs.replace([("u1", running("team-a", 1000))])
    hours = ledger(api, runs, clock)
    clock.now = 1010
    await hours.checkpoint(config().quotas)

    real_replace = api.replace_configmap
    raced: list[bool] = []

    async def replace_once_refused(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        if not raced:
            raced.append(True)
            raise KubeError(409, "the object has been modified")
        return await real_replace(namespace, body)

    api.replace_configmap = replace_once_refused  # type: ignore[method-assign]
    clock.now = 1020
    assert await hours.checkpoint(config().quotas) == 0
    assert api.hours("team-a").total("h100") == 10
    clock.now = 1030
    assert await hours.checkpoint(config().quotas) == 1
    assert api.hours("team-a").total("h100") == 30


async def test_an_unreadable_record_is_never_overwritten_and_refuses_budgeted_pods() -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(1000)
    api.objects[hours_record_name("team-a")] = {
        "metadata": {
            "name": hours_record_name("team-a"),
            "resourceVersion": "7",
            "labels": {HOURS_RECORD_LABEL: "team-a"},
        },
        "data": {HOURS_DATA_KEY: '{"checkpoint": "yesterday", "classes": {}}'},
    }
    runs.replace([("u1", running("team-a", 900))])
    hours = ledger(api, runs, clock)
    assert await hours.checkpoint(config().quotas) == 0
    assert api.objects[hours_record_name("team-a")]["metadata"]["resourceVersion"] == "7"
    verdict = hours.judge("team-a", "h100", config())
    assert verdict is not None
    assert not verdict.allowed
    assert verdict.message is not None
    assert verdict.message.startswith(
        'namespace "team-a": its GPU-hour record ConfigMap gpuadm-gpu-hours-team-a cannot be '
        "read: checkpoint 'yesterday' is not a time in seconds; fix or delete it"
    )
    # A class without a budget is not held up by it.
    assert hours.judge("team-a", "a100", config()) is None


async def test_until_the_records_are_read_or_the_pods_in_sync_budgeted_pods_wait() -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(1000)
    hours = ledger(api, runs, clock)
    unread = hours.judge("team-a", "h100", config())
    assert unread is not None
    assert (unread.allowed, unread.message) == (False, NOT_READ)
    await hours.read()
    verdict = hours.judge("team-a", "h100", config())
    assert verdict is not None
    assert verdict.allowed
    out_of_sync = ledger(api, runs, clock, ready=False)
    await out_of_sync.read()
    refused = out_of_sync.judge("team-a", "h100", config())
    assert refused is not None
    assert (refused.allowed, refused.message) == (False, NOT_READ)


@pytest.mark.parametrize(
    ("namespace", "allowed", "would_deny"),
    [
        pytest.param("team-a", False, False, id="enforce-refuses"),
        pytest.param("team-w", True, True, id="warn-admits-and-says-enforce-would-deny"),
        pytest.param("team-q", False, False, id="queue-is-judged-as-enforce"),
        pytest.param("team-s", False, False, id="a-cap-across-classes"),
    ],
)
async def test_a_spent_budget_is_judged_from_the_record_and_the_runs_since(
    namespace: str, allowed: bool, would_deny: bool
) -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(1000)
    runs.replace([("u1", running(namespace, 940))])
    hours = ledger(api, runs, clock)
    await hours.checkpoint(config().quotas)  # 60 s counted
    clock.now = 1035
    early = hours.judge(namespace, "h100", config())
    assert early is not None
    assert early.allowed  # 95 of 100: nearly spent
    assert any("GPU-hour budget is 95% used (95s of 100s/1h" in w for w in early.warnings)
    clock.now = 1040  # 60 counted + 40 since: spent, with no new checkpoint
    verdict = hours.judge(namespace, "h100", config())
    assert verdict is not None
    assert (verdict.allowed, verdict.would_deny) == (allowed, would_deny)
    assert verdict.message is not None
    assert "GPU-hour budget spent: used 100s of 100s in the last 1h" in verdict.message
    assert "it frees only as the class's running pods end" in verdict.message


async def test_a_replica_one_checkpoint_behind_judges_as_the_leader_does() -> None:
    api, clock = ConfigMaps(), Clock(1000)
    leader_runs, follower_runs = RunIndex(), RunIndex()
    for index in (leader_runs, follower_runs):
        index.replace([("u1", running("team-a", 950, "1/2"))])
    leader, follower = ledger(api, leader_runs, clock), ledger(api, follower_runs, clock)
    await leader.checkpoint(config().quotas)
    await follower.read()
    clock.now = 1100
    await leader.checkpoint(config().quotas)  # the follower has not read this one
    clock.now = 1130
    assert leader.readings(config().quotas) == follower.readings(config().quotas)
    (reading,) = follower.readings(config().quotas)
    assert (reading.namespace, reading.gpu_class, reading.gpu_seconds) == ("team-a", "h100", 90)
    assert (reading.budget_used, reading.budget) == (90, 100)


async def test_held_names_the_spent_classes_of_a_line_with_why() -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(1000)
    runs.replace([("u1", running("team-q", 800, ended=950))])
    hours = ledger(api, runs, clock)
    await hours.checkpoint(config().quotas)
    held = hours.held("team-q", ["h100", "a100"], config())
    assert list(held) == ["h100"]
    assert "GPU-hour budget spent: used 150s of 100s in the last 1h" in held["h100"]
    # Buckets of 60 s: 40 s in [780, 840), 60 in [840, 900), 50 in [900, 960). When the
    # second leaves the window, at 900 + 3600, 50 s are left of the 100 allowed.
    assert "enough frees at 1970-01-01T01:15:00Z" in held["h100"]


async def test_a_failed_list_is_raised_for_the_supervisor() -> None:
    class Down(ConfigMaps):
        async def list_configmaps(self, namespace: str, label_selector: str) -> Page:
            raise KubeError(0, "connection refused")

    hours = ledger(Down(), RunIndex(), Clock(1000))
    with pytest.raises(KubeError):
        await hours.read()
    with pytest.raises(KubeError):
        await hours.checkpoint(config().quotas)


def test_a_pod_as_the_watch_shows_it_becomes_a_run_from_its_first_start() -> None:
    runs = RunIndex(clock=lambda: 2000)
    snapshot = config()
    body: dict[str, Any] = {
        "metadata": {"uid": "u1", "name": "train", "namespace": "team-a"},
        "spec": {"containers": [container("main", {"nvidia.com/gpu": "1"})]},
        "status": {"phase": "Pending"},
    }
    body["metadata"]["annotations"] = {"gpuadm.io/class": "h100"}
    runs.observe(body, snapshot.policy, snapshot.quotas)
    assert list(runs.runs("team-a")) == []  # pending: free
    body["status"] = {
        "phase": "Running",
        "containerStatuses": [{"state": {"running": {"startedAt": "1970-01-01T00:16:50Z"}}}],
    }
    runs.observe(body, snapshot.policy, snapshot.quotas)
    assert list(runs.runs("team-a")) == [Run("team-a", "h100", F(1), 1010, None, "train")]
    runs.deleted("u1", now=1100)
    assert next(runs.runs("team-a")).ended == 1100
    # An ended run stays until its namespace's record is counted past its end, however long.
    runs.counted_to = lambda namespace: 1099
    runs.prune()
    assert len(runs) == 1
    runs.counted_to = lambda namespace: 1100
    runs.prune()
    assert len(runs) == 0


def test_a_list_ends_the_runs_it_no_longer_shows() -> None:
    runs = RunIndex()
    runs.replace([("gone", running("team-a", 900)), ("ended", running("team-a", 900, ended=950))])
    runs.begin_list()
    runs.end_list(now=1000)
    assert sorted((r.started, r.ended) for r in runs.runs("team-a")) == [(900, 950), (900, 1000)]


async def test_a_change_of_runs_is_judged_from_the_next_second() -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(1000)
    hours = ledger(api, runs, clock)
    await hours.read()
    runs.replace([("u1", running("team-a", 950))])
    first = hours.judge("team-a", "h100", config())
    assert first is not None
    assert first.allowed  # 50 of 100
    snapshot = config()
    body: dict[str, Any] = {
        "metadata": {"uid": "u2", "name": "more", "namespace": "team-a"},
        "spec": {"containers": [container("main", {"nvidia.com/gpu": "1"})]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"state": {"running": {"startedAt": "1970-01-01T00:15:50Z"}}}],
        },
    }
    body["metadata"]["annotations"] = {"gpuadm.io/class": "h100"}
    runs.observe(body, snapshot.policy, snapshot.quotas)  # another 50 s
    # Within the second, the spending worked out for it stands: a burst shares one pass.
    same = hours.judge("team-a", "h100", config())
    assert same is not None
    assert same.allowed
    clock.now = 1001
    second = hours.judge("team-a", "h100", config())
    assert second is not None
    assert not second.allowed


async def test_an_ended_run_is_kept_until_a_checkpoint_has_counted_it() -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(1000)
    runs.replace([("u1", running("team-a", 900, ended=990))])
    hours = ledger(api, runs, clock)
    await hours.read()  # no record yet: nothing counted it
    assert len(runs) == 1
    await hours.checkpoint(config().quotas)
    await hours.read()
    assert len(runs) == 0
    assert api.hours("team-a").total("h100") == 90


LONG = """
namespaces:
  team-a: {budget: {h100: 1000h/90d, "*": 2000h/90d}}
"""


async def test_a_window_longer_than_showback_keeps_its_hours() -> None:
    # One A100 for 80 days, checkpointed daily: the 90-day window holds all of it, though
    # showback alone keeps 35 days.
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(100 * 86400)
    runs.replace([("u1", running("team-a", 10 * 86400, ended=90 * 86400))])
    hours = ledger(api, runs, clock, bucket=3600)
    quotas = snapshot_from_text(POLICY_YAML, LONG, policy_source="p", quotas_source="q").quotas
    for day in range(11, 101):
        clock.now = day * 86400
        await hours.checkpoint(quotas)
    counted = api.hours("team-a")
    assert counted.total("h100") == 80 * 86400
    assert counted.within("h100", int(clock.now) - 90 * 86400) == 80 * 86400


async def test_a_checkpoint_far_ahead_of_the_clock_is_not_believed() -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(1000)
    await HoursStore(api, "gpuadm-system").write("team-a", Hours(10**9), None)
    runs.replace([("u1", running("team-a", 900))])
    hours = ledger(api, runs, clock)
    await hours.read()
    verdict = hours.judge("team-a", "h100", config())
    assert verdict is not None
    assert not verdict.allowed
    assert verdict.message is not None
    assert "is counted to 2001-09-09T01:46:40Z, ahead of this replica's clock" in verdict.message
    assert await hours.checkpoint(config().quotas) == 0  # nor written over


async def test_metrics_show_a_budget_across_classes_and_nothing_before_the_records() -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(1000)
    runs.replace([("u1", running("team-s", 900))])
    hours = ledger(api, runs, clock)
    assert hours.readings(config().quotas) == []  # each run would count from its start
    await hours.read()
    readings = {r.gpu_class: r for r in hours.readings(config().quotas)}
    assert readings["h100"].gpu_seconds == 100
    assert readings["h100"].budget is None
    assert (readings["*"].gpu_seconds, readings["*"].budget_used, readings["*"].budget) == (
        None,
        100,
        100,
    )


async def test_records_unchanged_since_the_last_read_are_not_decoded_again() -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(1000)
    runs.replace([("u1", running("team-a", 900)), ("u2", running("team-b", 900))])
    hours = ledger(api, runs, clock)
    await hours.checkpoint(config().quotas)
    first = await hours.store.read_all()  # type: ignore[union-attr]
    again = await hours.store.read_all(first)  # type: ignore[union-attr]
    assert all(again[ns] is first[ns] for ns in first)
    clock.now = 1010
    runs.replace([("u1", running("team-a", 900))])
    await hours.checkpoint(config().quotas)
    moved = await hours.store.read_all(first)  # type: ignore[union-attr]
    assert moved["team-b"] is first["team-b"]
    assert moved["team-a"] is not first["team-a"]
    assert moved["team-a"].hours != first["team-a"].hours


async def test_ended_runs_stay_while_the_record_is_counted_to_a_moment_not_believed() -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(1000)
    await HoursStore(api, "gpuadm-system").write("team-a", Hours(10**9), None)
    runs.replace([("u1", running("team-a", 900, ended=990))])
    hours = ledger(api, runs, clock)
    await hours.read()
    assert len(runs) == 1  # not counted by a checkpoint that is not believed
