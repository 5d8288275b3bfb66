"""GPU-hours: what each namespace's GPU pods used over time, and the budgets that cap it.

A quota caps how many GPUs a namespace holds at once; a budget caps how long it holds them:
`a100: 500h/7d` is 500 GPU-hours of the class in any 7 days. Everything here is exact
arithmetic on whole seconds (Kubernetes' timestamps have no finer grain) and `Fraction`
shares, and pure: the shell hands in the runs it saw and the time it is.

- A `Run` is one GPU pod's time on its node: from its first container's start to its last
  container's end (or now), charged its admitted share. Pending and gated time is free.
- A namespace's `Hours` is the usage its runs have been counted into, up to its
  `checkpoint`: GPU-seconds per class, in buckets of time, and a total that never forgets.
  `accrue` counts every run's part between the last checkpoint and now, and only that part,
  so counting the same run twice, or counting again after a crash, never counts a second
  twice. What a namespace has used by now is its record accrued to now, unstored.
- A record stays small by construction (`Tiers`, `compact`, `fit`): narrow buckets for the
  namespace's own longest window, wider ones further back, and, should its text still pass
  `RECORD_MAX_BYTES`, its oldest buckets merged into wider ones until it fits. A merge
  only ever makes a window count more, never less.
- `judge_budget` refuses a new pod of a class whose budget is spent in the window that ends
  now, and says when enough of it leaves the window.
"""

from __future__ import annotations

import bisect
import heapq
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from policies.quota.budget import DAY, HOUR, Budget, duration
from policies.quota.judge import NEARLY_FULL, QuotaVerdict
from policies.quota.quotas import ALL_CLASSES, Mode, budgets_on

# The latest moment a record may name: the year 5138. Later ones (a hand-edited record) are
# refused when it is read, and could not be said as a date.
LATEST = 10**11


def timestamp(seconds: int) -> str:
    """Say a moment as Kubernetes does (RFC 3339, UTC, whole seconds)."""
    return datetime.fromtimestamp(min(max(seconds, 0), LATEST), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(value: object) -> int | None:
    """Read a Kubernetes timestamp (`2026-11-27T01:19:06Z`) as seconds; None if it is not one."""
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return int(moment.timestamp())


# --- Runs ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    """One GPU pod's time on its node: `started` to `ended` (None: still running)."""

    namespace: str
    class_name: str
    share: Fraction
    started: int
    ended: int | None = None
    # The pod's name, for the reports.
    pod: str = ""


_CONTAINER_STATUSES = ("initContainerStatuses", "containerStatuses")


def run_times(pod: Mapping[str, Any], *, ended_phase: bool) -> tuple[int | None, int | None]:
    """Return when a pod's first container started and, if the pod has ended (`ended_phase`),
    when its last one finished, read from the pod's status; None where it says nothing.

    A pod whose containers never started (Pending, gated, pulling its image) ran for none.
    A pod that ended always has an end, read from its status alone (see below).

    The kubelet shows a container's current run (`state`) and the one before it
    (`lastState`), no earlier one: once a container has restarted twice, its first start is
    gone from the status. The pod's own start (`status.startTime`, written when its node
    took it, before any container ran) then stands in for it: never later than the truth, so
    such a pod is counted at most its start-up time early, never late.
    """
    status = pod.get("status")
    if not isinstance(status, Mapping):
        return None, None
    starts: list[int] = []
    finishes: list[int] = []
    hidden = False
    for key in _CONTAINER_STATUSES:
        statuses = status.get(key)
        if not isinstance(statuses, list):
            continue
        for entry in statuses:
            shown = 0
            for state in _states(entry):
                if (start := parse_timestamp(state.get("startedAt"))) is not None:
                    starts.append(start)
                    shown += 1
                if (finish := parse_timestamp(state.get("finishedAt"))) is not None:
                    finishes.append(finish)
            hidden = hidden or _first_start_hidden(entry, shown)
    if hidden and (standing_in := _pod_start(pod, status)) is not None:
        starts.append(standing_in)
    started = min(starts) if starts else None
    if not ended_phase or started is None:
        return started, None
    if not finishes:
        # A pod that ended without its containers saying when (its node lost): the last
        # change of its conditions, else its start. Never the moment it is seen, which
        # would move its end at every look and count it again after each checkpoint.
        conditions = status.get("conditions")
        changes = [
            moment
            for condition in (conditions if isinstance(conditions, list) else ())
            if isinstance(condition, Mapping)
            and (moment := parse_timestamp(condition.get("lastTransitionTime"))) is not None
        ]
        finishes = changes or [started]
    return started, max(started, max(finishes))


def _first_start_hidden(entry: object, shown: int) -> bool:
    """Tell whether a container status has run the container more often than its states
    show starts: it restarted, and its first start is no longer shown."""
    if not isinstance(entry, Mapping):
        return False
    restarts = entry.get("restartCount")
    if not isinstance(restarts, int) or isinstance(restarts, bool):
        return False
    return restarts >= 1 and restarts + 1 > shown


def _pod_start(pod: Mapping[str, Any], status: Mapping[str, Any]) -> int | None:
    """Return a moment no later than any of a pod's containers started: the pod's start, or,
    if its status has none, its creation."""
    started = parse_timestamp(status.get("startTime"))
    if started is not None:
        return started
    metadata = pod.get("metadata")
    return (
        parse_timestamp(metadata.get("creationTimestamp"))
        if isinstance(metadata, Mapping)
        else None
    )


def _states(entry: object) -> Iterator[Mapping[str, Any]]:
    if not isinstance(entry, Mapping):
        return
    for which in ("state", "lastState"):
        states = entry.get(which)
        if isinstance(states, Mapping):
            for state in states.values():
                if isinstance(state, Mapping):
                    yield state


# --- Hours: the counted usage of one namespace --------------------------------------------


@dataclass(frozen=True, slots=True)
class Bucket:
    """GPU-seconds used from `start` for `width` seconds."""

    start: int
    width: int
    seconds: Fraction

    @property
    def end(self) -> int:
        """Return the moment this bucket's time ends."""
        return self.start + self.width


@dataclass(frozen=True, slots=True)
class ClassHours:
    """A class's counted usage in one namespace: all of it, and by time."""

    total: Fraction = Fraction(0)
    buckets: tuple[Bucket, ...] = ()  # in time order, not overlapping

    def within(self, begin: int) -> Fraction:
        """Return the GPU-seconds of the buckets that reach past `begin` (a bucket that
        straddles it counts whole: a budget errs toward refusing, never toward more)."""
        return sum((b.seconds for b in self.buckets if b.end > begin), Fraction(0))


@dataclass(frozen=True, slots=True)
class Hours:
    """A namespace's counted GPU usage: every run counted up to `checkpoint`."""

    checkpoint: int = 0
    classes: Mapping[str, ClassHours] = field(default_factory=dict)

    def total(self, class_name: str) -> Fraction:
        """Return every GPU-second of a class counted so far."""
        entry = self.classes.get(class_name)
        return entry.total if entry is not None else Fraction(0)

    def within(self, class_name: str, begin: int) -> Fraction:
        """Return the counted GPU-seconds of a class (`*`: of all) that reach past `begin`."""
        if class_name == ALL_CLASSES:
            return sum((c.within(begin) for c in self.classes.values()), Fraction(0))
        entry = self.classes.get(class_name)
        return entry.within(begin) if entry is not None else Fraction(0)


def _spread(begin: int, end: int, width: int) -> Iterator[tuple[int, int]]:
    """Cut [begin, end) at the multiples of `width`: each piece's bucket start and length."""
    at = begin
    while at < end:
        start = at - at % width
        stop = min(end, start + width)
        yield start, stop - at
        at = stop


def accrue(hours_: Hours, runs: Iterable[Run], *, now: int, width: int, since: int = 0) -> Hours:
    """Count each run's time between the last checkpoint and `now`; the checkpoint moves to
    `now`. A clock that stepped back (`now` before the checkpoint) counts nothing.

    A run is counted from `max(started, checkpoint)`, so a pod that ran while nobody counted
    (gpuadm down) is counted from its own start once it is seen, and nothing is counted twice;
    and not before `since`, which bounds the buckets a pod that started long ago (or says so)
    can fill.
    """
    if now <= hours_.checkpoint:
        return hours_
    # Runs that ran over the same span add their shares first: every pod running since the
    # checkpoint spans the same seconds. Shares are summed as integers per denominator, and
    # made fractions once per span, so that 10,000 runs cost 10,000 integer additions.
    spans: dict[tuple[str, int, int], dict[int, int]] = {}
    checkpoint = max(hours_.checkpoint, since)
    for run in runs:
        begin = run.started if run.started > checkpoint else checkpoint
        end = now if run.ended is None or run.ended > now else run.ended
        if end <= begin:
            continue
        by_denominator = spans.setdefault((run.class_name, begin, end), {})
        share = run.share
        denominator = share.denominator
        by_denominator[denominator] = by_denominator.get(denominator, 0) + share.numerator
    added: dict[str, dict[int, Fraction]] = {}
    for (class_name, begin, end), by_denominator in spans.items():
        shares = _sum_shares(by_denominator)
        by_start = added.setdefault(class_name, {})
        for start, length in _spread(begin, end, width):
            by_start[start] = by_start.get(start, Fraction(0)) + shares * length
    classes = dict(hours_.classes)
    for class_name, by_start in added.items():
        classes[class_name] = _add(classes.get(class_name, ClassHours()), by_start, width)
    return Hours(now, classes)


def _sum_shares(by_denominator: Mapping[int, int]) -> Fraction:
    """Return the sum of shares given as the sum of their numerators per denominator."""
    return sum(
        (Fraction(numerators, denominator) for denominator, numerators in by_denominator.items()),
        Fraction(0),
    )


def _add(entry: ClassHours, by_start: Mapping[int, Fraction], width: int) -> ClassHours:
    buckets = {b.start: b for b in entry.buckets}
    for start, seconds in by_start.items():
        _merge_into(buckets, Bucket(start, width, seconds))
    ordered = tuple(sorted(buckets.values(), key=lambda b: b.start))
    return ClassHours(entry.total + sum(by_start.values(), Fraction(0)), ordered)


def _merge_into(buckets: dict[int, Bucket], bucket: Bucket) -> None:
    """Add a bucket to those by start; one of the same start becomes one that spans both,
    so that no usage is ever said to have ended sooner than it did."""
    old = buckets.get(bucket.start)
    if old is None:
        buckets[bucket.start] = bucket
    else:
        end = max(old.end, bucket.end)
        buckets[bucket.start] = Bucket(
            bucket.start, end - bucket.start, old.seconds + bucket.seconds
        )


# --- Keeping a record small ---------------------------------------------------------------

# Buckets narrower than an hour are kept for the namespace's longest window, but no more than
# this many of them per class: with buckets of 60 s, 16 h 40 min.
FINE_BUCKETS = 1000
# Hour-wide buckets are kept for the longest window, and this long at least (a budget
# shortened for a while, then lengthened again, finds its hours still there) ...
HOURLY_AT_LEAST = 8 * DAY
# ... but no longer than this: day-wide ones after it.
HOURLY_AT_MOST = 31 * DAY
# Showback keeps a month and a bit of usage, whatever the budgets.
KEEP_AT_LEAST = 35 * DAY
# The widths a bucket is merged up through: an hour, a day, then doubling (`fit`) to 512
# days, more than a record keeps (366 days and one). The widths a leader may be given
# (`serve --gpu-hours-bucket-seconds`) all divide an hour, so each width divides the next,
# and merged buckets never overlap.
WIDTHS = (HOUR, DAY, *(DAY * 2**k for k in range(1, 10)))
MAX_BUCKET_WIDTH = WIDTHS[-1]


@dataclass(frozen=True, slots=True)
class Tiers:
    """How long a namespace's record keeps its buckets at each width: `width` wide for
    `fine_for`, then an hour wide until `hourly_for`, then a day wide until `keep_for`;
    older ones are dropped (the total keeps them)."""

    width: int
    fine_for: int
    hourly_for: int
    keep_for: int


def tiers(longest_window: int, width: int) -> Tiers:
    """Return the tiers of a namespace's record, from its own longest budget window (0: it
    has no budget) and the width of the buckets the leader counts into.

    A window of at most `fine_for` counts only buckets of `width` (none merged); one of at
    most `hourly_for`, at most one bucket of an hour where it begins; a longer one, one of a
    day. A bucket straddling a window's start counts whole (`ClassHours.within`), so a
    window may count up to that bucket's width of usage from before it, never less.
    """
    fine_for = min(longest_window + width, FINE_BUCKETS * width)
    hourly = min(max(longest_window, HOURLY_AT_LEAST) + HOUR, HOURLY_AT_MOST)
    hourly_for = max(fine_for, hourly)
    keep_for = max(KEEP_AT_LEAST, longest_window + DAY, hourly_for + DAY)
    return Tiers(width, fine_for, hourly_for, keep_for)


def compact(hours_: Hours, *, now: int, tiers: Tiers) -> Hours:
    """Merge buckets into hour-wide ones once the hour they fall in ended more than
    `tiers.fine_for` ago, into day-wide ones once their day ended more than
    `tiers.hourly_for` ago, and drop buckets that ended more than `tiers.keep_for` ago (the
    total keeps them). No window of at most `fine_for` counts a merged bucket, so none
    counts differently after a merge; a longer one can only count more."""
    steps = ((HOUR, tiers.fine_for), (DAY, tiers.hourly_for))
    classes = {}
    for class_name, entry in hours_.classes.items():
        merged: dict[int, Bucket] = {}
        for bucket in entry.buckets:
            if bucket.end <= now - tiers.keep_for:
                continue
            for width, after in steps:
                parent = bucket.start - bucket.start % width
                if bucket.width < width and parent + width <= now - after:
                    bucket = Bucket(parent, max(width, bucket.end - parent), bucket.seconds)
            _merge_into(merged, bucket)
        ordered = tuple(sorted(merged.values(), key=lambda b: b.start))
        classes[class_name] = ClassHours(entry.total, ordered)
    return Hours(hours_.checkpoint, classes)


def fit(hours_: Hours, *, max_bytes: int) -> Hours:
    """Merge buckets into wider ones until the record's text (`encode_hours`, as compact
    JSON) takes at most `max_bytes`, or no merge is left.

    A bucket is merged into the bucket of the next width of `WIDTHS` that holds it, with
    every other bucket of its class in that span. The merges whose merged bucket ends
    soonest come first, so that the windows that end now, whose counts matter most, are
    touched last: first the time no budget's window reaches, then the start of the longest.
    Only buckets that end by the record's checkpoint are merged: the next checkpoint adds
    after them. A merged bucket counts whole in any window it reaches into, so a window
    counts at most the usage of its widest straddling bucket more, never less.
    """
    size = record_bytes(hours_)
    if size <= max_bytes:
        return hours_
    starts = {
        name: sorted(b.start for b in entry.buckets) for name, entry in hours_.classes.items()
    }
    by_start = {name: {b.start: b for b in entry.buckets} for name, entry in hours_.classes.items()}
    merges: list[tuple[int, str, int, int]] = []
    for name, entry in hours_.classes.items():
        for each in entry.buckets:
            _offer(merges, name, each, hours_.checkpoint)
    while size > max_bytes and merges:
        end, name, start, width = heapq.heappop(merges)
        offered = by_start[name].get(start)
        if offered is None or offered.width != width:
            continue  # merged into a wider one since it was offered
        wider = next(w for w in WIDTHS if w > width)
        parent = start - start % wider
        ordered = starts[name]
        first = bisect.bisect_left(ordered, parent)
        last = bisect.bisect_left(ordered, end)
        members = [by_start[name].pop(at) for at in ordered[first:last]]
        span = max(end, *(m.end for m in members)) - parent
        if span > MAX_BUCKET_WIDTH:  # a bucket of a hand-edited record, out of line
            for member in members:
                by_start[name][member.start] = member
            continue
        merged = Bucket(parent, span, sum((m.seconds for m in members), Fraction(0)))
        ordered[first:last] = [parent]
        by_start[name][parent] = merged
        # Each bucket's text, and the commas between them, go; the merged one's comes.
        size += _bucket_bytes(merged) - sum(_bucket_bytes(m) for m in members) - (len(members) - 1)
        _offer(merges, name, merged, hours_.checkpoint)
    classes = {
        name: ClassHours(entry.total, tuple(by_start[name][at] for at in starts[name]))
        for name, entry in hours_.classes.items()
    }
    return Hours(hours_.checkpoint, classes)


def _offer(merges: list[tuple[int, str, int, int]], name: str, bucket: Bucket, by: int) -> None:
    """Offer a bucket's merge into the next width, if there is one and it ends by `by`."""
    wider = next((w for w in WIDTHS if w > bucket.width), None)
    if wider is None:
        return
    end = bucket.start - bucket.start % wider + wider
    if end <= by:
        heapq.heappush(merges, (end, name, bucket.start, bucket.width))


def used_in_windows(
    hours_: Hours, budgets: Mapping[str, Budget], *, now: int
) -> dict[str, Fraction]:
    """Return, for each budget (a class or `*`), the GPU-seconds its window ending now holds
    in `hours_`."""
    return {key: hours_.within(key, now - budget.window) for key, budget in budgets.items()}


def running_shares(runs: Iterable[Run], *, now: int) -> dict[str, Fraction]:
    """Return, per class, the GPUs of the runs still running at `now`: the GPU-seconds
    their class gains each second."""
    by_class: dict[str, dict[int, int]] = {}
    for run in runs:
        if run.started <= now and (run.ended is None or run.ended > now):
            by_denominator = by_class.setdefault(run.class_name, {})
            share = run.share
            denominator = share.denominator
            by_denominator[denominator] = by_denominator.get(denominator, 0) + share.numerator
    return {class_name: _sum_shares(shares) for class_name, shares in by_class.items()}


# --- Judgement ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spending:
    """What a namespace has used, and is using, as a budget judgement reads it."""

    # Counted up to now: the record, and what the runs used since its checkpoint
    # (`accrue`, not stored).
    hours: Hours
    # GPUs running now, per class.
    rates: Mapping[str, Fraction]
    # What `used` answered, by (key, start of the window): a spending is judged by many
    # admissions within its second.
    _used: dict[tuple[str, int], Fraction] = field(default_factory=dict, compare=False, repr=False)

    def used(self, key: str, *, now: int, window: int) -> Fraction:
        """Return the GPU-seconds of a class (`*`: of all) used in the window ending now."""
        begin = now - window
        found = self._used.get((key, begin))
        if found is None:
            found = self._used[key, begin] = self.hours.within(key, begin)
        return found

    def rate(self, key: str) -> Fraction:
        """Return the GPUs of a class (`*`: of all) running now."""
        if key == ALL_CLASSES:
            return sum(self.rates.values(), Fraction(0))
        return self.rates.get(key, Fraction(0))

    def frees_at(self, key: str, budget: Budget, *, now: int) -> int | None:
        """Return the first moment at which the window holds less than the budget again, if
        the pods running now keep running; None if only their ending can free it."""
        buckets = (
            [b for c in self.hours.classes.values() for b in c.buckets]
            if key == ALL_CLASSES
            else list(self.hours.classes.get(key, ClassHours()).buckets)
        )
        rate = self.rate(key)
        used = self.used(key, now=now, window=budget.window)
        leaving = sorted((b for b in buckets if b.end > now - budget.window), key=lambda b: b.end)
        for bucket in leaving:
            moment = bucket.end + budget.window
            used -= bucket.seconds
            if used + rate * (moment - now) < budget.gpu_seconds:
                return moment
        return None


def judge_budget(
    *,
    namespace: str,
    class_name: str,
    budgets: Mapping[str, Budget],
    spending: Spending,
    now: int,
    mode: Mode = "enforce",
) -> QuotaVerdict | None:
    """Judge whether a namespace may start another pod of a class under its GPU-hour budgets.

    A budget is spent when the window that ends now holds as many GPU-seconds as it allows;
    then new pods of the class are refused (`enforce`), admitted with a warning (`warn`), or
    held in line (`queue`: the caller holds them). Pods already running are never stopped.
    Above 90% of a budget an admitted pod carries a warning. None: no budget applies.
    """
    keys = budgets_on(class_name, budgets)
    if not keys:
        return None
    warnings: list[str] = []
    for key in keys:
        budget = budgets[key]
        used = spending.used(key, now=now, window=budget.window)
        label = class_name if key == class_name else 'all classes ("*")'
        if used >= budget.gpu_seconds:
            message = spent_message(namespace, label, used, budget, spending, key, now)
            if mode == "warn":
                warning = f"{message} (quota mode is warn: admitted, but enforce would deny)"
                return QuotaVerdict(
                    True, message, (*warnings, warning), would_deny=True, exceeded=(key,)
                )
            return QuotaVerdict(False, message, exceeded=(key,))
        if budget.gpu_seconds and used / budget.gpu_seconds > NEARLY_FULL:
            percent = int(used * 100 / budget.gpu_seconds)
            warnings.append(
                f'namespace "{namespace}": {label} GPU-hour budget is {percent}% used '
                f"({budget.say(used)} of {budget} in the last {duration(budget.window)})"
            )
    return QuotaVerdict(True, None, tuple(warnings))


def spent_message(
    namespace: str,
    label: str,
    used: Fraction,
    budget: Budget,
    spending: Spending,
    key: str,
    now: int,
) -> str:
    """Say that a budget is spent, with the numbers and when enough of it frees."""
    frees = spending.frees_at(key, budget, now=now)
    if not budget.gpu_seconds:
        when = "a budget of 0 allows none"
    elif frees is not None:
        when = f"enough frees at {timestamp(frees)}"
    else:
        when = "it frees only as the class's running pods end"
    return (
        f'namespace "{namespace}": {label} GPU-hour budget spent: used {budget.say(used)} of '
        f"{budget.say(budget.gpu_seconds)} in the last {duration(budget.window)}; {when}; "
        "running pods are not stopped"
    )


# --- The record's text --------------------------------------------------------------------


# More than a record of the longest window in the narrowest buckets gpuadm writes holds.
MAX_BUCKETS = 100_000
# The most a record's text may take: half of what the apiserver lets a ConfigMap hold
# (1 MiB), so that a record never nears the limit, whatever its namespace ran. `fit` keeps
# a record within it; the store checks each text against it before writing it.
RECORD_MAX_BYTES = 512 * 1024


class RecordError(ValueError):
    """A stored GPU-hours record that cannot be read back."""


def encode_hours(hours_: Hours) -> dict[str, Any]:
    """Return a record as JSON-ready data: amounts as exact fractions (`"7/3"`)."""
    return {
        "checkpoint": hours_.checkpoint,
        "classes": {
            name: {
                "total": str(entry.total),
                "buckets": [[b.start, b.width, str(b.seconds)] for b in entry.buckets],
            }
            for name, entry in sorted(hours_.classes.items())
        },
    }


def record_bytes(hours_: Hours) -> int:
    """Return how many bytes `encode_hours` of a record takes as compact JSON."""
    size = len(f'{{"checkpoint":{hours_.checkpoint},"classes":{{}}}}')
    for name, entry in hours_.classes.items():
        buckets = entry.buckets
        size += len(json.dumps(name, ensure_ascii=False).encode())
        size += len(f':{{"total":"{entry.total}","buckets":[]}}')
        size += sum(_bucket_bytes(b) for b in buckets) + max(len(buckets) - 1, 0)
    return size + max(len(hours_.classes) - 1, 0)


def _bucket_bytes(bucket: Bucket) -> int:
    """Return the bytes of a bucket's text: `[start,width,"seconds"]`."""
    return len(str(bucket.start)) + len(str(bucket.width)) + len(str(bucket.seconds)) + 6


def decode_hours(data: object) -> Hours:
    """Read a record written by `encode_hours`; raise `RecordError` saying what is wrong."""
    if not isinstance(data, Mapping):
        raise RecordError("the record is not an object")
    checkpoint = data.get("checkpoint")
    classes = data.get("classes")
    if (
        not isinstance(checkpoint, int)
        or isinstance(checkpoint, bool)
        or not 0 <= checkpoint <= LATEST
    ):
        raise RecordError(f"checkpoint {checkpoint!r} is not a time in seconds")
    if not isinstance(classes, Mapping):
        raise RecordError("classes is not an object")
    decoded: dict[str, ClassHours] = {}
    count = 0
    for name, entry in classes.items():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("buckets"), list):
            raise RecordError(f"class {name!r} has no list of buckets")
        count += len(entry["buckets"])
        if count > MAX_BUCKETS:
            raise RecordError(f"it has more than {MAX_BUCKETS} buckets")
        buckets = tuple(_bucket(name, raw) for raw in entry["buckets"])
        decoded[str(name)] = ClassHours(_amount(name, entry.get("total")), buckets)
    return Hours(checkpoint, decoded)


def _bucket(name: object, raw: object) -> Bucket:
    if (
        not isinstance(raw, list)
        or len(raw) != 3
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in raw[:2])
        or not 0 <= raw[0] <= LATEST
        or not 0 < raw[1] <= MAX_BUCKET_WIDTH
    ):
        raise RecordError(f"class {name!r}: bucket {raw!r} is not [start, width, seconds]")
    return Bucket(raw[0], raw[1], _amount(name, raw[2]))


# What `encode_hours` writes of an amount: a whole number or a fraction, never an exponent,
# whose reading could take minutes ("1e999999999").
_AMOUNT = re.compile(r"-?[0-9]{1,40}(/[0-9]{1,40})?")


def _amount(name: object, raw: object) -> Fraction:
    if not isinstance(raw, str) or not _AMOUNT.fullmatch(raw):
        shown = repr(raw) if len(repr(raw)) <= 64 else repr(raw)[:60] + "..."
        raise RecordError(f"class {name!r}: {shown} is not an amount of GPU-seconds")
    try:
        amount = Fraction(raw)
    except ZeroDivisionError:
        raise RecordError(f"class {name!r}: {raw!r} is not an amount of GPU-seconds") from None
    if amount < 0:
        raise RecordError(f"class {name!r}: {raw!r} is negative")
    return amount
