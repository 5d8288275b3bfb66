"""A namespace's line of waiting pods as an index kept up to date, not a list sorted per use.

`policies.quota.queue.next_releases` decides a line by sorting it and visiting every pod: fine for
a few pods, but an admission in a namespace with 20,000 pods waiting paid for all of them.
`Line` keeps the same pods, per class, in sorted lists (by priority, creation time, name,
as `Waiting.order`), changed one pod at a time as the pod watch shows them come and go. What
a judgement needs of it is answered by `walk`, which visits only the pods that can change
the answer, with exactly the semantics of `next_releases`:

- a pod that can never fit (it asks for more than a whole limit) holds back no one, so it is
  never visited: each class keeps those apart (`never`), sorted too, and counted by bisection;
- once a pod does not fit, every later pod of its class waits behind it, so the walk drops the
  class; once the cap across classes (`*`) is exceeded, everyone waits, and the walk ends;
- so a walk visits, per class, the pods that fit now (those the leader has yet to release)
  and at most one that does not, plus the pods left out as charged already (`excluded`).

A gang is decided whole when the walk meets its first pod (`decide_gang`), from the index's
list of its members: its other pods are not visited again.

How many wait ahead of a pod is a count of the pods before it (a bisection per class) less
those the walk released. In the steady state (the leader has released whatever fits), an
admission costs O(k log n) for k classes and n waiting pods. Adding or removing a pod is a
bisection and one list insertion (a memory move of the list's pointers).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from policies.quota.judge import judge, never_fits
from policies.quota.queue import Gangs, Place, Waiting, decide_gang, take_if_fits
from policies.quota.quotas import ALL_CLASSES, limits_on

# (-priority, created, name, uid): line order, the uid telling apart pods of one name.
Key = tuple[int, str, str, str]
Order = tuple[int, str, str]
# Sorts after any uid: (order, _LAST) bounds every key of that order from above.
_LAST = "\U0010ffff"


def key_of(pod: Waiting) -> Key:
    """Return a pod's place in the index: its line order, then its uid."""
    return (-pod.priority, pod.created, pod.name, pod.uid)


def _cap(class_name: str, limits: Mapping[str, Fraction]) -> Fraction | None:
    """Return the most a pod of the class may ask for and still fit some day (None: any)."""
    caps = [limits[key] for key in limits_on(class_name, limits)]
    return min(caps) if caps else None


class _ClassLine:
    """The waiting pods of one class: those that may fit some day, and those that never can
    under the limits last used (`cap`), each sorted in line order."""

    __slots__ = ("cap", "fit", "never", "oldest")

    def __init__(self) -> None:
        self.cap: Fraction | None = None
        self.fit: list[Key] = []
        self.never: list[Key] = []
        # (created, uid), sorted: the longest wait of the class, for the metrics.
        self.oldest: list[tuple[str, str]] = []

    def __len__(self) -> int:
        return len(self.fit) + len(self.never)


@dataclass(frozen=True, slots=True)
class Walk:
    """What a walk from the head of a line decided about the pods it passed."""

    released: tuple[Waiting, ...]
    # What the namespace holds once they are released.
    used: Mapping[str, Fraction]
    # The limits a pod passed does not fit, and why those behind it wait.
    blocked: Mapping[str, str]
    # False when the walk stopped at its `most` releases: more pods may fit.
    complete: bool
    # The gangs the walk met that wait, with why.
    gangs: Mapping[str, str] = field(default_factory=dict)


class Line:
    """The pods of one namespace waiting in line, in line order, kept up to date."""

    def __init__(self, pods: Iterable[Waiting] = ()) -> None:
        self._pods: dict[str, Waiting] = {}
        self._classes: dict[str, _ClassLine] = {}
        # Gang -> the keys of its pods in line, sorted.
        self._gangs: dict[str, list[Key]] = {}
        for pod in pods:  # built sorted at once, not inserted one by one
            self._pods[pod.uid] = pod
        for pod in self._pods.values():
            entry = self._classes.setdefault(pod.class_name, _ClassLine())
            entry.fit.append(key_of(pod))
            entry.oldest.append((pod.created, pod.uid))
            if pod.gang:
                self._gangs.setdefault(pod.gang, []).append(key_of(pod))
        for entry in self._classes.values():
            entry.fit.sort()
            entry.oldest.sort()
        for members in self._gangs.values():
            members.sort()

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def get(self, uid: str) -> Waiting | None:
        """Return the waiting pod of this uid, or None."""
        return self._pods.get(uid)

    def add(self, pod: Waiting) -> None:
        """Put a pod in line (replacing what was known of it)."""
        if pod.uid in self._pods:
            self.remove(pod.uid)
        self._pods[pod.uid] = pod
        entry = self._classes.setdefault(pod.class_name, _ClassLine())
        cap = entry.cap
        insort(entry.never if cap is not None and pod.charge > cap else entry.fit, key_of(pod))
        insort(entry.oldest, (pod.created, pod.uid))
        if pod.gang:
            insort(self._gangs.setdefault(pod.gang, []), key_of(pod))

    def remove(self, uid: str) -> None:
        """Take a pod out of line, if it is in it."""
        pod = self._pods.pop(uid, None)
        if pod is None:
            return
        entry = self._classes[pod.class_name]
        key = key_of(pod)
        for keys in (entry.fit, entry.never):
            at = bisect_left(keys, key)
            if at < len(keys) and keys[at] == key:
                del keys[at]
                break
        at = bisect_left(entry.oldest, (pod.created, pod.uid))
        del entry.oldest[at]
        if not entry:
            del self._classes[pod.class_name]
        if pod.gang:
            members = self._gangs[pod.gang]
            del members[bisect_left(members, key)]
            if not members:
                del self._gangs[pod.gang]

    def ordered(self) -> Iterator[Waiting]:
        """Yield the pods in line order."""
        lists = [keys for entry in self._classes.values() for keys in (entry.fit, entry.never)]
        for key in heapq.merge(*lists):
            yield self._pods[key[3]]

    def after(self, order: Key | None, count: int) -> list[Waiting]:
        """Return up to `count` pods in line order from just after `order` (None: the head)."""
        found: list[Waiting] = []
        for key in heapq.merge(*self._from(order)):
            found.append(self._pods[key[3]])
            if len(found) == count:
                break
        return found

    def _from(self, order: Key | None) -> list[Iterator[Key]]:
        iterators = []
        for entry in self._classes.values():
            for keys in (entry.fit, entry.never):
                start = 0 if order is None else bisect_right(keys, order)
                iterators.append(iter(keys[start:]))
        return iterators

    def by_class(self) -> dict[str, tuple[int, str]]:
        """Return, per class, how many pods wait and the creation time of the oldest."""
        return {name: (len(e), e.oldest[0][0]) for name, e in self._classes.items()}

    def gangs_by_class(self) -> dict[str, tuple[int, str]]:
        """Return, per class of their first pod in line, how many gangs wait and the
        creation time of the oldest of those first pods (one visit per gang)."""
        found: dict[str, tuple[int, str]] = {}
        for keys in self._gangs.values():
            head = self._pods[keys[0][3]]
            count, oldest = found.get(head.class_name, (0, head.created))
            found[head.class_name] = (count + 1, min(oldest, head.created))
        return found

    def gang_keys(self) -> list[str]:
        """Return the gangs in line (their keys), without visiting their pods."""
        return list(self._gangs)

    def gangs(self) -> dict[str, list[Waiting]]:
        """Return the gangs in line, each with its pods in line order."""
        pods = self._pods
        return {gang: [pods[key[3]] for key in keys] for gang, keys in self._gangs.items()}

    def present(self, uids: Iterable[str]) -> set[str]:
        """Return those of `uids` that are in line."""
        pods = self._pods
        return {uid for uid in uids if uid in pods}

    def walk(
        self,
        namespace: str,
        in_use: Mapping[str, Fraction],
        limits: Mapping[str, Fraction],
        *,
        excluded: Collection[str] = (),
        extras: Sequence[Waiting] = (),
        until: Order | None = None,
        most: int | None = None,
        held: Mapping[str, str] | None = None,
        gangs: Gangs | None = None,
    ) -> Walk:
        """Decide the line from its head as `next_releases` would, visiting only the pods
        that may change what it decides.

        `excluded`: pods of the line left out (charged already). `extras`: pods not in the
        index that join the line, after any of the index's pods of the same order. `until`:
        stop after the pods of this order. `most`: stop after releasing this many (a gang
        goes whole: it is released past `most` only as the walk's first release). `held`:
        classes that wait whatever their limits say (a GPU-hour budget spent), with why.
        `gangs`: what is known of the line's gangs (None: nothing, as at admission).
        """
        held = held or {}
        decided: dict[str, str] = {}  # gangs met that wait -> why
        gone: set[str] = set()  # gangs released whole
        self._sort_for(limits)
        used = dict(in_use)
        blocked: dict[str, str] = {}
        released: list[Waiting] = []
        bound = None if until is None else (*until, _LAST)
        # Heap entries: (order, source rank, tie-break, source); sources are the classes'
        # lists of pods that may fit (rank 0), then the extras (rank 1 and after).
        heap: list[tuple[Order, int, str, int]] = []
        cursors: list[tuple[list[Key], int]] = []
        for entry in self._classes.values():
            if entry.fit:
                cursors.append((entry.fit, 0))
                self._push(heap, cursors, len(cursors) - 1, bound)
        ordered_extras = sorted(extras, key=Waiting.order)
        for rank, pod in enumerate(ordered_extras, start=1):
            if until is None or pod.order() <= until:
                heap.append((pod.order(), rank, "", -rank))
        heapq.heapify(heap)
        complete = True
        while heap:
            _, rank, uid, source = heapq.heappop(heap)
            if rank == 0:
                pod = self._pods[uid]
                keys, at = cursors[source]
                cursors[source] = (keys, at + 1)
                if uid in excluded:
                    self._push(heap, cursors, source, bound)
                    continue
            else:
                pod = ordered_extras[rank - 1]
            if pod.gang:
                if pod.gang in decided or pod.gang in gone:
                    if rank == 0:
                        self._push(heap, cursors, source, bound)
                    continue
                members = self._members_of(pod.gang, excluded, ordered_extras)
                charged = len(self._gangs.get(pod.gang, ())) - sum(
                    1 for p in members if p.uid in self._pods
                )
                after, marked = dict(used), dict(blocked)
                why = decide_gang(
                    namespace, pod.gang, members, charged, after, limits, marked, held, gangs
                )
                over = most is not None and len(released) + len(members) > most
                if why is None and released and over:
                    complete = False
                    break  # the gang goes whole, first of the next walk
                used, blocked = after, marked
                if why is None:
                    gone.add(pod.gang)
                    released.extend(members)
                    if most is not None and len(released) >= most:
                        complete = False
                        break
                else:
                    decided[pod.gang] = why
                    if ALL_CLASSES in blocked:
                        break  # every pod counts against the cap: all wait now
                keys_of_pod = limits_on(pod.class_name, limits)
                if rank == 0 and not any(key in blocked for key in keys_of_pod):
                    self._push(heap, cursors, source, bound)
                continue
            if pod.class_name in held:
                continue  # its class waits for its budget, whatever its place
            keys_of_pod = limits_on(pod.class_name, limits)
            if any(key in blocked for key in keys_of_pod):
                continue  # its class waits behind a pod that does not fit: drop the class
            if rank > 0 and never_fits(
                namespace=namespace, class_name=pod.class_name, requested=pod.charge, limits=limits
            ):
                continue
            if take_if_fits(namespace, pod, used, limits, blocked).allowed:
                released.append(pod)
                if most is not None and len(released) >= most:
                    complete = False
                    break
            elif ALL_CLASSES in blocked:
                break  # every pod counts against the cap: all wait now
            if rank == 0 and not any(key in blocked for key in keys_of_pod):
                self._push(heap, cursors, source, bound)
        return Walk(tuple(released), used, blocked, complete, decided)

    def _members_of(
        self, gang: str, excluded: Collection[str], extras: Sequence[Waiting]
    ) -> list[Waiting]:
        """Return the waiting pods of a gang that the walk judges: those of the index not
        left out, and those of `extras`, in line order (an extra after the index's pods of
        its order)."""
        pods = self._pods
        found = [
            (pods[key[3]].order(), 0, pods[key[3]])
            for key in self._gangs.get(gang, ())
            if key[3] not in excluded
        ]
        found += [(pod.order(), 1 + at, pod) for at, pod in enumerate(extras) if pod.gang == gang]
        return [pod for _, _, pod in sorted(found, key=lambda each: each[:2])]

    def _push(
        self,
        heap: list[tuple[Order, int, str, int]],
        cursors: list[tuple[list[Key], int]],
        source: int,
        bound: Key | None,
    ) -> None:
        keys, at = cursors[source]
        if at < len(keys) and (bound is None or keys[at] < bound):
            key = keys[at]
            heapq.heappush(heap, ((key[0], key[1], key[2]), 0, key[3], source))

    def place(
        self,
        namespace: str,
        pod: Waiting,
        in_use: Mapping[str, Fraction],
        limits: Mapping[str, Fraction],
        *,
        excluded: Collection[str] = (),
        extras: Sequence[Waiting] = (),
        held: Mapping[str, str] | None = None,
        gangs: Gangs | None = None,
    ) -> Place | None:
        """Return where `pod` stands if it joins the line after the pods of its order (or
        stands where it is, if it is in line): None if a pass would release it now, else its
        place, as `next_releases` would say. `excluded` must hold only pods of the line
        (`present`): they are counted out one by one. `held`, `gangs`: as `walk` takes
        them. A pod of a gang stands where its gang does: at its first pod waiting."""
        held = held or {}
        if pod.gang:
            return self._place_in_gang(
                namespace,
                pod,
                in_use,
                limits,
                excluded=excluded,
                extras=extras,
                held=held,
                gangs=gangs,
            )
        order = pod.order()
        walked = self.walk(
            namespace,
            in_use,
            limits,
            excluded=_Either(excluded, pod.uid),
            extras=extras,
            until=order,
            held=held,
            gangs=gangs,
        )
        keys = limits_on(pod.class_name, limits)
        never = never_fits(
            namespace=namespace, class_name=pod.class_name, requested=pod.charge, limits=limits
        )
        stuck = next((walked.blocked[k] for k in keys if k in walked.blocked), None)
        if pod.class_name in held:
            reason = held[pod.class_name]
        elif never is not None:
            reason = f"{never}; it waits until the limit grows"
        elif stuck is not None:
            reason = stuck
        else:
            verdict = judge(
                namespace=namespace,
                class_name=pod.class_name,
                requested=pod.charge,
                in_use=walked.used,
                limits=limits,
            )
            if verdict.allowed:
                return None
            reason = verdict.message or "quota exceeded"
        return Place(pod, self._ahead(pod, limits, excluded, extras, walked.released), reason)

    def _place_in_gang(
        self,
        namespace: str,
        pod: Waiting,
        in_use: Mapping[str, Fraction],
        limits: Mapping[str, Fraction],
        *,
        excluded: Collection[str],
        extras: Sequence[Waiting],
        held: Mapping[str, str],
        gangs: Gangs | None,
    ) -> Place | None:
        """`place` for a pod of a gang: the gang is decided as a walk meets it, the pod
        among its members, and the pod stands where the gang's first pod does."""
        others = set(excluded) - {pod.uid} if pod.uid in excluded else excluded
        joining = [*extras, pod] if pod.uid not in self._pods else list(extras)
        walked = self.walk(
            namespace,
            in_use,
            limits,
            excluded=others,
            extras=joining,
            until=pod.order(),
            held=held,
            gangs=gangs,
        )
        if any(other.uid == pod.uid for other in walked.released):
            return None
        members = self._members_of(pod.gang, others, joining)
        reason = walked.gangs.get(pod.gang)
        if reason is None:  # its first pod was never met: its class waits, or never fits
            charged = len(self._gangs.get(pod.gang, ())) - sum(
                1 for p in members if p.uid in self._pods
            )
            reason = decide_gang(
                namespace,
                pod.gang,
                members,
                charged,
                dict(walked.used),
                limits,
                dict(walked.blocked),
                held,
                gangs,
            )
            if reason is None:  # cannot be: a gang the walk did not meet waits
                return None
        # It stands where its gang's first pod does.
        ahead = self._ahead(members[0], limits, others, joining, walked.released)
        return Place(pod, ahead, reason)

    def _ahead(
        self,
        pod: Waiting,
        limits: Mapping[str, Fraction],
        excluded: Collection[str],
        extras: Sequence[Waiting],
        released: Sequence[Waiting],
    ) -> int:
        """Count the pods that wait ahead of `pod` for the same limits: those of the index
        and of `extras` up to its order, less those left out, the pod itself, and those a
        walk to it released."""
        order = pod.order()
        everyone = ALL_CLASSES in limits

        def counts(other: Waiting) -> bool:
            return everyone or other.class_name == pod.class_name

        bound = (*order, _LAST)
        entries = self._classes.values() if everyone else [self._classes.get(pod.class_name)]
        ahead = sum(bisect_left(e.fit, bound) + bisect_left(e.never, bound) for e in entries if e)
        # The pods of the index left out, and the pod itself if it is in line, are not ahead.
        for uid in _Either(excluded, pod.uid):
            other = self._pods.get(uid)
            if other is not None and counts(other) and other.order() <= order:
                ahead -= 1
        ahead += sum(
            1 for other in extras if other is not pod and counts(other) and other.order() <= order
        )
        ahead -= sum(1 for other in released if counts(other) and other.order() <= order)
        return ahead

    def _sort_for(self, limits: Mapping[str, Fraction]) -> None:
        """Put apart, in each class, the pods that can never fit under these limits (a pass
        over a class only when its limits changed)."""
        for name, entry in self._classes.items():
            cap = _cap(name, limits)
            if cap == entry.cap:
                continue
            entry.cap = cap
            both = list(heapq.merge(entry.fit, entry.never))
            entry.fit, entry.never = [], []
            for key in both:
                never = cap is not None and self._pods[key[3]].charge > cap
                (entry.never if never else entry.fit).append(key)


class _Either:
    """`uid in excluded or uid == one`, without copying `excluded`."""

    __slots__ = ("excluded", "one")

    def __init__(self, excluded: Collection[str], one: str) -> None:
        self.excluded = excluded
        self.one = one

    def __contains__(self, uid: object) -> bool:
        return uid == self.one or uid in self.excluded

    def __iter__(self) -> Iterator[str]:
        yield from self.excluded
        if self.one not in self.excluded:
            yield self.one

    def __len__(self) -> int:
        return len(self.excluded) + 1
