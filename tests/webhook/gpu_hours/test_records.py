"""Records the ledger cannot vouch for: found by name whatever their labels, a write that
fails said loudly, and a namespace whose record is stale refused as one unread is, while a
namespace where nothing ran is not."""

from __future__ import annotations

import asyncio
import logging
from fractions import Fraction as F
from typing import Any

import orjson
import pytest

from policies.quota.gpu_hours import Hours, Run, encode_hours
from tests.builders import POLICY_YAML
from tests.webhook.calls import MakeClient
from tests.webhook.gpu_hours.apiserver import ConfigMaps
from tests.webhook.gpu_hours.test_ledger import Clock
from webhook.config.snapshot import ConfigHolder, ConfigSnapshot, snapshot_from_text
from webhook.gpu_hours import store as store_module
from webhook.gpu_hours.ledger import HoursLedger
from webhook.gpu_hours.runs import RunIndex
from webhook.gpu_hours.store import HoursStore
from webhook.kube.errors import KubeError
from webhook.kube.objects import HOURS_DATA_KEY, HOURS_RECORD_LABEL, MANAGED_BY, Page
from webhook.kube.objects import hours_record_name as name_of
from webhook.observe.metrics import Metrics
from webhook.server.app import create_app
from webhook.server.settings import Settings

QUOTAS = """
namespaces:
  team-a: {budget: {h100: 1000h/1d}}
  team-b: {budget: {h100: 1000h/1d}}
"""
T = 1_800_000_000
# Three checkpoints of 60 s and a handover of 30 s.
STALE = 210


def config() -> ConfigSnapshot:
    return snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")


def ledger(
    api: ConfigMaps, runs: RunIndex, clock: Clock, metrics: Metrics | None = None
) -> HoursLedger:
    return HoursLedger(
        runs,
        HoursStore(api, "gpuadm-system"),
        clock=clock,
        bucket_seconds=60,
        handover_seconds=30,
        metrics=metrics,
    )


def h100(started: int, ended: int | None = None, namespace: str = "team-a") -> Run:
    return Run(namespace, "h100", F(1), started, ended, "train")


def verdict_of(hours: HoursLedger, namespace: str = "team-a") -> tuple[bool, str]:
    verdict = hours.judge(namespace, "h100", config())
    assert verdict is not None
    return verdict.allowed, verdict.message or ""


async def started(checkpoint: int, run: Run, at: int) -> tuple[HoursLedger, Clock]:
    """A replica started at `at`, which has read team-a's record counted to `checkpoint`
    while `run` is known; its clock, to move on."""
    api, clock = ConfigMaps(), Clock(at)
    await HoursStore(api, "gpuadm-system").write("team-a", Hours(checkpoint, {}), None)
    runs = RunIndex()
    runs.replace([("u1", run)])
    replica = ledger(api, runs, clock)
    await replica.read()
    return replica, clock


def problems(metrics: Metrics) -> dict[tuple[str, str], float]:
    return {
        (s.labels["namespace"], s.labels["problem"]): s.value
        for family in metrics.registry.collect()
        if family.name == "gpuadm_gpu_hours_record_problems"
        for s in family.samples
    }


def failures(metrics: Metrics) -> dict[str, float]:
    return {
        s.labels["reason"]: s.value
        for family in metrics.registry.collect()
        if family.name == "gpuadm_gpu_hours_record_write_failures"
        for s in family.samples
        if s.name.endswith("_total")
    }


# --- Found by name --------------------------------------------------------------------------


def record(namespace: str, labels: dict[str, str], hours: Hours) -> dict[str, Any]:
    return {
        "metadata": {"name": name_of(namespace), "resourceVersion": "5", "labels": labels},
        "data": {HOURS_DATA_KEY: orjson.dumps(encode_hours(hours)).decode()},
    }


@pytest.mark.parametrize(
    ("labels", "labelled"),
    [
        pytest.param({**MANAGED_BY, HOURS_RECORD_LABEL: "team-a"}, True, id="as-written"),
        pytest.param(dict(MANAGED_BY), False, id="label-taken-off"),
        pytest.param({**MANAGED_BY, HOURS_RECORD_LABEL: "team-b"}, False, id="wrong-namespace"),
        pytest.param({HOURS_RECORD_LABEL: "team-a"}, False, id="not-marked-as-gpuadms"),
        pytest.param({}, False, id="no-labels"),
    ],
)
async def test_a_record_is_read_by_its_name_whatever_its_labels(
    labels: dict[str, str], labelled: bool
) -> None:
    api = ConfigMaps()
    api.objects[name_of("team-a")] = record("team-a", labels, Hours(T, {}))
    api.objects["gpuadm-quotas"] = {"metadata": {"name": "gpuadm-quotas"}, "data": {}}
    api.objects["gpuadm-usage-team-a"] = {
        "metadata": {"name": "gpuadm-usage-team-a", "labels": {HOURS_RECORD_LABEL: "team-c"}}
    }
    records = await HoursStore(api, "gpuadm-system").read_all()
    assert list(records) == ["team-a"]
    assert records["team-a"].hours == Hours(T, {})
    assert records["team-a"].labelled is labelled


async def test_a_create_that_meets_a_record_of_its_name_reads_it_and_counts_into_it_next() -> None:
    # The list did not show it yet: created meanwhile (a second leader for a moment).
    class Late(ConfigMaps):
        hidden = True

        async def list_configmaps(self, namespace: str, label_selector: str) -> Page:
            page = await super().list_configmaps(namespace, label_selector)
            if self.hidden:
                self.hidden = False
                return Page(
                    [i for i in page.items if i["metadata"]["name"] != name_of("team-a")], "", None
                )
            return page

    api, runs, clock = Late(), RunIndex(), Clock(T)
    await HoursStore(api, "gpuadm-system").write("team-a", Hours(T - 100, {}), None)
    runs.replace([("u1", h100(T - 100))])
    hours = ledger(api, runs, clock)
    assert await hours.checkpoint(config().quotas) == 0
    assert api.hours("team-a") == Hours(T - 100, {})
    assert verdict_of(hours)[0]  # counted from the record found
    clock.now = T + 60
    assert await hours.checkpoint(config().quotas) == 1
    assert api.hours("team-a").total("h100") == 160


async def test_a_create_that_meets_an_unreadable_record_says_so_and_refuses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Late(ConfigMaps):
        async def list_configmaps(self, namespace: str, label_selector: str) -> Page:
            return Page([], "", None)

    api, runs, clock = Late(), RunIndex(), Clock(T)
    api.objects[name_of("team-a")] = {
        "metadata": {"name": name_of("team-a"), "resourceVersion": "3"},
        "data": {HOURS_DATA_KEY: "{"},
    }
    runs.replace([("u1", h100(T - 100))])
    hours = ledger(api, runs, clock)
    with caplog.at_level(logging.ERROR, logger="gpuadm.gpu_hours"):
        assert await hours.checkpoint(config().quotas) == 0
    assert any("gpuadm-gpu-hours-team-a cannot be read" in r.getMessage() for r in caplog.records)
    allowed, message = verdict_of(hours)
    assert not allowed
    assert "cannot be read: hours.json is not JSON" in message


# --- A write that fails ----------------------------------------------------------------------


async def test_a_record_too_large_to_write_is_loud_keeps_its_runs_and_then_refuses(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = Metrics()
    api, runs, clock = ConfigMaps(), RunIndex(metrics=metrics), Clock(T - 60)
    runs.replace([("u1", h100(T - 60, T - 30)), ("u2", h100(T - 60, namespace="team-b"))])
    hours = ledger(api, runs, clock, metrics)  # watching since T - 60
    clock.now = T
    monkeypatch.setattr(store_module, "RECORD_MAX_BYTES", 10)
    with caplog.at_level(logging.ERROR, logger="gpuadm.gpu_hours"):
        assert await hours.checkpoint(config().quotas) == 0
        clock.now = T + 60
        await hours.checkpoint(config().quotas)
    assert failures(metrics) == {"too_large": 4}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2  # one a namespace, not one a checkpoint
    assert errors[0].startswith(
        "cannot write the GPU-hour record of namespace team-a (too_large): its text takes"
    )
    assert problems(metrics) == {("team-a", "unwritable"): 1, ("team-b", "unwritable"): 1}
    notice = hours.notice()
    assert notice is not None
    assert notice.startswith(
        "GPU-hour records with a problem: team-a (unwritable), team-b (unwritable);"
    )
    # Nothing counted them: the ended run stays, and judgements count it from its start.
    await hours.read()
    assert len(runs) == 2
    assert verdict_of(hours)[0]
    # A record uncounted for longer than the bound while its pods ran: refused.
    clock.now = T - 60 + STALE
    assert verdict_of(hours)[0]
    clock.now = T - 60 + STALE + 1
    allowed, message = verdict_of(hours)
    assert not allowed
    assert message == (
        'namespace "team-a": its GPU-hour record ConfigMap gpuadm-gpu-hours-team-a has not '
        "been written, though its pods have run for more than 210 s; gpuadm cannot vouch for "
        "what the namespace used, so it admits no pods of classes with a budget here until "
        "the record is written again; retry later"
    )
    await hours.read()
    assert problems(metrics) == {
        ("team-a", "stale"): 1,
        ("team-a", "unwritable"): 1,
        ("team-b", "stale"): 1,
        ("team-b", "unwritable"): 1,
    }
    notice = hours.notice()
    assert notice is not None
    assert notice.startswith(
        "GPU-hour records with a problem: team-a (stale, unwritable), team-b (stale, unwritable);"
    )
    # Written again: everything counted, nothing refused, the problems gone.
    monkeypatch.setattr(store_module, "RECORD_MAX_BYTES", 512 * 1024)
    assert await hours.checkpoint(config().quotas) == 2
    assert api.hours("team-a").total("h100") == 30
    assert api.hours("team-b").total("h100") == STALE + 1
    assert verdict_of(hours) == (True, "")
    assert problems(metrics) == {}
    assert hours.notice() is None
    await hours.read()
    assert len(runs) == 1  # the ended run, counted at last


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        pytest.param(422, "too_large", id="the-apiserver-says-too-long"),
        pytest.param(413, "too_large", id="the-apiserver-says-too-large"),
        pytest.param(500, "apiserver", id="an-apiserver-error"),
        pytest.param(0, "apiserver", id="no-answer"),
    ],
)
async def test_a_write_the_apiserver_refuses_is_counted_by_reason(status: int, reason: str) -> None:
    class Refusing(ConfigMaps):
        async def create_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
            raise KubeError(status, "no")

    metrics = Metrics()
    runs = RunIndex()
    runs.replace([("u1", h100(T - 60))])
    hours = ledger(Refusing(), runs, Clock(T), metrics)
    await hours.checkpoint(config().quotas)
    assert failures(metrics) == {reason: 1}


async def test_a_leader_that_stops_leading_stops_saying_its_writes_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metrics = Metrics()
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(T)
    runs.replace([("u1", h100(T - 60))])
    hours = HoursLedger(
        runs,
        HoursStore(api, "gpuadm-system"),
        clock=clock,
        checkpoint_seconds=0.01,
        metrics=metrics,
    )
    monkeypatch.setattr(store_module, "RECORD_MAX_BYTES", 10)
    tried = asyncio.Event()
    task = asyncio.create_task(hours.checkpoint_forever(lambda: config().quotas, tried.set))
    await asyncio.wait_for(tried.wait(), 5)
    assert failures(metrics) == {"too_large": 1}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await hours.read()
    assert problems(metrics) == {}


# --- Stale, and idle --------------------------------------------------------------------------


async def test_an_idle_namespace_with_an_old_record_is_judged_not_refused() -> None:
    # Nothing has run in team-a for a week: the leader wrote nothing, and needed not.
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(T - 7 * 86400)
    runs.replace([("u1", h100(T - 7 * 86400 - 600, T - 7 * 86400 - 100))])
    leader = ledger(api, runs, clock)
    await leader.checkpoint(config().quotas)
    clock.now = T
    await leader.checkpoint(config().quotas)
    replica = ledger(api, RunIndex(), clock)  # started at T, watching since
    await replica.read()
    clock.now = T + 7 * 86400
    assert verdict_of(replica) == (True, "")
    assert replica.notice() is None


@pytest.mark.parametrize(
    ("ran", "allowed"),
    [
        pytest.param(h100(T - 30), False, id="running-since-before-the-checkpoint"),
        pytest.param(h100(T + 100, T + 150), False, id="ran-after-it-and-ended"),
        pytest.param(h100(T - 100, T), True, id="ended-by-the-checkpoint"),
        pytest.param(h100(T + STALE + 100), True, id="started-within-the-bound"),
        pytest.param(h100(T + 200), True, id="started-exactly-the-bound-ago"),
        pytest.param(h100(T + 199), False, id="started-a-second-before-the-bound"),
        pytest.param(h100(T + 100, T + 150, namespace="team-b"), True, id="another-namespace"),
    ],
)
async def test_a_record_is_stale_when_pods_ran_in_time_left_uncounted_past_the_bound(
    ran: Run, allowed: bool
) -> None:
    api, clock = ConfigMaps(), Clock(T - 600)
    await HoursStore(api, "gpuadm-system").write("team-a", Hours(T, {}), None)
    runs = RunIndex()
    runs.replace([("u1", ran)])
    replica = ledger(api, runs, clock)  # watching since T - 600
    clock.now = T
    await replica.read()
    clock.now = T + STALE + 200
    got, message = verdict_of(replica)
    assert got is allowed
    if not allowed:
        assert message.startswith(
            'namespace "team-a": its GPU-hour record ConfigMap gpuadm-gpu-hours-team-a is '
            "counted only to 2027-01-15T08:00:00Z, 410 s ago, though its pods ran since; "
            "gpuadm cannot vouch for what the namespace used"
        )


async def test_a_record_turns_stale_a_second_after_the_bound() -> None:
    replica, clock = await started(T, h100(T - 30), at=T - 600)
    clock.now = T + STALE
    assert verdict_of(replica)[0]
    clock.now = T + STALE + 1
    assert not verdict_of(replica)[0]


@pytest.mark.parametrize(
    ("ended", "allowed"),
    [
        pytest.param(T, True, id="ended-as-the-replica-started"),
        pytest.param(T + 1, False, id="ended-a-second-after"),
    ],
)
async def test_a_run_that_ended_before_a_replica_watched_is_no_sign_of_staleness(
    ended: int, allowed: bool
) -> None:
    replica, clock = await started(T - 3600, h100(T - 600, ended), at=T)
    clock.now = T + STALE + 100
    assert verdict_of(replica)[0] is allowed


async def test_a_replica_judges_staleness_only_over_the_time_it_has_watched() -> None:
    # Started at T with a record counted to an hour before (gpuadm was down): the leader
    # needs a moment to count what ran meanwhile.
    replica, clock = await started(T - 3600, h100(T - 7200), at=T)
    clock.now = T + STALE
    assert verdict_of(replica)[0]
    clock.now = T + STALE + 1
    assert not verdict_of(replica)[0]


async def test_readyz_shows_a_records_problem_and_stays_ready(
    aiohttp_client: MakeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(T)
    runs.replace([("u1", h100(T - 60))])
    hours = ledger(api, runs, clock)
    monkeypatch.setattr(store_module, "RECORD_MAX_BYTES", 10)
    await hours.checkpoint(config().quotas)
    app = create_app(Settings(), ConfigHolder(config()), budgets=hours, notices=[hours.notice])
    client = await aiohttp_client(app)
    response = await client.get("/readyz")
    assert response.status == 200
    assert (await response.text()).startswith(
        "ok; GPU-hour records with a problem: team-a (unwritable);"
    )
