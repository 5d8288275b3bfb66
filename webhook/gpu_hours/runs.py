"""Each GPU pod's time on its node, as the pod watch shows it: the runs the hours are
counted from.

The pod watch (`webhook.quota.podwatch`) hands every pod it lists or sees change to a
`RunIndex`. A pod is a run once a container of it has started (Pending and gated time is
free); it ends when its last container finishes, or, if it is deleted first, when the watch
shows the deletion. So that a run is never counted short:

- a run keeps the earliest start seen for its pod, whatever later statuses, lists and
  relists show: the kubelet keeps only a container's last two runs, so each restart hides
  an earlier start (and a pod whose first start is already hidden when first seen starts
  at the pod's own start: `policies.quota.gpu_hours.run_times`);
- a start stamped later than this replica's clock says it is (a node's clock ahead) is
  taken as the moment it was seen: the pod was running by then;
- a run that ended is kept until a checkpoint has counted it, however long the records
  cannot be written, never dropped for its age. Only past `MAX_UNCOUNTED` ended runs, to
  keep a replica's memory bounded, are the oldest dropped uncounted: counted in
  `gpuadm_gpu_hours_runs_dropped_total` and logged as an error.
"""

from __future__ import annotations

import heapq
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from policies import Denial, Policy, QuotaConfig, pod_charge
from policies.access.demand import TERMINAL_PHASES
from policies.quota.gpu_hours import Run, run_times

if TYPE_CHECKING:
    from webhook.observe.metrics import Metrics

log = logging.getLogger("gpuadm.gpu_hours")

# Ended runs a replica keeps uncounted, at most: some 300 bytes each, 30 MB in all, the
# runs of 100,000 GPU pods that ended while no record could be written.
MAX_UNCOUNTED = 100_000
# Dropping runs is logged again this often while it goes on.
RELOG_SECONDS = 600.0


class RunIndex:
    """GPU pods' runs by uid, and the uids of each namespace's runs."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        max_uncounted: int = MAX_UNCOUNTED,
        metrics: Metrics | None = None,
    ) -> None:
        """Keep the runs of the pods shown, on `clock`; keep at most `max_uncounted` ended
        runs that no checkpoint has counted."""
        self.clock = clock
        self.max_uncounted = max_uncounted
        self.metrics = metrics
        self._runs: dict[str, Run] = {}
        self._members: dict[str, set[str]] = {}  # namespace -> uids of its runs
        self._listing: dict[str, Run] | None = None
        self._ended = 0
        self._dropped_logged_at = float("-inf")
        # The moment a namespace's record is counted to (0: none, or one not believed): a
        # run that ended by then is counted, and not kept (`HoursLedger` sets it).
        self.counted_to: Callable[[str], int] = lambda _: 0

    def __len__(self) -> int:
        return len(self._runs)

    def namespaces(self) -> list[str]:
        """Return the namespaces with runs."""
        return list(self._members)

    def runs(self, namespace: str) -> Iterator[Run]:
        """Yield a namespace's runs, running or ended and not yet counted."""
        runs = self._runs
        return (runs[uid] for uid in self._members.get(namespace, ()))

    def observe(
        self,
        pod: Mapping[str, Any],
        policy: Policy,
        quotas: QuotaConfig,
        *,
        charged: tuple[str, Fraction] | None = None,
    ) -> None:
        """Record a pod as it now is. `charged` is its (class, charge) when the caller
        worked it out already (a running pod the usage index charges)."""
        metadata = pod.get("metadata")
        uid = metadata.get("uid") if isinstance(metadata, Mapping) else None
        if not isinstance(uid, str) or not uid:
            return
        run = run_of(pod, policy, quotas, charged=charged)
        if run is not None:
            seen = int(self.clock())
            if run.started > seen:
                run = replace(run, started=seen)
        if self._listing is not None:
            if run is not None:
                self._listing[uid] = run
            return
        self._put(uid, run)

    def deleted(self, uid: str, *, now: float) -> None:
        """A pod was deleted: its run, if it had not ended, ends now."""
        run = self._runs.get(uid)
        if run is not None and run.ended is None:
            self._put(uid, _ended(run, int(now)))

    def begin_list(self) -> None:
        """A full list begins: the pods it shows are gathered apart until `end_list`."""
        self._listing = {}

    def end_list(self, *, now: float) -> None:
        """Put a full list in force: runs it did not show ended unseen (deleted while no
        watch was on) and end now; each run it shows keeps the earliest start seen."""
        listed, self._listing = self._listing or {}, None
        for uid, run in list(self._runs.items()):
            if uid not in listed and run.ended is None:
                self._put(uid, _ended(run, int(now)))
        for uid, run in listed.items():
            self._put(uid, run)

    def prune(self) -> None:
        """Drop the runs that ended by the moment their namespace's record is counted to
        (`counted_to`). A run that ended later stays, however long ago that was."""
        for uid, run in list(self._runs.items()):
            if _counted(run, self.counted_to):
                self._put(uid, None)

    def _put(self, uid: str, run: Run | None) -> None:
        previous = self._runs.pop(uid, None)
        if previous is not None:
            members = self._members[previous.namespace]
            members.discard(uid)
            if not members:
                del self._members[previous.namespace]
            if previous.ended is not None:
                self._ended -= 1
        if run is None and previous is not None and previous.ended is None:
            # A pod whose containers are no longer known (a status cleared by its node)
            # keeps its run rather than lose its time: it ends with the pod.
            run = previous
        if run is not None:
            run = _earliest(previous, run)
            if _counted(run, self.counted_to):
                return  # an ended pod listed again, long counted
            self._runs[uid] = run
            self._members.setdefault(run.namespace, set()).add(uid)
            if run.ended is not None:
                self._ended += 1
                if self._ended > self.max_uncounted:
                    self._drop_oldest_ended()

    def _drop_oldest_ended(self) -> None:
        """Drop the ended runs that ended first, a tenth of the bound at once, saying so."""
        excess = self._ended - self.max_uncounted + max(self.max_uncounted // 10, 1)
        oldest = heapq.nsmallest(
            excess,
            ((run.ended, uid) for uid, run in self._runs.items() if run.ended is not None),
        )
        namespaces = sorted({self._runs[uid].namespace for _, uid in oldest})
        for _, uid in oldest:
            previous = self._runs.pop(uid)
            members = self._members[previous.namespace]
            members.discard(uid)
            if not members:
                del self._members[previous.namespace]
            self._ended -= 1
        if self.metrics is not None:
            self.metrics.hours_runs_dropped.inc(len(oldest))
        now = self.clock()
        if now - self._dropped_logged_at >= RELOG_SECONDS:
            self._dropped_logged_at = now
            log.error(
                "dropped %d ended GPU pod runs that no checkpoint has counted, of namespaces "
                "%s: more than %d were waiting for their GPU-hour records to be written. "
                "Their time is lost; see gpuadm_gpu_hours_record_problems for why the "
                "records are not written",
                len(oldest),
                ", ".join(namespaces),
                self.max_uncounted,
            )

    def replace(self, runs: Iterable[tuple[str, Run]]) -> None:
        """Put these runs in force at once (tests and the benchmark)."""
        self._runs, self._members, self._ended = {}, {}, 0
        for uid, run in runs:
            self._put(uid, run)


def _counted(run: Run, counted_to: Callable[[str], int]) -> bool:
    """Tell whether a run ended by the moment its namespace's record is counted to."""
    return run.ended is not None and run.ended <= counted_to(run.namespace)


def _earliest(previous: Run | None, run: Run) -> Run:
    """Return a pod's run as now shown, from the earliest start seen of it."""
    if previous is None or previous.started >= run.started:
        return run
    return replace(run, started=previous.started)


def _ended(run: Run, now: int) -> Run:
    return replace(run, ended=max(now, run.started))


def run_of(
    pod: Mapping[str, Any],
    policy: Policy,
    quotas: QuotaConfig,
    *,
    charged: tuple[str, Fraction] | None = None,
) -> Run | None:
    """Return a GPU pod's run as its status shows it, or None if it holds no GPUs or no
    container of it has started (`policies.quota.gpu_hours.run_times` says when it ended)."""
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    ended_phase = phase in TERMINAL_PHASES
    started, ended = run_times(pod, ended_phase=ended_phase)
    if started is None:
        return None
    metadata = pod.get("metadata") or {}
    namespace = str(metadata.get("namespace") or "")
    if charged is None:
        try:
            charged = pod_charge(
                pod, policy, namespace_default_class=quotas.default_class_for(namespace)
            )
        except Denial:
            return None  # not attributable to a class; the usage index says so in its log
    if charged is None:
        return None
    class_name, share = charged
    return Run(
        sys.intern(namespace),
        sys.intern(class_name),
        share,
        started,
        ended,
        str(metadata.get("name") or ""),
    )
