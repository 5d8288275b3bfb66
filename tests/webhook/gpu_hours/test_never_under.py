"""The GPU-hours never count less than pods ran, in random histories (hypothesis).

A model of the kubelet runs GPU pods whose containers end and start again, keeping only each
container's current run (`state`) and the one before (`lastState`), as the kubelet does; the
pods end, or are deleted while running or after. A model of the apiserver keeps the records,
refusing a ConfigMap over 1 MiB as the apiserver does. The leader's pod watch sees every
status and every deletion as it happens; between its checkpoints, a minute apart at most, it
may list the pods again, be replaced by a new leader (a new `RunIndex` and ledger on the same
records, which lists the pods afresh), and a record may lose its label.

Whatever happens, each class's record counts at least what its pods ran, less at most one
checkpoint interval of each pod deleted while no leader that watched it lived on to count
it; and at most what they ran plus each pod's start-up time (the pod's own start stands in
for a first start the kubelet no longer shows).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.quota.budget import DAY
from policies.quota.gpu_hours import RECORD_MAX_BYTES, timestamp
from tests.builders import POLICY_YAML
from tests.webhook.gpu_hours.apiserver import ConfigMaps
from webhook.config.snapshot import ConfigSnapshot, snapshot_from_text
from webhook.gpu_hours.ledger import HoursLedger
from webhook.gpu_hours.runs import RunIndex
from webhook.gpu_hours.store import HoursStore
from webhook.kube.objects import HOURS_DATA_KEY, HOURS_RECORD_LABEL, hours_record_name

CLASSES = ("h100", "t4", "l4", "a10", "v100", "a100-mig")
# Year-long windows: the records keep a year, as the largest do.
BUDGETS = ", ".join(f"{c}: 9000h/366d" for c in CLASSES)
QUOTAS = f"namespaces:\n  team-a: {{budget: {{{BUDGETS}}}}}\n"
CHECKPOINT = 60
T0 = 20834 * DAY  # 2027-01-16T00:00:00Z
SHARES = (Fraction(1), Fraction(2), Fraction(1, 2), Fraction(1, 7), Fraction(3, 4))


@dataclass(frozen=True)
class Pod:
    """One GPU pod's life: when its node took it, its container's runs (the last one may
    run on), and when it was deleted (None: never)."""

    uid: str
    class_name: str
    share: Fraction
    node_took: int
    runs: tuple[tuple[int, int | None], ...]
    deleted: int | None

    def status(self, at: int) -> dict[str, Any] | None:
        """The pod as the apiserver holds it at `at`: None once deleted."""
        if self.deleted is not None and at >= self.deleted:
            return None
        begun = [k for k, (start, _) in enumerate(self.runs) if start <= at]
        container: dict[str, Any] = {"name": "main", "restartCount": max(len(begun) - 1, 0)}
        phase = "Running"
        if not begun:
            phase, container["state"] = "Pending", {"waiting": {"reason": "ContainerCreating"}}
        else:
            k = begun[-1]
            start, finish = self.runs[k]
            if finish is None or at < finish:
                container["state"] = {"running": {"startedAt": timestamp(start)}}
                if k:
                    container["lastState"] = {"terminated": _terminated(self.runs[k - 1])}
            elif k + 1 < len(self.runs):
                container["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
                container["lastState"] = {"terminated": _terminated(self.runs[k])}
            else:
                phase = "Succeeded"
                container["state"] = {"terminated": _terminated(self.runs[k])}
                if k:
                    container["lastState"] = {"terminated": _terminated(self.runs[k - 1])}
        return {
            "metadata": {"uid": self.uid, "name": self.uid, "namespace": "team-a"},
            "status": {
                "phase": phase,
                "startTime": timestamp(self.node_took),
                "containerStatuses": [container],
            },
        }

    def changes(self) -> list[int]:
        """The moments its status changes."""
        return sorted({t for run in self.runs for t in run if t is not None})

    def ran(self, until: int) -> Fraction:
        """The GPU-seconds it truly used up to `until`: from its first start to its last
        finish, or its deletion if that came first."""
        first, (_, last) = self.runs[0][0], self.runs[-1]
        end = until if last is None else last
        if self.deleted is not None:
            end = min(end, self.deleted)
        return self.share * max(0, min(end, until) - first)

    def start_up(self) -> Fraction:
        """What counting it from its node's taking it adds: its start-up time."""
        return self.share * (self.runs[0][0] - self.node_took)


def _terminated(run: tuple[int, int | None]) -> dict[str, Any]:
    start, finish = run
    assert finish is not None
    return {"startedAt": timestamp(start), "finishedAt": timestamp(finish), "exitCode": 1}


@dataclass(frozen=True)
class Round:
    """Up to a checkpoint interval of time, then what happens before the next checkpoint."""

    seconds: int
    relist: bool
    new_leader: bool
    unlabel: bool


@st.composite
def pods(draw: st.DrawFn, span: int) -> list[Pod]:
    found = []
    for n in range(draw(st.integers(1, 6))):
        # Some ran long before gpuadm: up to 40 days, a thousand hourly buckets and more.
        old = draw(st.booleans()) and n < 2
        first = T0 - draw(st.integers(1, 40 * DAY)) if old else T0 + draw(st.integers(0, span))
        runs: list[tuple[int, int | None]] = []
        at = first
        for _ in range(draw(st.integers(1, 5))):
            runs.append((at, at + draw(st.integers(1, 200))))
            at = runs[-1][1] + draw(st.integers(0, 90))  # type: ignore[operator]
        if old or draw(st.booleans()):
            runs[-1] = (runs[-1][0], None)  # runs on
        # Deleted once gpuadm runs: a pod gone before it ever looked is nothing it could see.
        gone = draw(st.booleans())
        deleted = max(first, T0 + 1) + draw(st.integers(0, span)) if gone else None
        found.append(
            Pod(
                f"pod-{n}",
                draw(st.sampled_from(CLASSES)),
                draw(st.sampled_from(SHARES)),
                first - draw(st.integers(0, 60)),
                tuple(runs),
                deleted,
            )
        )
    return found


rounds = st.lists(
    st.builds(
        Round,
        st.integers(1, CHECKPOINT),
        st.booleans(),
        st.sampled_from([False, False, True]),
        st.sampled_from([False, False, False, True]),
    ),
    min_size=1,
    max_size=12,
)


class Replica:
    """The leader: its runs, as its pod watch shows them, and its ledger."""

    def __init__(self, api: ConfigMaps, now: list[int]) -> None:
        self.now = now
        self.runs = RunIndex(clock=lambda: now[0])
        self.ledger = HoursLedger(self.runs, HoursStore(api, "gpuadm-system"), clock=lambda: now[0])

    def show(self, pod: Pod, at: int, config: ConfigSnapshot) -> None:
        status = pod.status(at)
        if status is None:
            self.runs.deleted(pod.uid, now=at)
        else:
            self.runs.observe(
                status, config.policy, config.quotas, charged=(pod.class_name, pod.share)
            )

    def list_pods(self, cluster: list[Pod], config: ConfigSnapshot) -> None:
        self.runs.begin_list()
        for pod in cluster:
            status = pod.status(self.now[0])
            if status is not None:
                self.runs.observe(
                    status, config.policy, config.quotas, charged=(pod.class_name, pod.share)
                )
        self.runs.end_list(now=self.now[0])


def unlabel(api: ConfigMaps) -> None:
    found = api.objects.get(hours_record_name("team-a"))
    if found is not None:
        found["metadata"].get("labels", {}).pop(HOURS_RECORD_LABEL, None)
        api.version += 1
        found["metadata"]["resourceVersion"] = str(api.version)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), rounds)
async def test_the_records_count_no_less_than_the_pods_ran(
    data: st.DataObject, history: list[Round]
) -> None:
    span = sum(r.seconds for r in history)
    cluster = data.draw(pods(span))
    config = snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")
    api, now = ConfigMaps(), [T0]
    leader = Replica(api, now)
    leader.list_pods(cluster, config)
    # The first leader counts at once what ran before gpuadm: from here on, a checkpoint at
    # most a minute ago has counted everything a leader saw before it.
    await leader.ledger.checkpoint(config.quotas)
    # What the watch shows after the first list: each status change, each deletion.
    changes = sorted(
        (
            (t, pod)
            for pod in cluster
            for t in (*pod.changes(), *(() if pod.deleted is None else (pod.deleted,)))
            if t > T0
        ),
        key=lambda change: (change[0], change[1].uid),
    )
    lost = {name: Fraction(0) for name in CLASSES}
    for step in history:
        begun = now[0]
        for t, pod in [c for c in changes if begun < c[0] <= begun + step.seconds]:
            now[0] = t
            leader.show(pod, t, config)
        now[0] = begun + step.seconds
        if step.relist:
            leader.list_pods(cluster, config)
        if step.new_leader:
            # What the old leader saw of pods deleted since its last checkpoint is gone.
            for pod in cluster:
                if pod.deleted is not None and begun < pod.deleted <= now[0]:
                    lost[pod.class_name] += pod.share * CHECKPOINT
            leader = Replica(api, now)
            leader.list_pods(cluster, config)
        await leader.ledger.checkpoint(config.quotas)
        await leader.ledger.read()
        if step.unlabel:
            unlabel(api)
    await leader.ledger.checkpoint(config.quotas)

    assert api.refused == []
    stored = api.objects.get(hours_record_name("team-a"))
    record = api.hours("team-a") if stored is not None else None
    if stored is not None:
        assert len(stored["data"][HOURS_DATA_KEY]) <= RECORD_MAX_BYTES
    for name in CLASSES:
        mine = [pod for pod in cluster if pod.class_name == name]
        ran = sum((pod.ran(now[0]) for pod in mine), Fraction(0))
        counted = record.total(name) if record is not None else Fraction(0)
        assert counted >= ran - lost[name], name
        assert counted <= ran + sum((pod.start_up() for pod in mine), Fraction(0)), name
