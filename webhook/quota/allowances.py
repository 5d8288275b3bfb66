"""Allowances: room of a namespace set aside for one replica, which admits pods from it
without a write of the record.

Without them, every admission under quota waits for one write of its namespace's record:
a round trip through the apiserver to etcd, most of what quota adds to a create. With them,
a replica that writes the record for an admission also sets aside half of the room left
after it, in the same write, under its own name (`Allowance`). Until it writes again it
admits pods of that class from that room alone, in memory, and writes nothing.

What keeps it exact:

- Every other replica counts an allowance whole, as held, until its holder writes it
  smaller or away. So no room is given twice: a pod admitted from an allowance is inside
  room nobody else counts as free.
- The holder writes the pods it admitted from its allowance into the record as ordinary
  reservations at its next write (and takes that much out of the allowance in the same
  write), so the room they take stays counted as it moves from one to the other.
- The holder admits from an allowance only before its `until`, by its own clock. If it dies
  holding one, the others count the allowance until `until` plus the reservations' lifetime
  (90 s): by then every pod it admitted is stored (and shown by the watch) or never will be.
  That is the failure story: a replica killed while holding an allowance leaves its unused
  room held for at most that long, never given twice.
- A replica returns its allowance when it has admitted nothing from it for `IDLE_SECONDS`,
  and before `until` (a later admission takes a new one), so a replica that needs room
  another holds waits for it at most about `ALLOWANCE_SECONDS` (`WAIT_SECONDS`), and finds it.
- Half of what is free, never all of it: the rest stays for the other replicas' writes, and
  a namespace near its limit gets allowances too small to take, and is judged write by write
  as before, exactly.

A replica is named afresh at each start: a restarted replica must not take a dead one's
allowance for its own, or the pods that one admitted would lose the room that covers them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from webhook.quota.reservations import Allowance, Record, Reservation

# How long an allowance lasts: the holder admits from it for this long at most.
ALLOWANCE_SECONDS = 1.5
# The holder returns an allowance this long before its end (the next admission takes a new
# one), and one it has admitted nothing from for `IDLE_SECONDS`.
RETURN_BEFORE_SECONDS = 0.5
IDLE_SECONDS = 0.2
# How often the keeper looks at this replica's allowances.
KEEP_SECONDS = 0.05
# How long an admission that does not fit only because of other replicas' allowances waits
# for them to be returned, reading the record every `POLL_SECONDS`; then it is refused. Well
# inside the webhook's timeout of 5 s.
WAIT_SECONDS = 1.5
POLL_SECONDS = 0.05

ZERO = Fraction(0)


def holder_name(identity: str) -> str:
    """Return a replica's name in records' allowances: its identity and a token of this
    start, so that a restarted replica never takes its old allowances for its own."""
    return f"{identity or 'gpuadm'}-{secrets.token_hex(4)}"


@dataclass(slots=True)
class Held:
    """This replica's allowance in one namespace."""

    remaining: dict[str, Fraction] = field(default_factory=dict)
    """What is left to admit from, per class; nothing while a write replaces it."""
    until: float = 0.0
    """Admit from it only before this moment."""
    stored: dict[str, Fraction] = field(default_factory=dict)
    """The room the record holds under this replica's name, as last written."""
    pending: dict[str, Reservation] = field(default_factory=dict)
    """Pods admitted from it that the record does not hold yet, by pod uid."""
    last_grant: float = 0.0
    limits: Mapping[str, Fraction] = field(default_factory=dict)
    """The namespace's limits when the room was set aside: admit from it only under these
    (a lowered limit may leave less room than it holds)."""
    wants: float = 0.0
    """Until this moment, a pod of this replica waits for room others hold aside."""
    wants_stored: float = 0.0
    """The `wants` the record holds under this replica's name, as last written."""


@dataclass(frozen=True, slots=True)
class Written:
    """What a write sets this replica's allowance to, applied once the write is stored."""

    took: Mapping[str, Fraction]
    until: float
    stored: dict[str, Fraction]
    limits: Mapping[str, Fraction] | None
    wants: float


class Allowances:
    """This replica's allowances in every namespace, and the rules for others'."""

    def __init__(
        self,
        holder: str,
        *,
        enabled: bool,
        clock: Callable[[], float],
        reservation_ttl: float,
    ) -> None:
        """Hold allowances as `holder` when `enabled` (in a cluster: a standalone replica
        shares its records with no one, and has no one to set room aside from)."""
        self.holder = holder
        self.enabled = enabled
        self.clock = clock
        self.reservation_ttl = reservation_ttl
        self._held: dict[str, Held] = {}

    def namespaces(self) -> list[str]:
        """Return the namespaces this replica holds an allowance or pending pods in."""
        return list(self._held)

    def held(self, namespace: str) -> Held | None:
        """Return this replica's allowance in a namespace, if any."""
        return self._held.get(namespace)

    def holds(self, namespace: str, now: float) -> bool:
        """Tell whether this replica may still hold room aside in a namespace, or have a
        wait said or to be said there: what the keeper gives back, or forgets once no
        replica counts it any more (`due`)."""
        held = self._held.get(namespace)
        return held is not None and now < (
            max(held.until, held.wants, held.wants_stored) + self.reservation_ttl
        )

    def pending(self, namespace: str) -> Mapping[str, Reservation]:
        """Return the pods admitted from this replica's allowance, not yet in the record."""
        held = self._held.get(namespace)
        return held.pending if held is not None else {}

    def remaining(self, namespace: str) -> Mapping[str, Fraction]:
        """Return what is left of this replica's allowance in a namespace."""
        held = self._held.get(namespace)
        return held.remaining if held is not None else {}

    def grant(
        self,
        namespace: str,
        key: str,
        reservation: Reservation,
        limits: Mapping[str, Fraction],
    ) -> bool:
        """Admit a pod from this replica's allowance, if it has room for it, has not ended,
        and was set aside under the namespace's `limits` in force; return whether it did. A
        pod admitted from it before (a retried request) is admitted again, not charged
        again."""
        held = self._held.get(namespace)
        if held is None or held.limits != limits:
            return False
        if key in held.pending:
            return True
        class_name = reservation.class_name
        room = held.remaining.get(class_name, ZERO)
        if reservation.at >= held.until or room < reservation.charge:
            return False
        held.remaining[class_name] = room - reservation.charge
        held.pending[key] = reservation
        held.last_grant = reservation.at
        return True

    def release(self, namespace: str) -> dict[str, Fraction]:
        """Stop admitting from this replica's allowance in a namespace: its room goes back
        to the namespace at the next write (until then the record still holds it). Return
        what remained, for `restore` if no write follows."""
        held = self._held.get(namespace)
        if held is None:
            return {}
        remaining, held.remaining = held.remaining, {}
        return remaining

    def restore(self, namespace: str, remaining: dict[str, Fraction]) -> None:
        """Admit from the room `release` returned again: no write gave it back."""
        held = self._held.get(namespace)
        if held is not None and remaining:
            held.remaining = remaining

    def unsure(self, namespace: str, written: Written) -> None:
        """Remember that a write may have stored room that this replica does not count as
        its own (the apiserver failed to answer, not refused): the keeper gives it back."""
        if not written.stored:
            return
        held = self._held.setdefault(namespace, Held())
        for class_name, amount in written.stored.items():
            held.stored[class_name] = max(held.stored.get(class_name, ZERO), amount)
        held.until = max(held.until, written.until)

    def wait(self, namespace: str, until: float) -> bool:
        """Say that a pod of this replica waits, until `until`, for room other replicas hold
        aside; return whether the record should be told (it does not say so yet)."""
        held = self._held.setdefault(namespace, Held())
        held.wants = until
        return held.wants_stored <= self.clock()

    def waited(self, namespace: str) -> None:
        """Say that no pod of this replica waits for room others hold aside any more (the
        record is told at the next write, or the wish ends by itself)."""
        held = self._held.get(namespace)
        if held is not None:
            held.wants = 0.0

    def others_wait(self, allowances: Mapping[str, Allowance], now: float) -> bool:
        """Tell whether a pod of another replica waits for room held aside: then no room is
        set aside, so that what is given back stays free for it."""
        return any(
            holder != self.holder and allowance.wants > now
            for holder, allowance in allowances.items()
        )

    def others(self, allowances: Mapping[str, Allowance], now: float) -> dict[str, Fraction]:
        """Return the room other replicas' allowances hold, per class: all of each, until
        it is written away or its holder may have admitted its last pod from it long ago."""
        room: dict[str, Fraction] = {}
        for holder, allowance in allowances.items():
            if holder == self.holder or now >= allowance.until + self.reservation_ttl:
                continue
            for class_name, amount in allowance.room.items():
                room[class_name] = room.get(class_name, ZERO) + amount
        return room

    def composed(
        self,
        namespace: str,
        read: Record,
        now: float,
        take: Mapping[str, Fraction] | None = None,
        limits: Mapping[str, Fraction] | None = None,
    ) -> tuple[dict[str, Allowance], Written]:
        """Return the allowances a write over `read` stores, and what it makes of this
        replica's own once stored.

        Others' are kept as they were (those that no longer count are left out). This
        replica's is what remains of it now, plus `take` (which then lasts
        `ALLOWANCE_SECONDS` from `now`, under `limits`); grants made while the write is in
        flight come out of what remains, which the stored room still covers.
        """
        held = self._held.get(namespace)
        remaining = dict(held.remaining) if held is not None else {}
        until = held.until if held is not None else 0.0
        if take:
            until = now + ALLOWANCE_SECONDS
            for class_name, amount in take.items():
                remaining[class_name] = remaining.get(class_name, ZERO) + amount
        stored = {name: amount for name, amount in remaining.items() if amount > 0}
        wants = held.wants if held is not None and held.wants > now else 0.0
        allowances = {
            holder: allowance
            for holder, allowance in read.allowances.items()
            if holder != self.holder
            and (
                (allowance.room and now < allowance.until + self.reservation_ttl)
                or allowance.wants > now
            )
        }
        if stored or wants:
            allowances[self.holder] = Allowance(stored, until, wants)
        written = Written(dict(take or {}), until, stored, limits if take else None, wants)
        return allowances, written

    def stored(self, namespace: str, flushed: Iterable[str], written: Written) -> None:
        """Apply a write that was stored: the pods it carried as reservations leave
        `pending`, the room it took joins what remains."""
        held = self._held.get(namespace)
        if held is None:
            if not written.stored and not written.wants:
                return
            held = self._held[namespace] = Held()
        for key in flushed:
            held.pending.pop(key, None)
        for class_name, amount in written.took.items():
            held.remaining[class_name] = held.remaining.get(class_name, ZERO) + amount
        if written.took:  # idle from now: room just set aside is not given back at once
            held.last_grant = self.clock()
        held.until = written.until
        held.stored = written.stored
        held.wants_stored = written.wants
        if written.limits is not None:
            held.limits = written.limits
        if (
            not held.pending
            and not held.stored
            and not any(held.remaining.values())
            and not held.wants
        ):
            del self._held[namespace]

    def due(self, now: float) -> list[str]:
        """Return the namespaces whose allowance the keeper should give back now: idle, or
        near its end; and those with pods admitted from an allowance used up.

        An allowance that could not be given back (the apiserver was unreachable, or the
        record full) is forgotten once no replica counts it any more: every pod admitted
        from it is stored and shown by then, or never will be. A wait, said or to be said,
        is kept as long."""
        due = []
        for namespace, held in list(self._held.items()):
            if not self.holds(namespace, now):
                del self._held[namespace]
                continue
            idle = now - held.last_grant >= IDLE_SECONDS
            ending = now >= held.until - RETURN_BEFORE_SECONDS
            used_up = not any(held.remaining.values())
            if (held.stored and (idle or ending)) or (held.pending and used_up):
                due.append(namespace)
        return due
