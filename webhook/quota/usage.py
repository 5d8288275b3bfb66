"""What each namespace holds, from the pods the watch has seen: an index kept up to date.

Only GPU pods are kept, each as one small entry, and the sum per (namespace, class) is
updated as pods come and go, so a quota judgement costs the same with 10 pods or 100,000.
GPU pods held behind gpuadm's scheduling gate hold nothing: they are kept apart, as the
lines of waiting pods, each an index in line order (`policies.quota.line.Line`) changed one pod at
a time as the watch shows them, so that no judgement sorts or visits a whole line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from typing import Any

from policies import Policy, QuotaConfig
from policies.quota.line import Line
from policies.quota.queue import Waiting
from webhook.quota.holdings import Holding, pod_state


class UsageIndex:
    """GPU pods by uid, with running sums per namespace and class, and the waiting pods."""

    def __init__(self) -> None:
        self._pods: dict[str, Holding] = {}
        self._sums: dict[str, dict[str, Fraction]] = {}
        self._seen_at: dict[str, float] = {}
        self._members: dict[str, set[str]] = {}  # namespace -> uids of its GPU pods
        # namespace -> gang -> how many of its pods hold GPUs
        self._gangs: dict[str, dict[str, int]] = {}
        self._lines: dict[str, Line] = {}  # namespace -> its waiting pods
        self._line_of: dict[str, str] = {}  # uid -> namespace, for the waiting pods
        self._listeners: list[Callable[[str], None]] = []
        # For each pod the watch has shown holding GPUs or ended, the resourceVersion of the
        # event that first showed it: its reservation may leave the record, with a watermark
        # of that version (`webhook.quota.book`).
        self._shown_in: dict[str, int] = {}
        # The pod resourceVersion this view is complete up to: every pod event at or before
        # it has been applied (the last event, or the last full list). 0: none yet.
        self.version = 0
        # The version of the last full list, and the label the watch selects pods by.
        self.listed_version = 0
        self.label = ""
        self._reached: list[tuple[int, asyncio.Future[None]]] = []

    def shown_in(self, uid: str) -> int | None:
        """Return the resourceVersion of the watch event that showed this pod holding GPUs
        or ended, or None if no watch event did (a pod only listed, or waiting in line)."""
        return self._shown_in.get(uid)

    def watching(self, label: str) -> None:
        """Note the label the watch selects pods by. When it changes (a policy that renames
        the class label), forget which pods the old watch showed: replicas that watch the
        new label would not have seen them, so their reservations stay until they expire."""
        if label != self.label:
            self.label = label
            self._shown_in.clear()

    def advance(self, version: int) -> None:
        """Note that every pod event up to `version` has been applied; wake who waits."""
        if version <= self.version:
            return
        self.version = version
        if self._reached:
            waiting = self._reached
            self._reached = [(v, f) for v, f in waiting if v > version]
            for v, future in waiting:
                if v <= version and not future.done():
                    future.set_result(None)

    async def reach(self, version: int, *, within: float) -> bool:
        """Wait until this view is complete up to `version`, `within` seconds at most;
        tell whether it is."""
        if version <= self.version:
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reached.append((version, future))
        try:
            await asyncio.wait_for(future, within)
        except TimeoutError:
            self._reached = [(v, f) for v, f in self._reached if f is not future]
            return False
        return True

    def on_change(self, listener: Callable[[str], None]) -> None:
        """Call `listener(namespace)` whenever what a namespace holds or waits for changes."""
        self._listeners.append(listener)

    def waiting(self, namespace: str) -> list[Waiting]:
        """Return the pods of a namespace waiting in line, in line order (a copy: O(line))."""
        line = self._lines.get(namespace)
        return list(line.ordered()) if line is not None else []

    def line(self, namespace: str) -> Line:
        """Return the index of a namespace's line, as it is now (empty if none waits)."""
        return self._lines.get(namespace) or Line()

    def has_line(self, namespace: str) -> bool:
        """Tell whether pods of this namespace wait in line."""
        return namespace in self._lines

    def is_waiting(self, uid: str) -> bool:
        """Tell whether this pod waits in a line."""
        return uid in self._line_of

    def waiting_namespaces(self) -> list[str]:
        """Return the namespaces with pods waiting in line."""
        return list(self._lines)

    def holdings(self, namespace: str) -> list[Holding]:
        """Return what each GPU pod of a namespace holds, for the reports that name them."""
        return [self._pods[uid] for uid in self._members.get(namespace, ())]

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def namespaces(self) -> list[str]:
        """Return the namespaces that hold GPU pods."""
        return list(self._sums)

    def gang_running(self, namespace: str) -> Mapping[str, int]:
        """Return, per gang of a namespace, how many of its pods hold GPUs."""
        return self._gangs.get(namespace, {})

    def in_use(self, namespace: str) -> Mapping[str, Fraction]:
        """Return the GPUs each class holds in a namespace."""
        return self._sums.get(namespace, {})

    def seen(self, uid: str) -> bool:
        """Tell whether the watch has shown this pod holding GPUs (or ended) lately, even if
        it is gone since. A pod seen only while it waited in line does not count: its
        reservation, made when it is released, is what charges it until it is seen again."""
        return uid in self._seen_at

    def unseen(self, uids: Iterable[str]) -> list[str]:
        """Return those of `uids` that the watch has not shown (see `seen`), in order."""
        seen_at = self._seen_at
        return [uid for uid in uids if uid not in seen_at]

    def left(self, uid: str, stored: int, label: str) -> bool:
        """Tell whether a pod known to be in the store by resourceVersion `stored`, as a
        watch of pods labelled `label` showed it, has left it (deleted, or no longer holding
        GPUs nor waiting): this view selects pods by that label, is complete up to at
        least that version, and holds the pod neither holding GPUs nor in line.

        So a replica that started after such a pod was deleted, and never saw it, does not
        count its reservation (`webhook.quota.book`)."""
        return (
            stored > 0
            and label == self.label
            and self.version >= stored
            and uid not in self._pods
            and uid not in self._line_of
        )

    def forget_seen_before(self, moment: float) -> None:
        """Forget sightings older than `moment`: their reservations have expired anyway."""
        self._seen_at = {uid: at for uid, at in self._seen_at.items() if at >= moment}
        self._shown_in = {uid: v for uid, v in self._shown_in.items() if uid in self._seen_at}

    def observe(
        self,
        pod: Mapping[str, Any],
        policy: Policy,
        quotas: QuotaConfig,
        *,
        now: float,
        version: int | None = None,
    ) -> Holding | Waiting | None:
        """Record a pod as it now is: charged if it holds GPUs, dropped if it no longer does;
        return its state (`pod_state`), for whoever follows the pods too.

        `version` is the resourceVersion of the watch event that shows it (None: not shown
        by a watch event)."""
        metadata = pod.get("metadata") or {}
        uid = metadata.get("uid")
        if not uid:
            return None
        state = pod_state(pod, policy, quotas)
        if not isinstance(state, Waiting):
            self._seen_at.setdefault(uid, now)
            if version is not None:
                self._shown_in.setdefault(uid, version)
        self._set_waiting(uid, state if isinstance(state, Waiting) else None)
        holding = state if isinstance(state, Holding) else None
        previous = self._pods.get(uid)
        if previous == holding:
            return state
        if previous is not None:
            self._drop(uid, previous)
        if holding is not None:
            self._pods[uid] = holding
            self._members.setdefault(holding.namespace, set()).add(uid)
            self._add(holding, holding.charge)
            self._count_gang(holding, 1)
            self._changed(holding.namespace)
        return state

    def forget(self, uid: str, *, now: float | None = None, version: int | None = None) -> None:
        """Drop a pod that was deleted or finished.

        A pod deleted while gated never ran: with `now`, it counts as seen, so a reservation
        made for it stops counting at once. `version` is that of the watch event that shows
        the deletion: the pod's reservation, if any, may then leave the record.
        """
        if now is not None and uid in self._line_of:
            self._seen_at.setdefault(uid, now)
        if version is not None and uid in self._seen_at:
            self._shown_in.setdefault(uid, version)
        self._set_waiting(uid, None)
        previous = self._pods.get(uid)
        if previous is not None:
            self._drop(uid, previous)

    def _drop(self, uid: str, previous: Holding) -> None:
        del self._pods[uid]
        members = self._members[previous.namespace]
        members.discard(uid)
        if not members:
            del self._members[previous.namespace]
        self._add(previous, -previous.charge)
        self._count_gang(previous, -1)
        self._changed(previous.namespace)

    def _set_waiting(self, uid: str, waiting: Waiting | None) -> None:
        namespace = self._line_of.get(uid)
        if namespace is not None:
            line = self._lines[namespace]
            if line.get(uid) == waiting:
                return
            line.remove(uid)
            del self._line_of[uid]
            if not line:
                del self._lines[namespace]
            self._changed(namespace)
        if waiting is not None:
            self._lines.setdefault(waiting.namespace, Line()).add(waiting)
            self._line_of[uid] = waiting.namespace
            self._changed(waiting.namespace)

    def _changed(self, namespace: str) -> None:
        for listener in self._listeners:
            listener(namespace)

    def replace_all(
        self,
        holdings: Mapping[str, Holding],
        *,
        now: float,
        waiting: Mapping[str, Waiting] | None = None,
        version: int = 0,
    ) -> None:
        """Put a full re-list in force at once, so no judgement sees a half-filled index.

        `version` is the list's resourceVersion: the view is complete up to it."""
        sums: dict[str, dict[str, Fraction]] = {}
        members: dict[str, set[str]] = {}
        gangs: dict[str, dict[str, int]] = {}
        for uid, holding in holdings.items():
            members.setdefault(holding.namespace, set()).add(uid)
            if holding.gang:
                counts = gangs.setdefault(holding.namespace, {})
                counts[holding.gang] = counts.get(holding.gang, 0) + 1
            classes = sums.setdefault(holding.namespace, {})
            classes[holding.class_name] = classes.get(holding.class_name, Fraction(0)) + (
                holding.charge
            )
        by_namespace: dict[str, list[Waiting]] = {}
        for pod in (waiting or {}).values():
            by_namespace.setdefault(pod.namespace, []).append(pod)
        lines = {namespace: Line(pods) for namespace, pods in by_namespace.items()}
        changed = set(self._sums) | set(sums) | set(self._lines) | set(lines)
        self._pods = dict(holdings)
        self._sums = sums
        self._members = members
        self._gangs = gangs
        self._lines = lines
        self._line_of = {uid: pod.namespace for uid, pod in (waiting or {}).items()}
        for uid in holdings:
            self._seen_at.setdefault(uid, now)
        self.listed_version = max(self.listed_version, version)
        self.advance(version)
        for namespace in changed:
            self._changed(namespace)

    def _count_gang(self, holding: Holding, change: int) -> None:
        if not holding.gang:
            return
        counts = self._gangs.setdefault(holding.namespace, {})
        left = counts.get(holding.gang, 0) + change
        if left > 0:
            counts[holding.gang] = left
        else:
            counts.pop(holding.gang, None)
            if not counts:
                del self._gangs[holding.namespace]

    def _add(self, holding: Holding, amount: Fraction) -> None:
        classes = self._sums.setdefault(holding.namespace, {})
        total = classes.get(holding.class_name, Fraction(0)) + amount
        if total:
            classes[holding.class_name] = total
        else:
            classes.pop(holding.class_name, None)
            if not classes:
                del self._sums[holding.namespace]
