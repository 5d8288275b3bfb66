"""The runs a replica keeps: the earliest start seen of each pod, starts no later than this
replica's clock, and every ended run kept until a checkpoint counts it."""

from __future__ import annotations

import logging
from fractions import Fraction as F
from typing import Any

import pytest

from policies.quota.gpu_hours import Run, timestamp
from tests.builders import POLICY_YAML, container
from webhook.config.snapshot import ConfigSnapshot, snapshot_from_text
from webhook.gpu_hours.runs import RunIndex
from webhook.observe.metrics import Metrics

QUOTAS = """
namespaces:
  team-a: {budget: {h100: 100h/7d}}
"""
T = 1_800_000_000


def config() -> ConfigSnapshot:
    return snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")


def pod(
    *states: tuple[str, dict[str, Any]],
    restarts: int = 0,
    phase: str = "Running",
    pod_start: int | None = T,
    uid: str = "u1",
) -> dict[str, Any]:
    """A pod of one H100 whose container shows `states` (state, then lastState), and
    whose status says when its node took it (None: says not)."""
    status: dict[str, Any] = {"name": "main", "restartCount": restarts}
    for key, (kind, times) in zip(("state", "lastState"), states, strict=False):
        status[key] = {kind: {name: timestamp(at) for name, at in times.items()}}
    return {
        "metadata": {
            "uid": uid,
            "name": "train",
            "namespace": "team-a",
            "annotations": {"gpuadm.io/class": "h100"},
        },
        "spec": {"containers": [container("main", {"nvidia.com/gpu": "1"})]},
        "status": {
            "phase": phase,
            "containerStatuses": [status],
            **({} if pod_start is None else {"startTime": timestamp(pod_start)}),
        },
    }


def running(start: int) -> tuple[str, dict[str, Any]]:
    return "running", {"startedAt": start}


def terminated(start: int, finish: int) -> tuple[str, dict[str, Any]]:
    return "terminated", {"startedAt": start, "finishedAt": finish}


def only_run(runs: RunIndex) -> Run:
    (run,) = runs.runs("team-a")
    return run


def test_a_run_keeps_the_earliest_start_seen_across_restarts() -> None:
    # Statuses that do not say when the pod started: only what was seen can keep its start.
    runs, snapshot = RunIndex(clock=lambda: T + 1000), config()
    for shown in (
        pod(running(T + 10), pod_start=None),
        pod(running(T + 100), terminated(T + 10, T + 90), restarts=1, pod_start=None),
        pod(running(T + 200), terminated(T + 100, T + 190), restarts=2, pod_start=None),
    ):
        runs.observe(shown, snapshot.policy, snapshot.quotas)
    assert only_run(runs).started == T + 10


def test_a_relist_keeps_the_earliest_start_seen() -> None:
    runs, snapshot = RunIndex(clock=lambda: T + 1000), config()
    runs.observe(pod(running(T + 10)), snapshot.policy, snapshot.quotas)
    later = pod(running(T + 200), terminated(T + 100, T + 190), restarts=2, pod_start=None)
    runs.begin_list()
    runs.observe(later, snapshot.policy, snapshot.quotas)
    runs.end_list(now=T + 1000)
    assert only_run(runs).started == T + 10


def test_a_new_replica_starts_a_pod_whose_first_start_is_hidden_at_the_pods_start() -> None:
    # The first list of a replica started anew (a new leader): the pod restarted twice
    # already, so its status no longer shows its first start. The pod's own start stands in:
    # counted at most its start-up time early, never late.
    runs, snapshot = RunIndex(clock=lambda: T + 1000), config()
    runs.begin_list()
    shown = pod(running(T + 200), terminated(T + 100, T + 190), restarts=2, pod_start=T + 3)
    runs.observe(shown, snapshot.policy, snapshot.quotas)
    runs.end_list(now=T + 1000)
    assert only_run(runs).started == T + 3


def test_a_start_stamped_ahead_of_this_clock_is_taken_as_when_it_was_seen() -> None:
    # The node's clock is 100 s ahead: the pod, seen running at T, says it started at T + 90.
    # It was running by T, and no later start seen after that moves it.
    clock = [T]
    runs, snapshot = RunIndex(clock=lambda: clock[0]), config()
    runs.observe(pod(running(T + 90), pod_start=T + 85), snapshot.policy, snapshot.quotas)
    assert only_run(runs).started == T
    clock[0] = T + 200
    runs.observe(pod(running(T + 90), pod_start=T + 85), snapshot.policy, snapshot.quotas)
    assert only_run(runs).started == T


def test_an_ended_run_stays_until_counted_however_long_ago_it_ended() -> None:
    runs = RunIndex()
    runs.replace([("u1", Run("team-a", "h100", F(1), T, T + 60))])
    runs.prune()  # no record counts anything: it stays, a year on as on the day
    assert len(runs) == 1
    runs.counted_to = lambda namespace: T + 59
    runs.prune()
    assert len(runs) == 1
    runs.counted_to = lambda namespace: T + 60
    runs.prune()
    assert len(runs) == 0


def test_an_ended_pod_listed_again_once_counted_is_not_kept() -> None:
    runs, snapshot = RunIndex(clock=lambda: T + 1000), config()
    runs.counted_to = lambda namespace: T + 500
    done = pod(terminated(T + 10, T + 400), phase="Succeeded")
    runs.begin_list()
    runs.observe(done, snapshot.policy, snapshot.quotas)
    runs.end_list(now=T + 1000)
    assert len(runs) == 0
    runs.counted_to = lambda namespace: T + 399
    runs.observe(done, snapshot.policy, snapshot.quotas)
    assert len(runs) == 1


def test_past_its_bound_the_oldest_ended_runs_are_dropped_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    runs = RunIndex(max_uncounted=10, metrics=metrics, clock=lambda: T)
    ended = [(f"u{n}", Run("team-a", "h100", F(1), T, T + n)) for n in range(10)]
    runs.replace([*ended, ("running", Run("team-a", "h100", F(1), T))])
    assert len(runs) == 11
    assert metrics.hours_runs_dropped._value.get() == 0
    with caplog.at_level(logging.ERROR, logger="gpuadm.gpu_hours"):
        runs.deleted("running", now=T + 100)
        runs.replace([*ended, ("later", Run("team-a", "h100", F(1), T, T + 100))])
    # Ten at most: past that, the one that ended first, and a tenth of the bound with it.
    assert sorted(run.ended or 0 for run in runs.runs("team-a")) == [
        T + n for n in range(2, 10)
    ] + [T + 100]
    assert metrics.hours_runs_dropped._value.get() == 4
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # once per ten minutes while it goes on
    assert "dropped 2 ended GPU pod runs that no checkpoint has counted" in errors[0]
