"""Reservations: pods admitted against quota that the pod watch may not show yet.

A namespace's reservations form one record, written with optimistic concurrency: the write
names the version it read, and fails with `Conflict` if anyone wrote in between. This is how
the apiserver's own ResourceQuota admission stays exact across apiserver replicas; here it
keeps several gpuadm replicas from admitting the same room twice.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from policies.quantity import format_amount
from policies.quota.cohorts import record_of
from webhook.kube.errors import KubeError


class Conflict(Exception):
    """The record changed since it was read; read it again and redo the judgement."""


class RecordFull(KubeError):
    """The record would hold more than its store can keep: nothing was written."""

    def __init__(self, namespace: str, reservations: int, limit_bytes: int) -> None:
        self.headline = f"the quota record of {record_of(namespace)} is full"
        self.detail = (
            f"{self.headline}: {reservations} reservations of recent admissions would take "
            f"more than its {limit_bytes // 1024} KiB; retry in a minute, when the oldest "
            "have expired"
        )
        super().__init__(413, self.detail)


class UnreadableRecord(KubeError):
    """The record is in a format this version does not read (a later gpuadm's), or is not
    a record gpuadm wrote: nothing is judged by it, and nothing written over it."""

    def __init__(self, namespace: str, reason: str) -> None:
        self.detail = f"gpuadm cannot read the quota record of {record_of(namespace)}: {reason}"
        super().__init__(500, self.detail)


# The most digits of a resourceVersion a reservation's `stored` mark carries (etcd's
# revisions, 64-bit, have at most 19).
STORED_DIGITS = 20


def storable(version: int) -> int:
    """Return `version` as a reservation may carry it in `stored`: 0 if it could not be
    read back from the record (so no one writes, again and again, a mark that never holds)."""
    return version if 0 < version < 10**STORED_DIGITS else 0


@dataclass(frozen=True, slots=True)
class Reservation:
    """One admitted pod's charge, from the moment it was admitted."""

    class_name: str
    charge: Fraction
    at: float
    pod: str = ""
    # The pod was in the store by this pod resourceVersion, as the writer's watch of pods
    # labelled `stored_by` showed it (a pod released from its line); 0: not known (a pod
    # admitted and still in flight). A replica whose view of that label is complete up to it
    # and has no such pod knows the pod is gone, even if it started after the pod went and
    # so never saw it (`UsageIndex.left`).
    stored: int = 0
    stored_by: str = ""
    # The namespace it charges, in a cohort's record, which holds the reservations of all
    # its members; "" in a namespace's own record.
    namespace: str = ""

    def to_json(self) -> dict[str, Any]:
        """Return the reservation as stored in the record."""
        data: dict[str, Any] = {
            "class": self.class_name,
            "charge": _written(self.charge),
            "at": self.at,
            "pod": self.pod,
        }
        if self.namespace:
            data["namespace"] = self.namespace
        if self.stored:
            data["stored"] = {"version": str(self.stored), "label": self.stored_by}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Reservation:
        """Read a reservation back from the record (one written before `stored` was, or
        with a `stored` it cannot read, as not known to be stored)."""
        stored = data.get("stored")
        version, label = 0, ""
        if isinstance(stored, dict):
            text = stored.get("version")
            if (
                isinstance(text, str)
                and text.isascii()
                and text.isdigit()
                and len(text) <= STORED_DIGITS
            ):
                version, label = int(text), str(stored.get("label", ""))
        return cls(
            str(data["class"]),
            _read(str(data["charge"])),
            float(data["at"]),
            str(data.get("pod", "")),
            version,
            label,
            str(data.get("namespace", "")),
        )

    def charges(self, key: str, namespace: str) -> bool:
        """Tell whether it charges `namespace`, read from the record `key`."""
        return (self.namespace or key) == namespace


# A record holds every reservation of the last 90 s, each written and read at every write
# or read of it; charges take few values (1, 0.5, 2 ...), so each is converted once.
@functools.lru_cache(maxsize=1024)
def _written(charge: Fraction) -> str:
    return format_amount(charge)


# An amount as `format_amount` writes it (1, 0.5, 7/3): digits, a point or a slash, and no
# exponent, whose digits Fraction would build however many (a record edited by hand).
AMOUNT = re.compile(r"[0-9]{1,40}(?:[./][0-9]{1,40})?")


@functools.lru_cache(maxsize=1024)
def _read(charge: str) -> Fraction:
    if not AMOUNT.fullmatch(charge):
        raise ValueError(f"the amount {charge[:50]!r} is not one gpuadm writes")
    return Fraction(charge)


@dataclass(frozen=True, slots=True)
class Mark:
    """How far the pods whose reservations left a record had been shown (the watermark).

    A reservation leaves its record once the writer's pod watch has shown its pod holding
    GPUs or ended; `version` is then at least the resourceVersion of the watch event that
    showed it, and only grows. A replica judges with the record only once its own view of
    pods is complete up to `version`, so it counts every such pod as a pod.
    """

    version: int = 0
    """A pod resourceVersion; 0: no reservation ever left the record early."""
    label: str = ""
    """The label the watch that showed the pods selects pods by."""
    at: float = 0.0
    """When a reservation last left the record so: an emptied record stays, with its mark,
    until the reservations' lifetime has passed since."""

    def to_json(self) -> dict[str, Any]:
        """Return the mark as stored in the record."""
        return {"version": str(self.version), "label": self.label, "at": self.at}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Mark:
        """Read a mark back from the record."""
        return cls(int(data["version"]), str(data["label"]), float(data["at"]))


NO_MARK = Mark()


@dataclass(frozen=True, slots=True)
class Allowance:
    """Room of a namespace set aside for one replica, which admits pods from it without a
    write of the record (`webhook.quota.allowances`).

    Every other replica counts all of it as held, until its holder writes it smaller or
    away, or until `until` plus the reservations' lifetime has passed: the holder admits
    from it only before `until` by its own clock, and a pod it admitted then is stored, or
    never will be, well within that lifetime.
    """

    room: Mapping[str, Fraction]
    """GPUs set aside, per class."""
    until: float
    """The holder admits from it only before this moment (seconds since the epoch)."""
    wants: float = 0.0
    """Until this moment, a pod of this replica waits for room other replicas hold aside:
    no replica sets more room aside meanwhile, so that what they give back stays free."""

    def to_json(self) -> dict[str, Any]:
        """Return the allowance as stored in the record."""
        data: dict[str, Any] = {
            "room": {name: _written(amount) for name, amount in sorted(self.room.items())},
            "until": self.until,
        }
        if self.wants:
            data["wants"] = self.wants
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Allowance:
        """Read an allowance back from the record."""
        room = data["room"]
        if not isinstance(room, dict):
            raise ValueError("an allowance's room is not a mapping")
        amounts = {str(name): _read(str(amount)) for name, amount in room.items()}
        if any(amount < 0 for amount in amounts.values()):
            raise ValueError("an allowance's room is negative")
        return cls(amounts, float(data["until"]), float(data.get("wants", 0.0)))


@dataclass(frozen=True, slots=True)
class Record:
    """A namespace's reservations by pod uid, the version they were read at, the mark of
    the reservations that left it as their pods were shown, and the room set aside for
    replicas by their names (`Allowance`)."""

    reservations: dict[str, Reservation]
    version: str | None = None
    mark: Mark = NO_MARK
    allowances: Mapping[str, Allowance] = field(default_factory=dict)


EMPTY = Record({})


class ReservationStore(Protocol):
    """Where reservation records live: shared by every replica that may admit pods."""

    async def read(self, namespace: str) -> Record:
        """Return the namespace's record (empty, with version None, if it has none)."""
        ...

    async def write(
        self,
        namespace: str,
        reservations: dict[str, Reservation],
        version: str | None,
        mark: Mark = NO_MARK,
        allowances: Mapping[str, Allowance] | None = None,
    ) -> str:
        """Replace the record if it is still at `version`; return the new version."""
        ...

    async def delete(self, namespace: str, version: str) -> None:
        """Delete the record if it is still at `version`, else raise `Conflict`."""
        ...

    async def namespaces(self) -> list[str]:
        """Return the namespaces that have a record."""
        ...


class MemoryStore:
    """An in-process store with the apiserver's resourceVersion semantics.

    One replica's store when gpuadm runs standalone, and the shared store of several ledgers
    in the tests. Each call yields to the event loop first, as a network call would, so that
    concurrent admissions really interleave between read and write.
    """

    def __init__(self) -> None:
        self._records: dict[str, Record] = {}
        self._next_version = 1
        self.writes = 0
        self.conflicts = 0

    async def read(self, namespace: str) -> Record:
        """Return the namespace's record."""
        await asyncio.sleep(0)
        return self._records.get(namespace, EMPTY)

    async def write(
        self,
        namespace: str,
        reservations: dict[str, Reservation],
        version: str | None,
        mark: Mark = NO_MARK,
        allowances: Mapping[str, Allowance] | None = None,
    ) -> str:
        """Replace the record if it is still at `version`."""
        await asyncio.sleep(0)
        if self._records.get(namespace, EMPTY).version != version:
            self.conflicts += 1
            raise Conflict(namespace)
        new_version = str(self._next_version)
        self._next_version += 1
        self._records[namespace] = Record(
            dict(reservations), new_version, mark, dict(allowances or {})
        )
        self.writes += 1
        return new_version

    async def delete(self, namespace: str, version: str) -> None:
        """Delete the record if it is still at `version`."""
        await asyncio.sleep(0)
        if self._records.get(namespace, EMPTY).version != version:
            self.conflicts += 1
            raise Conflict(namespace)
        del self._records[namespace]

    async def namespaces(self) -> list[str]:
        """Return the namespaces that have a record."""
        await asyncio.sleep(0)
        return list(self._records)
