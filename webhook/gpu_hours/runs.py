"""Each GPU pod's time on its node, as the pod watch shows it: the runs the hours are
counted from.

The pod watch (`webhook.quota.podwatch`) hands every pod it lists or sees change to a
`RunIndex`. A pod is a run once a container of it has started (Pending and gated time is
free); it ends when its last container finishes, or, if it is deleted first, when the watch
shows the deletion. A run that ended is kept until a checkpoint has counted it, and a day at
most (`keep_ended`), so that the next checkpoint counts its last part even if the pod is
gone by then, however long the records could not be written.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from fractions import Fraction
from typing import Any

from policies import Denial, Policy, QuotaConfig, pod_charge
from policies.demand import TERMINAL_PHASES
from policies.gpu_hours import Run, run_times

log = logging.getLogger("gpuadm.gpu_hours")

# An ended run stays until a checkpoint has counted it, or this long if none could.
KEEP_ENDED_SECONDS = 24 * 3600.0


class RunIndex:
    """GPU pods' runs by uid, and the uids of each namespace's runs."""

    def __init__(self, *, keep_ended: float = KEEP_ENDED_SECONDS) -> None:
        self.keep_ended = keep_ended
        self._runs: dict[str, Run] = {}
        self._members: dict[str, set[str]] = {}  # namespace -> uids of its runs
        self._listing: dict[str, Run] | None = None

    def __len__(self) -> int:
        return len(self._runs)

    def namespaces(self) -> list[str]:
        """Return the namespaces with runs."""
        return list(self._members)

    def runs(self, namespace: str) -> Iterator[Run]:
        """Yield a namespace's runs, running or ended lately."""
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
        watch was on) and end now; ended runs past `keep_ended` are dropped."""
        listed, self._listing = self._listing or {}, None
        for uid, run in list(self._runs.items()):
            if uid not in listed and run.ended is None:
                self._put(uid, _ended(run, int(now)))
        for uid, run in listed.items():
            self._put(uid, run)
        self.prune(now=now)

    def prune(self, *, now: float, counted_to: Callable[[str], int] = lambda _: 0) -> None:
        """Drop runs that ended before their namespace's record was counted to
        (`counted_to`), or, counted or not, more than `keep_ended` seconds ago."""
        for uid, run in list(self._runs.items()):
            ended = run.ended
            if ended is not None and (
                ended <= counted_to(run.namespace) or ended < now - self.keep_ended
            ):
                self._put(uid, None)

    def _put(self, uid: str, run: Run | None) -> None:
        previous = self._runs.pop(uid, None)
        if previous is not None:
            members = self._members[previous.namespace]
            members.discard(uid)
            if not members:
                del self._members[previous.namespace]
        if run is None and previous is not None and previous.ended is None:
            # A pod whose containers are no longer known (a status cleared by its node)
            # keeps its run rather than lose its time: it ends with the pod.
            run = previous
        if run is not None:
            self._runs[uid] = run
            self._members.setdefault(run.namespace, set()).add(uid)

    def replace(self, runs: Iterable[tuple[str, Run]]) -> None:
        """Put these runs in force at once (tests and the benchmark)."""
        self._runs, self._members = {}, {}
        for uid, run in runs:
            self._put(uid, run)


def _ended(run: Run, now: int) -> Run:
    return Run(
        run.namespace, run.class_name, run.share, run.started, max(now, run.started), run.pod
    )


def run_of(
    pod: Mapping[str, Any],
    policy: Policy,
    quotas: QuotaConfig,
    *,
    charged: tuple[str, Fraction] | None = None,
) -> Run | None:
    """Return a GPU pod's run as its status shows it, or None if it holds no GPUs or no
    container of it has started (`policies.gpu_hours.run_times` says when it ended)."""
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
