"""What once let the GPU-hours count less than pods ran, each as it was found: a record
grown past what a ConfigMap holds, a pod whose restarts hid its first start, and a record
that lost its label."""

from __future__ import annotations

from fractions import Fraction as F
from typing import Any

from policies.quota.budget import DAY, HOUR
from policies.quota.gpu_hours import Run, timestamp
from tests.builders import POLICY_YAML, container
from tests.webhook.gpu_hours.apiserver import ConfigMaps
from tests.webhook.gpu_hours.test_ledger import Clock
from webhook.config.snapshot import ConfigSnapshot, snapshot_from_text
from webhook.gpu_hours.ledger import HoursLedger
from webhook.gpu_hours.runs import RunIndex
from webhook.gpu_hours.store import HoursStore
from webhook.kube.objects import HOURS_RECORD_LABEL, hours_record_name

# A day's edge: 2027-01-16T00:00:00Z.
T = 20834 * DAY


def snapshot(quotas: str) -> ConfigSnapshot:
    return snapshot_from_text(POLICY_YAML, quotas, policy_source="p", quotas_source="q")


def ledger(api: ConfigMaps, runs: RunIndex, clock: Clock, *, bucket: int) -> HoursLedger:
    return HoursLedger(runs, HoursStore(api, "gpuadm-system"), clock=clock, bucket_seconds=bucket)


# One namespace's year-long budget once made every namespace keep a year of hourly buckets.
YEAR_ELSEWHERE = """
namespaces:
  team-a: {budget: {h100: 1000h/7d}}
  team-y: {budget: {a100: 100h/366d}}
"""


ALL_YEAR = ("t4", "l4", "a10", "v100", "a100-mig")


async def test_a_year_long_budget_elsewhere_does_not_lose_a_tenants_hours() -> None:
    # team-a has run five classes all year, and then 8 H100s for 10 hours. Its record once
    # kept a year of hourly buckets of each class, as team-y's window is a year long: past
    # 1 MiB, so no checkpoint could write it, and a day after the H100s ended their runs
    # were dropped uncounted: the window showed 80 h, then 0.
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(T)
    year_ago = T - 366 * DAY
    runs.replace(
        [
            *((f"all-year-{c}", Run("team-a", c, F(1), year_ago)) for c in ALL_YEAR),
            ("h100s", Run("team-a", "h100", F(8), T, T + 10 * HOUR, "train")),
        ]
    )
    hours = ledger(api, runs, clock, bucket=HOUR)
    quotas = snapshot(YEAR_ELSEWHERE).quotas
    for hour in (0, 5, 10, 11, 20, 30, 35):
        clock.now = T + hour * HOUR
        await hours.checkpoint(quotas)
        await hours.read()
    now = int(clock.now)
    used = hours.spending("team-a", now, quotas)
    assert not isinstance(used, Exception)
    assert used.used("h100", now=now, window=7 * DAY) == 80 * HOUR
    assert api.refused == []
    assert api.hours("team-a").within("h100", now - 7 * DAY) == 80 * HOUR


# --- A pod that restarts ------------------------------------------------------------------


RESTARTS = """
namespaces:
  team-a: {budget: {h100: 1000h/7d}}
"""


def restarting_pod(first: int, run: int, *, restarts: int, ended: bool) -> dict[str, Any]:
    """A pod of one H100 whose container runs `run` seconds at a time, started again at once
    each time it ends, as the kubelet shows it after `restarts` restarts: the run in
    `state`, the one before in `lastState`, and no earlier one."""

    def times(index: int) -> dict[str, str]:
        start = first + index * run
        return {"startedAt": timestamp(start), "finishedAt": timestamp(start + run)}

    if ended:
        state: dict[str, Any] = {"terminated": {**times(restarts), "exitCode": 1}}
    else:
        state = {"running": {"startedAt": timestamp(first + restarts * run)}}
    status: dict[str, Any] = {
        "name": "main",
        "state": state,
        "restartCount": restarts,
    }
    if restarts:
        status["lastState"] = {"terminated": {**times(restarts - 1), "exitCode": 1}}
    return {
        "metadata": {
            "uid": "u1",
            "name": "flaky",
            "namespace": "team-a",
            "annotations": {"gpuadm.io/class": "h100"},
        },
        "spec": {"containers": [container("main", {"nvidia.com/gpu": "1"})]},
        "status": {
            "phase": "Failed" if ended else "Running",
            "startTime": timestamp(first),
            "containerStatuses": [status],
        },
    }


async def test_a_pod_that_restarts_between_checkpoints_is_charged_from_its_first_start() -> None:
    # A pod of one H100 holds it for 600 s, its container ending and started again every
    # 30 s: twice per checkpoint. Each restart once moved its run's start to the start the
    # kubelet still showed, and each checkpoint counted only from there.
    clock = Clock(T)
    api, runs = ConfigMaps(), RunIndex(clock=clock)
    config = snapshot(RESTARTS)
    hours = ledger(api, runs, clock, bucket=60)
    for restarts in range(21):
        clock.now = T + restarts * 30
        pod = restarting_pod(T, 30, restarts=min(restarts, 19), ended=restarts == 20)
        runs.observe(pod, config.policy, config.quotas)
        if restarts % 2 == 0 and restarts:
            await hours.checkpoint(config.quotas)
    assert api.hours("team-a").total("h100") == 600


# --- A record that lost its label -----------------------------------------------------------


SPENT = """
namespaces:
  team-a: {budget: {h100: 100s/1h}}
"""


async def test_a_record_that_lost_its_label_is_read_by_name_and_labelled_again() -> None:
    # team-a spent its budget; then its record lost its label. It was read as no record at
    # all: the next pod of the class was admitted, and each checkpoint's create met 409.
    api, runs, clock = ConfigMaps(), RunIndex(), Clock(T)
    config = snapshot(SPENT)
    runs.replace([("u1", Run("team-a", "h100", F(1), T - 200, T - 50, "train"))])
    leader = ledger(api, runs, clock, bucket=60)
    await leader.checkpoint(config.quotas)
    assert api.hours("team-a").total("h100") == 150
    del api.objects[hours_record_name("team-a")]["metadata"]["labels"][HOURS_RECORD_LABEL]
    api.version += 1
    api.objects[hours_record_name("team-a")]["metadata"]["resourceVersion"] = str(api.version)

    # A replica started after the pod was gone: only the record knows what it used.
    replica = ledger(api, RunIndex(), clock, bucket=60)
    await replica.read()
    verdict = replica.judge("team-a", "h100", config)
    assert verdict is not None
    assert not verdict.allowed
    assert verdict.message is not None
    assert "GPU-hour budget spent: used 150s of 100s" in verdict.message

    clock.now = T + 60
    await leader.checkpoint(config.quotas)
    assert api.labels("team-a")[HOURS_RECORD_LABEL] == "team-a"
    assert api.hours("team-a").total("h100") == 150
