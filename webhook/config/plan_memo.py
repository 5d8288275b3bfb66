"""Remember plans: the pods of one ReplicaSet or Job get the same rewrite, computed once.

Keyed by `policies.access.rewrite.memo_key`, which holds exactly what `plan` reads, so a remembered
plan is the plan. The key is taken without the shape check of the pod's spec, which `plan` makes
on a miss: the key holds every field that check reads, so a hit is a pod already checked.
One memo belongs to one config snapshot and goes with it on reload.

The memo is bounded in bytes, not only in entries: a tenant can send distinct pods of a
megabyte each, and every one of them must not stay. Each entry is weighed when it is made,
by the memory its objects really hold (`held_bytes`: every object reachable from the key and
the plan, as `sys.getsizeof` counts it, plus the memo's own bookkeeping), the least recently
used go first, and a plan heavier than a small slice of the budget is not kept at all: such
pods are one of a kind, so remembering them would only push the others out.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from policies import Denial, Plan, Policy, plan
from policies.access.rewrite import memo_key
from policies.pods.pod_view import PodView
from webhook.observe.readings import MemoReading

# Distinct pod shapes remembered. Pods of one ReplicaSet or Job share a shape, so a cluster
# has about as many shapes as it has GPU workloads: thousands at most.
MAX_PLANS = 4096
# What the memo may hold, weighed as below. Typical entries weigh 5 to 10 KiB, so the entry
# bound is reached long before this one; only large distinct pods meet it.
MAX_MEMO_BYTES = 32 * 1024 * 1024
# No single plan heavier than this is remembered (about a 100-container pod).
MAX_ENTRY_BYTES = MAX_MEMO_BYTES // 64
# Per entry, beside its objects: the OrderedDict's node and slot, the entry's tuple, and the
# allocator's rounding of each object (tracemalloc counts 5 to 15% above `sys.getsizeof`).
ENTRY_OVERHEAD_BYTES = 512
HELD_FACTOR = 1.25


class PlanMemo:
    """A memo of plans and denials, least recently used first out, bounded in bytes.

    Safe to call from several threads: large pods are planned off the event loop.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        max_entries: int = MAX_PLANS,
        max_bytes: int = MAX_MEMO_BYTES,
    ) -> None:
        """Remember plans under `policy`, at most `max_entries` of them weighing `max_bytes`."""
        self._policy = policy
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._plans: OrderedDict[bytes, tuple[Plan | Denial, int]] = OrderedDict()
        self._weight = 0
        self._evictions = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._plans)

    def stats(self) -> MemoReading:
        """Return what the memo holds now, and how many entries it dropped for room."""
        return MemoReading(len(self._plans), self._weight, self._evictions)

    def plan(
        self,
        pod: Mapping[str, Any],
        *,
        namespace: str | None = None,
        namespace_default_class: str | None,
        view: PodView | None = None,
    ) -> Plan:
        """Return `policies.plan` of the pod (whose view `view` is, if given), or raise its
        `Denial`."""
        key = memo_key(
            pod,
            self._policy,
            namespace=namespace,
            namespace_default_class=namespace_default_class,
        )
        with self._lock:
            entry = self._plans.get(key)
            if entry is not None:
                self._plans.move_to_end(key)
        if entry is not None:
            found = entry[0]
        else:
            try:
                found = plan(
                    pod,
                    self._policy,
                    namespace=namespace,
                    namespace_default_class=namespace_default_class,
                    view=view,
                )
            except Denial as denial:
                found = denial
            self._remember(key, found)
        if isinstance(found, Denial):
            raise Denial(found.message)
        return found

    def _remember(self, key: bytes, found: Plan | Denial) -> None:
        weight = _weigh(key, found)
        if weight > min(MAX_ENTRY_BYTES, self._max_bytes):
            return
        with self._lock:
            if key in self._plans:
                return  # another thread planned the same pod meanwhile
            self._plans[key] = (found, weight)
            self._weight += weight
            while len(self._plans) > self._max_entries or self._weight > self._max_bytes:
                _, (_, dropped) = self._plans.popitem(last=False)
                self._weight -= dropped
                self._evictions += 1


def _weigh(key: bytes, found: Plan | Denial) -> int:
    return int(HELD_FACTOR * held_bytes(key, found)) + ENTRY_OVERHEAD_BYTES


def held_bytes(*roots: object) -> int:
    """Return the bytes of every object reachable from `roots`, each counted once.

    Follows what a plan is made of: containers, dataclasses and plain objects with
    attributes. Objects shared with the policy (class names, say) are counted too: the
    weight errs on the heavy side, never the light one.
    """
    seen: set[int] = set()
    total = 0
    stack: list[object] = list(roots)
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, (str, bytes, int, float, bool)) or item is None:
            continue
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        else:
            stack.extend(_attributes(item))
    return total


def _attributes(item: object) -> list[object]:
    names = [
        name
        for kind in type(item).__mro__
        for name in getattr(kind, "__slots__", ())
        if isinstance(name, str)
    ]
    values = [getattr(item, name) for name in names if hasattr(item, name)]
    state = getattr(item, "__dict__", None)
    if state is not None:
        values.append(state)
    return values
