"""Cohorts: namespaces that lend each other the idle part of their quotas, per GPU class.

The rules follow Kueue's cohorts (`borrowingLimit`, `lendingLimit`, `reclaimWithinCohort`),
per GPU class instead of per flavor, and at admission instead of at scheduling:

- A member's limit of a class is its **nominal** quota: always its own when it needs it.
- `lend: {a100: 3}` lends at most 3 of its nominal 4; the other 1 is **guaranteed**: never
  used by anyone else, even when idle. Without `lend`, all of the nominal quota may be lent.
- `borrow: {a100: 2}` lets it hold at most 2 beyond its nominal quota, from what the others
  lend and do not use. Without `borrow`, it may borrow all they lend.
- The cohort's **pool** of a class is what its members lend. A member holding more than its
  guaranteed part draws the rest from the pool; whatever it holds, the members together
  never draw more than the pool. So a member's limit of the moment (`Cohort.reach`) is its
  guaranteed part, plus what of the pool the others do not draw, capped by its nominal
  quota plus `borrow`.
- A class is shared only among the members that have a limit of it. A member without one
  holds as many as it likes (it is unlimited, as outside a cohort): it lends none, draws
  none from the pool and borrows none, so its pods of that class are never borrowed.
- A member's pods beyond its nominal quota are **borrowed**: the newest of its
  lowest-priority pods (`borrowed_pods`). When a member's pod waits within its nominal
  quota and the pool is drawn by borrowers, the member may take it back
  (`reclaim_plan`): `never` (the default, as Kueue's), `lowerPriority` (only borrowed pods
  of lower priority than the waiting pod) or `any`.

Pure: what every member holds comes in, the cohort's judgement goes out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from policies.quantity import format_amount

ZERO = Fraction(0)
# A cohort's record is named after this, and never after a namespace: a namespace's name
# has no dot.
KEY_PREFIX = "cohort."


def is_cohort_key(key: str) -> bool:
    """Tell whether a record's key is a cohort's, not a namespace's."""
    return key.startswith(KEY_PREFIX)


def record_of(key: str) -> str:
    """Name a quota record by its key for a message: `cohort "research"` or
    `namespace "team-a"`."""
    if is_cohort_key(key):
        return f'cohort "{key.removeprefix(KEY_PREFIX)}"'
    return f'namespace "{key}"'


Reclaim = Literal["never", "lowerPriority", "any"]
"""What a member's waiting pods may take back from borrowers: nothing, the pods of lower
priority, or any."""


@dataclass(frozen=True, slots=True)
class Member:
    """One namespace of a cohort: its nominal limits and what it lends and borrows."""

    namespace: str
    nominal: Mapping[str, Fraction]
    # At most this beyond the nominal quota, per class; a class absent: no bound.
    borrow: Mapping[str, Fraction]
    # At most this of the nominal quota lent, per class; a class absent: all of it.
    lend: Mapping[str, Fraction]
    reclaim: Reclaim = "never"

    def shares(self, class_name: str) -> bool:
        """Tell whether the member takes part in the cohort's class: it has a limit of it."""
        return class_name in self.nominal

    def lendable(self, class_name: str) -> Fraction:
        """Return how much of its nominal quota of the class others may use when idle."""
        nominal = self.nominal.get(class_name, ZERO)
        return min(self.lend.get(class_name, nominal), nominal)

    def guaranteed(self, class_name: str) -> Fraction:
        """Return how much of its nominal quota of the class is never lent."""
        return self.nominal.get(class_name, ZERO) - self.lendable(class_name)

    def ceiling(self, class_name: str) -> Fraction | None:
        """Return the most it may hold of the class, borrowing included (None: no bound
        of its own; the pool bounds it)."""
        borrow = self.borrow.get(class_name)
        return None if borrow is None else self.nominal.get(class_name, ZERO) + borrow


Usage = Mapping[str, Mapping[str, Fraction]]
"""What each member holds now, per namespace and class."""


@dataclass(frozen=True, slots=True)
class Cohort:
    """Namespaces that share the idle part of their quotas, per class."""

    name: str
    members: Mapping[str, Member]

    @property
    def key(self) -> str:
        """The name its shared record goes by, in place of each member's own."""
        return f"{KEY_PREFIX}{self.name}"

    def classes(self) -> list[str]:
        """Return the classes the cohort shares: those its members have a limit of."""
        return sorted({c for m in self.members.values() for c in m.nominal})

    def pool(self, class_name: str) -> Fraction:
        """Return what the members lend of a class, in all."""
        return sum((m.lendable(class_name) for m in self.members.values()), ZERO)

    def drawn(self, namespace: str, class_name: str, used: Fraction) -> Fraction:
        """Return what a member holding `used` draws from the pool: what it holds beyond
        its guaranteed part (nothing, for a class it has no limit of)."""
        member = self.members[namespace]
        if not member.shares(class_name):
            return ZERO
        return max(ZERO, used - member.guaranteed(class_name))

    def drawn_by_others(self, namespace: str, class_name: str, usage: Usage) -> Fraction:
        """Return what the other members draw from the pool of a class."""
        return sum(
            (
                self.drawn(other, class_name, usage.get(other, {}).get(class_name, ZERO))
                for other in self.members
                if other != namespace
            ),
            ZERO,
        )

    def reach(self, namespace: str, class_name: str, usage: Usage) -> Fraction:
        """Return the most a member may hold of a class now, given what all hold: its
        guaranteed part, and what of the pool the others leave, within its nominal quota
        plus what it may borrow. Pods within the guaranteed part always fit it."""
        member = self.members[namespace]
        left = max(ZERO, self.pool(class_name) - self.drawn_by_others(namespace, class_name, usage))
        most = member.guaranteed(class_name) + left
        ceiling = member.ceiling(class_name)
        return most if ceiling is None else min(most, ceiling)

    def limits_now(
        self, namespace: str, limits: Mapping[str, Fraction], usage: Usage
    ) -> dict[str, Fraction]:
        """Return a member's limits of the moment: each shared class at its `reach`, the
        others (and `*`) as they are."""
        return {
            key: (
                self.reach(namespace, key, usage) if self.members[namespace].shares(key) else limit
            )
            for key, limit in limits.items()
        }

    def widest(self, namespace: str, limits: Mapping[str, Fraction]) -> dict[str, Fraction]:
        """Return a member's limits as wide as its cohort ever lets them be, for what could
        never fit: each shared class at its guaranteed part plus the whole pool, within its
        nominal quota plus `borrow`; the others (and `*`) as they are."""
        member = self.members[namespace]
        widest = dict(limits)
        for class_name in member.nominal:
            most = member.guaranteed(class_name) + self.pool(class_name)
            ceiling = member.ceiling(class_name)
            widest[class_name] = most if ceiling is None else min(most, ceiling)
        return widest

    def borrowed(self, namespace: str, class_name: str, used: Fraction) -> Fraction:
        """Return how much a member holding `used` of a class holds beyond its nominal
        (nothing, for a class it has no limit of)."""
        member = self.members[namespace]
        if not member.shares(class_name):
            return ZERO
        return max(ZERO, used - member.nominal[class_name])

    def borrowed_pods(self, namespace: str, class_name: str, pods: Iterable[Held]) -> list[Held]:
        """Return a member's pods of a class that are borrowed (`borrowed_pods`); none, for
        a class it has no limit of."""
        member = self.members[namespace]
        if not member.shares(class_name):
            return []
        return borrowed_pods(member.nominal[class_name], pods)

    def lent(self, class_name: str, usage: Usage) -> dict[str, Fraction]:
        """Return, per member, how much of its idle quota of a class borrowers hold.

        What is borrowed in all is shared among the members that lend idle quota, in
        proportion to what each has idle to lend; it adds up to what is borrowed."""
        borrowed = sum(
            (
                self.borrowed(ns, class_name, usage.get(ns, {}).get(class_name, ZERO))
                for ns in self.members
            ),
            ZERO,
        )
        idle = {
            ns: max(
                ZERO,
                member.lendable(class_name)
                - self.drawn(ns, class_name, usage.get(ns, {}).get(class_name, ZERO)),
            )
            for ns, member in self.members.items()
        }
        total = sum(idle.values(), ZERO)
        if not borrowed or not total:
            return {ns: ZERO for ns in self.members}
        share = min(borrowed, total) / total
        return {ns: amount * share for ns, amount in idle.items()}

    def needs_back(
        self, namespace: str, class_name: str, charge: Fraction, usage: Usage
    ) -> Fraction:
        """Return how much of the pool borrowers must give back for a member's pod of
        `charge` to fit: 0 if it fits now, or if it does not fit the member's nominal
        quota at all (a member takes back only what is its own)."""
        member = self.members[namespace]
        if not member.shares(class_name):
            return ZERO
        used = usage.get(namespace, {}).get(class_name, ZERO)
        if used + charge > member.nominal[class_name]:
            return ZERO
        short = used + charge - self.reach(namespace, class_name, usage)
        return max(ZERO, short)


@dataclass(frozen=True, slots=True)
class Held:
    """A running pod of a cohort member, as reclaim sees it."""

    uid: str
    namespace: str
    name: str
    class_name: str
    charge: Fraction
    priority: int = 0
    # When it was created (seconds since the epoch), to evict the newest first.
    created: float = 0.0
    # The gang it is in ("" for none): a gang is borrowed and evicted whole.
    gang: str = ""
    # Deleted, and not gone yet: its room is on its way back.
    ending: bool = False


def _keep_order(pod: Held) -> tuple[int, float, str]:
    """Which of a namespace's pods keep its nominal quota: higher priority, then older."""
    return (-pod.priority, pod.created, pod.name)


def borrowed_pods(nominal: Fraction, pods: Iterable[Held]) -> list[Held]:
    """Return a member's pods of one class that hold more than its nominal quota: after
    the pods of higher priority, then the older, have filled it. A pod partly within the
    nominal quota is borrowed; pods being deleted are left out, as is their room."""
    kept = ZERO
    borrowed = []
    for pod in sorted((p for p in pods if not p.ending), key=_keep_order):
        kept += pod.charge
        if kept > nominal:
            borrowed.append(pod)
    return borrowed


@dataclass(frozen=True, slots=True)
class Unit:
    """Pods evicted together: one pod, or the borrowed pods of a gang."""

    pods: tuple[Held, ...]

    @property
    def charge(self) -> Fraction:
        return sum((p.charge for p in self.pods), ZERO)

    @property
    def priority(self) -> int:
        return max(p.priority for p in self.pods)

    @property
    def created(self) -> float:
        return max(p.created for p in self.pods)

    @property
    def namespace(self) -> str:
        return self.pods[0].namespace


def candidates(
    cohort: Cohort,
    claimant: str,
    class_name: str,
    priority: int,
    pods: Mapping[str, Sequence[Held]],
) -> list[Unit]:
    """Return, in the order they are to be evicted, the borrowed pods of a class that the
    member `claimant`'s waiting pod of `priority` may take back (its `reclaim`): of the other
    members only, lowest priority first, then newest; a gang whole, in the place of its
    lowest member. `pods` holds each member's running pods of the class."""
    rule = cohort.members[claimant].reclaim
    if rule == "never":
        return []
    units: list[Unit] = []
    for namespace in cohort.members:
        if namespace == claimant:
            continue
        borrowed = cohort.borrowed_pods(namespace, class_name, pods.get(namespace, ()))
        gangs: dict[str, None] = {}
        for pod in borrowed:
            if pod.gang:
                gangs.setdefault(pod.gang)
            else:
                units.append(Unit((pod,)))
        for gang in gangs:
            # The whole gang goes, its pods within the nominal quota too: a gang runs whole
            # or not at all.
            whole = [p for p in pods.get(namespace, ()) if p.gang == gang and not p.ending]
            units.append(Unit(tuple(sorted(whole, key=lambda p: p.name))))
    if rule == "lowerPriority":
        units = [u for u in units if u.priority < priority]
    return sorted(units, key=lambda u: (u.priority, -u.created, u.pods[0].name))


def freed_by(cohort: Cohort, class_name: str, unit: Unit, used: Fraction) -> Fraction:
    """Return what evicting `unit` gives back to the pool, from a member holding `used`."""
    drawn = cohort.drawn(unit.namespace, class_name, used)
    return min(unit.charge, drawn)


class Giving:
    """The room evictions give back to a cohort's pool of a class, as they are made: each
    member gives back only what it draws, and what it holds falls as its pods go."""

    def __init__(self, cohort: Cohort, class_name: str, usage: Usage) -> None:
        self.cohort = cohort
        self.class_name = class_name
        self.held = {ns: usage.get(ns, {}).get(class_name, ZERO) for ns in cohort.members}
        self.freed = ZERO

    def gives(self, unit: Unit) -> Fraction:
        """Return what evicting `unit` would give back now."""
        return freed_by(self.cohort, self.class_name, unit, self.held[unit.namespace])

    def took(self, unit: Unit, gives: Fraction) -> None:
        """Note that `unit` was evicted, giving back `gives`."""
        self.freed += gives
        self.held[unit.namespace] -= unit.charge


def reclaim_plan(
    cohort: Cohort,
    claimant: str,
    class_name: str,
    need: Fraction,
    usage: Usage,
    units: Sequence[Unit],
) -> list[Unit]:
    """Return the first of `units` (in order) whose eviction gives back at least `need`
    to the pool, or none at all if they cannot: an eviction that cannot make the waiting
    pod fit would only stop work. Each member gives back only what it draws."""
    if need <= 0:
        return []
    giving = Giving(cohort, class_name, usage)
    chosen: list[Unit] = []
    for unit in units:
        if giving.freed >= need:
            break
        if gives := giving.gives(unit):
            chosen.append(unit)
            giving.took(unit, gives)
    return chosen if giving.freed >= need else []


def settled(usage: Usage, class_name: str, pods: Mapping[str, Sequence[Held]]) -> Usage:
    """Return what each member will hold of a class once its pods being deleted are gone:
    a reclaim is planned on it, so that room already on its way back (evictions of an
    earlier turn, or of a leader that died) is never taken twice."""
    result = {ns: dict(classes) for ns, classes in usage.items()}
    for namespace, held in pods.items():
        gone = sum((p.charge for p in held if p.ending), ZERO)
        if gone:
            classes = result.setdefault(namespace, {})
            classes[class_name] = max(ZERO, classes.get(class_name, ZERO) - gone)
    return result


@dataclass(frozen=True, slots=True)
class Entry:
    """What a namespace's entry in `quotas.yaml` says of its cohort."""

    cohort: str | None
    limits: Mapping[str, Fraction]
    borrow: Mapping[str, Fraction]
    lend: Mapping[str, Fraction]
    reclaim: Reclaim | None


def problems(entries: Mapping[str, Entry]) -> list[tuple[tuple[str, ...], str]]:
    """List (path of the key, problem) for each way the entries' cohorts contradict
    themselves or their limits."""
    found: list[tuple[tuple[str, ...], str]] = []
    members: dict[str, list[str]] = {}
    for namespace, entry in entries.items():
        at = ("namespaces", namespace)
        if entry.cohort is None:
            for key, given in (("borrow", entry.borrow), ("lend", entry.lend)):
                if given:
                    found.append(
                        ((*at, key), f"{key} needs a cohort: add `cohort: <name>` to {namespace}")
                    )
            if entry.reclaim is not None:
                why = f"reclaim needs a cohort: add `cohort: <name>` to {namespace}"
                found.append(((*at, "reclaim"), why))
            continue
        members.setdefault(entry.cohort, []).append(namespace)
        for key, given in (("borrow", entry.borrow), ("lend", entry.lend)):
            for class_name, amount in given.items():
                where = (*at, key, class_name)
                if class_name == "*":
                    found.append(
                        (where, f'{key} is per class: "*" is not a class (name the class)')
                    )
                elif class_name not in entry.limits:
                    found.append(
                        (
                            where,
                            f"{namespace} has no {class_name} limit, so it holds as many as it "
                            f"likes and {'borrows' if key == 'borrow' else 'lends'} nothing: "
                            f"give it a limit ({class_name}: 0 to only borrow)",
                        )
                    )
                elif key == "lend" and amount > entry.limits[class_name]:
                    found.append(
                        (
                            where,
                            f"lends {_shown(amount)}, more than its {class_name} limit of "
                            f"{_shown(entry.limits[class_name])}: a namespace lends only its "
                            "own quota",
                        )
                    )
        cap = entry.limits.get("*")
        if cap is not None:
            for class_name, amount in entry.borrow.items():
                nominal = entry.limits.get(class_name)
                if class_name == "*" or nominal is None:
                    continue
                if nominal + amount > cap:
                    found.append(
                        (
                            (*at, "*"),
                            f'"*": {_shown(cap)} is below {class_name}: {_shown(nominal)} plus '
                            f"borrow {_shown(amount)}: it could never borrow all of that; "
                            f'raise "*" to {_shown(nominal + amount)} or lower borrow',
                        )
                    )
    for name, namespaces in members.items():
        if len(namespaces) == 1:
            found.append(
                (
                    ("namespaces", namespaces[0], "cohort"),
                    f"cohort {name!r} has no other member: a cohort shares idle quota among "
                    "two namespaces or more",
                )
            )
    return found


def build(entries: Mapping[str, Entry]) -> dict[str, Cohort]:
    """Return the cohorts of valid entries (`problems` found none), by name."""
    grouped: dict[str, dict[str, Member]] = {}
    for namespace, entry in entries.items():
        if entry.cohort is None:
            continue
        nominal = {c: v for c, v in entry.limits.items() if c != "*"}
        grouped.setdefault(entry.cohort, {})[namespace] = Member(
            namespace, nominal, dict(entry.borrow), dict(entry.lend), entry.reclaim or "never"
        )
    return {name: Cohort(name, members) for name, members in sorted(grouped.items())}


def _shown(amount: Fraction) -> str:
    return format_amount(amount)
