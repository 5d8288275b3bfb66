"""The supervisor: no background task dies silently, and leader-only work follows the Lease."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from tests.builders import POLICY_YAML
from tests.webhook.calls import MakeClient
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.kube.errors import KubeError
from webhook.observe.metrics import Metrics
from webhook.server.app import create_app
from webhook.server.lifecycle import Background, LeaderOnly, Progress, Supervisor
from webhook.server.settings import Settings

FAILURES = [
    pytest.param(TypeError("unhashable type: 'dict'"), id="type-error"),
    pytest.param(RecursionError("maximum recursion depth exceeded"), id="recursion-error"),
    pytest.param(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), id="unicode"),
    pytest.param(KubeError(503, "the apiserver is unavailable"), id="apiserver-error"),
]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def restarts(metrics: Metrics, task: str) -> float:
    return metrics.registry.get_sample_value("gpuadm_task_restarts_total", {"task": task}) or 0


def flaky(error: BaseException, fails: int, done: asyncio.Event) -> Callable[[Progress], object]:
    """Work that fails `fails` times, then makes progress and runs on."""
    calls = 0

    async def run(progress: Progress) -> None:
        nonlocal calls
        calls += 1
        if calls <= fails:
            raise error
        progress()
        done.set()
        await asyncio.Event().wait()

    return run


@pytest.mark.parametrize("error", FAILURES)
async def test_a_task_that_fails_is_restarted_logged_once_and_counted(
    error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "gpuadm.tasks")
    metrics = Metrics()
    supervisor = Supervisor(metrics, first_backoff=0.001, max_backoff=0.001)
    done = asyncio.Event()
    task = asyncio.create_task(
        supervisor.supervise(Background("config", flaky(error, 3, done)))  # type: ignore[arg-type]
    )
    await asyncio.wait_for(done.wait(), 5)
    assert restarts(metrics, "config") == 3
    failed = [r for r in caplog.records if "task config failed" in r.getMessage()]
    assert len(failed) == 1  # the same failure three times is logged once
    assert str(error) in failed[0].getMessage()
    # An apiserver error is expected weather: a warning, no traceback. Anything else is a bug.
    if isinstance(error, KubeError):
        assert (failed[0].levelname, failed[0].exc_info) == ("WARNING", None)
    else:
        assert failed[0].levelname == "ERROR"
        assert failed[0].exc_info is not None
    assert "task config recovered (3 restarts)" in caplog.text
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_task_that_returns_is_a_failure_and_is_run_again() -> None:
    metrics = Metrics()
    supervisor = Supervisor(metrics, first_backoff=0.001, max_backoff=0.001)
    runs = 0
    again = asyncio.Event()

    async def returns(progress: Progress) -> None:
        nonlocal runs
        runs += 1
        if runs == 3:
            again.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(supervisor.supervise(Background("poller", returns)))
    await asyncio.wait_for(again.wait(), 5)
    assert restarts(metrics, "poller") == 2
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_the_backoff_doubles_while_failing_and_resets_after_progress() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    supervisor = Supervisor(Metrics(), first_backoff=1.0, max_backoff=8.0, sleep=sleep)
    runs = 0
    finished = asyncio.Event()

    async def run(progress: Progress) -> None:
        nonlocal runs
        runs += 1
        if runs == 6:
            progress()  # made progress, then failed: the next wait starts over
        if runs == 8:
            finished.set()
            await asyncio.Event().wait()
        raise KubeError(500, "boom")

    task = asyncio.create_task(supervisor.supervise(Background("watch", run)))
    await asyncio.wait_for(finished.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 1.0, 2.0]


async def test_a_task_with_no_progress_past_its_bound_fails_readiness() -> None:
    clock = Clock()
    metrics = Metrics()
    supervisor = Supervisor(metrics, clock=clock, first_backoff=3600)
    progressed = asyncio.Event()

    async def watch(progress: Progress) -> None:
        progress()
        progressed.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(supervisor.supervise(Background("configs", watch, stale_after=90)))
    await asyncio.wait_for(progressed.wait(), 5)
    clock.now += 90
    assert supervisor.not_ready_reason() is None
    clock.now += 5
    assert supervisor.not_ready_reason() == ("configs has made no progress for 95 s (allowed 90 s)")
    age = metrics.registry.get_sample_value(
        "gpuadm_task_last_success_age_seconds", {"task": "configs"}
    )
    assert age == 95
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_task_without_a_bound_never_fails_readiness() -> None:
    clock = Clock()
    supervisor = Supervisor(Metrics(), clock=clock)
    task = asyncio.create_task(
        supervisor.supervise(Background("sweep", lambda progress: asyncio.Event().wait()))  # type: ignore[arg-type,return-value]
    )
    await asyncio.sleep(0)
    clock.now += 10_000
    assert supervisor.not_ready_reason() is None
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class Lease:
    """Leadership as the elector tells it: a flag and its listeners."""

    def __init__(self) -> None:
        self.held = False
        self._lead: list[Callable[[], None]] = []
        self._lose: list[Callable[[], None]] = []

    def leading(self) -> bool:
        return self.held

    def on_lead(self, listener: Callable[[], None]) -> None:
        self._lead.append(listener)

    def on_lose(self, listener: Callable[[], None]) -> None:
        self._lose.append(listener)

    def take(self) -> None:
        self.held = True
        for listener in self._lead:
            listener()

    def lose(self) -> None:
        self.held = False
        for listener in self._lose:
            listener()


async def test_leader_only_work_runs_exactly_while_the_lease_is_held() -> None:
    metrics = Metrics()
    supervisor = Supervisor(metrics)
    lease = Lease()
    started, stopped = [], []
    running = asyncio.Event()

    async def release(progress: Progress) -> None:
        started.append(1)
        running.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.append(1)
            running.clear()

    leader = LeaderOnly(supervisor, lease, [Background("release", release)], check_seconds=60)
    task = asyncio.create_task(supervisor.supervise(Background("leader-work", leader.run)))
    await asyncio.sleep(0.01)
    assert started == []

    lease.take()
    await asyncio.wait_for(running.wait(), 5)
    assert started == [1]
    running_now = metrics.registry.get_sample_value("gpuadm_task_running", {"task": "release"})
    assert running_now == 1

    lease.lose()
    for _ in range(100):
        if stopped:
            break
        await asyncio.sleep(0.01)
    assert stopped == [1]
    assert metrics.registry.get_sample_value("gpuadm_task_running", {"task": "release"}) == 0

    lease.take()  # a new term starts the work again
    await asyncio.wait_for(running.wait(), 5)
    assert started == [1, 1]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert stopped == [1, 1]


async def test_leader_only_work_stops_when_the_lease_lapses_without_a_notice() -> None:
    supervisor = Supervisor(Metrics())
    lease = Lease()
    stopped = asyncio.Event()

    async def publish(progress: Progress) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    leader = LeaderOnly(supervisor, lease, [Background("publish", publish)], check_seconds=0.01)
    task = asyncio.create_task(supervisor.supervise(Background("leader-work", leader.run)))
    lease.take()
    await asyncio.sleep(0.05)
    lease.held = False  # the renew deadline passed; the elector has not said so yet
    await asyncio.wait_for(stopped.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_readyz_fails_naming_a_stale_task_and_recovers(aiohttp_client: MakeClient) -> None:
    clock = Clock()
    supervisor = Supervisor(Metrics(), clock=clock)
    beat: list[Progress] = []

    async def watch(progress: Progress) -> None:
        beat.append(progress)
        progress()
        await asyncio.Event().wait()

    holder = ConfigHolder(
        snapshot_from_text(POLICY_YAML, None, policy_source="p", quotas_source="q")
    )
    app = create_app(
        Settings(),
        holder,
        supervisor=supervisor,
        background=[Background("configmaps", watch, stale_after=90)],
    )
    client = await aiohttp_client(app)
    for _ in range(100):
        if beat:
            break
        await asyncio.sleep(0.01)
    assert (await client.get("/readyz")).status == 200
    clock.now += 91
    response = await client.get("/readyz")
    assert response.status == 503
    assert await response.text() == (
        "not ready: configmaps has made no progress for 91 s (allowed 90 s)"
    )
    beat[0]()
    assert (await client.get("/readyz")).status == 200
