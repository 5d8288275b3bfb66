"""GPU-hours across replicas: counted by the leader into records, read by every replica.

Every replica keeps the runs of GPU pods its pod watch shows (`runs.RunIndex`) and reads the
records every `checkpoint_seconds`. The leader, at each checkpoint, counts each namespace's
runs into its record, from the record's last checkpoint to now (`policies.quota.gpu_hours.accrue`),
keeps the record small (`compact`, `fit`), and writes it with the version it read. So:

- what a namespace used is its record plus what its runs used since the record's checkpoint,
  and every replica computes the same from the same pods, whether its copy of the record is
  the newest or one checkpoint old;
- a leader that dies between checkpoints loses nothing the next leader's pod watch still
  shows: the next checkpoint counts from the record's. Lost is only the time of a pod that
  ended and was deleted while no replica watched, since the last checkpoint: at most one
  interval of it;
- a write refused because the record moved (a second leader for a moment) counts nothing:
  the next checkpoint reads the record again.

What the ledger cannot vouch for, it does not judge: the namespace's budgeted classes admit
no pods, saying why, as before the records are read. That is a record that cannot be read
(never overwritten, never read as zero), and a record left uncounted for longer than
`stale_seconds` while the namespace's pods ran (the leader cannot write it, or no replica
leads). A write that fails is an error in the log, `gpuadm_gpu_hours_record_write_failures`,
and, with every other problem of a record, `gpuadm_gpu_hours_record_problems` and a notice
on /readyz that leaves the replica ready: every replica sees the same records, so failing
readiness would take every replica, and all admission, down with them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING

from policies.quota.budget import Budget
from policies.quota.gpu_hours import (
    RECORD_MAX_BYTES,
    Hours,
    RecordError,
    Spending,
    Tiers,
    accrue,
    compact,
    fit,
    judge_budget,
    running_shares,
    tiers,
    timestamp,
    used_in_windows,
)
from policies.quota.judge import QuotaVerdict
from policies.quota.quotas import ALL_CLASSES, QuotaConfig, budgets_on
from webhook.config.snapshot import ConfigSnapshot
from webhook.gpu_hours.runs import RunIndex
from webhook.gpu_hours.store import HoursStore, Moved, RecordTooLarge, Stored
from webhook.kube.errors import KubeError
from webhook.kube.objects import HOURS_RECORD_LABEL, hours_record_name
from webhook.observe.readings import HoursReading

if TYPE_CHECKING:
    from webhook.observe.metrics import Metrics

log = logging.getLogger("gpuadm.gpu_hours")

CHECKPOINT_SECONDS = 60.0
BUCKET_SECONDS = 3600
# A record's problem is logged again this often while it lasts.
RELOG_SECONDS = 600.0
# A checkpoint further ahead of this replica's clock than this is not believed: every run
# would go uncounted until the clock caught up.
MAX_SKEW_SECONDS = 300
# A record is stale once this many checkpoints, and a leader's handover, have passed since
# its checkpoint while its namespace's pods ran: a healthy leader counts every interval.
STALE_CHECKPOINTS = 3
# How long a new leader may take to count after the last one stopped: two Lease durations
# (it takes the Lease over once it has gone a duration unrenewed, trying a fifth as often).
HANDOVER_SECONDS = 30.0

# Namespaces whose spending is kept between judgements, at most (a few KiB each).
MAX_KEPT_SPENDINGS = 10_000
# Namespaces named in the /readyz notice, at most; the metric has every one.
NOTICE_NAMESPACES = 5

NOT_READ = "gpuadm has not read the GPU-hour records yet, so it cannot judge the budget; retry"


class HoursLedger:
    """One replica's GPU-hours: its runs, its copy of the records, and the leader's
    checkpoints."""

    def __init__(
        self,
        runs: RunIndex,
        store: HoursStore | None,
        *,
        pods_ready: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.time,
        checkpoint_seconds: float = CHECKPOINT_SECONDS,
        bucket_seconds: int = BUCKET_SECONDS,
        handover_seconds: float = HANDOVER_SECONDS,
        metrics: Metrics | None = None,
    ) -> None:
        """Count `runs` into records kept in `store` (None: standalone, with no pods and no
        records). `pods_ready` says whether the pod watch is in sync; `handover_seconds` is
        how long a new leader may take to count after the last one (two Lease durations)."""
        self.runs = runs
        self.store = store
        self.pods_ready = pods_ready
        self.clock = clock
        self.checkpoint_seconds = checkpoint_seconds
        self.bucket_seconds = bucket_seconds
        self.stale_seconds = int(STALE_CHECKPOINTS * checkpoint_seconds + handover_seconds)
        self.metrics = metrics
        # A replica judges a record stale only over time it has watched the pods itself:
        # at a start, the leader needs a moment to count what ran while no one did.
        self.since = int(clock())
        self._records: dict[str, Stored] = {}
        self.read_once = store is None
        # When each namespace's unreadable record, and its failed write, were last logged.
        self._logged: dict[str, float] = {}
        self._logged_failure: dict[str, float] = {}
        # Per namespace, its spending as last worked out, and from what (`_work_out`).
        self._spent: dict[
            str, tuple[tuple[int, Stored | None, Tiers], Spending | RecordError, str | None]
        ] = {}
        # Namespaces whose record this replica, leading, last failed to write, and why.
        self._unwritten: dict[str, str] = {}
        # Each namespace's record problems as of the last read or checkpoint (`_review`).
        self._problems: dict[str, list[str]] = {}
        runs.counted_to = self._counted_to

    # --- every replica --------------------------------------------------------------------

    async def read_forever(self, progress: Callable[[], None]) -> None:
        """Read the records every `checkpoint_seconds`; raise an apiserver error, for the
        supervisor to retry."""
        while True:
            await self.read()
            progress()
            await asyncio.sleep(self.checkpoint_seconds)

    async def read(self) -> None:
        """Read every record again, and drop runs that every checkpoint has counted."""
        if self.store is None:
            return
        records = await self.store.read_all(self._records)
        now = int(self.clock())
        for namespace, stored in records.items():
            believed = _believed(stored, now)
            if isinstance(believed, RecordError):
                self._log_unreadable(namespace, believed)
        self._records = records
        self.read_once = True
        self.runs.prune()
        self._review(now)

    def _counted_to(self, namespace: str) -> int:
        """Return the moment a namespace's record counts its runs up to (0: none, or a
        record not believed, whose runs must stay until one is)."""
        counted = _believed(self._records.get(namespace), int(self.clock()))
        return counted.checkpoint if isinstance(counted, Hours) else 0

    def spending(self, namespace: str, now: int, quotas: QuotaConfig) -> Spending | RecordError:
        """Return what a namespace used by now (its record, and its runs since the record's
        checkpoint counted as the next checkpoint will), or why its record cannot be read."""
        return self._work_out(namespace, now, quotas)[0]

    def _work_out(
        self, namespace: str, now: int, quotas: QuotaConfig
    ) -> tuple[Spending | RecordError, str | None]:
        """Return a namespace's spending, and why its record is stale (None: it is not)."""
        stored = self._records.get(namespace)
        # Worked out once a second at most (while the record stays the same): a burst of
        # creates, the releaser and a scrape share it, and a namespace of 10,000 GPU pods
        # costs one pass over them a second, not one per admission. A run that starts or
        # ends within the second is judged from the next one.
        shape = self._tiers(quotas, namespace)
        known = self._spent.get(namespace)
        if known is not None:
            (at, known_stored, known_shape), kept, stale = known
            if at == now and known_stored is stored and known_shape == shape:
                return kept, stale
        hours = _believed(stored, now)
        spending: Spending | RecordError
        stale = None
        if isinstance(hours, RecordError):
            spending = hours
        else:
            counted = accrue(
                hours,
                self.runs.runs(namespace),
                now=now,
                width=self.bucket_seconds,
                since=now - shape.keep_for,
            )
            rates = running_shares(self.runs.runs(namespace), now=now)
            spending = Spending(counted, rates)
            stale = self._stale(namespace, stored, hours, now)
        if len(self._spent) > MAX_KEPT_SPENDINGS:
            self._spent.clear()
        self._spent[namespace] = ((now, stored, shape), spending, stale)
        return spending, stale

    def _stale(self, namespace: str, stored: Stored | None, hours: Hours, now: int) -> str | None:
        """Say why a namespace's record cannot be vouched for, if its pods ran in time that
        no checkpoint has counted for more than `stale_seconds`; else None. A namespace
        where nothing ran needs no checkpoint, however old its record's is."""
        begin = max(hours.checkpoint, self.since)
        end = now - self.stale_seconds
        if end <= begin or not any(
            run.started < end and (run.ended is None or run.ended > begin)
            for run in self.runs.runs(namespace)
        ):
            return None
        name = hours_record_name(namespace)
        record = (
            f"has not been written, though its pods have run for more than {self.stale_seconds} s"
            if stored is None
            else f"is counted only to {timestamp(hours.checkpoint)}, "
            f"{now - hours.checkpoint} s ago, though its pods ran since"
        )
        return (
            f'namespace "{namespace}": its GPU-hour record ConfigMap {name} {record}; gpuadm '
            "cannot vouch for what the namespace used, so it admits no pods of classes with a "
            "budget here until the record is written again; retry later"
        )

    def recorded_use(self, namespace: str, budgets: Mapping[str, Budget]) -> dict[str, Fraction]:
        """Return, for each budget (a class or `*`), the GPU-seconds the namespace's record
        counts in the budget's window ending now: as of the last checkpoint, not the seconds
        run since, so that what tenants are shown changes once per checkpoint. Nothing while
        the records are unread or the namespace's cannot be read."""
        if not (budgets and self.read_once):
            return {}
        stored = self._records.get(namespace)
        hours = Hours() if stored is None else stored.hours
        if isinstance(hours, RecordError):
            return {}
        return used_in_windows(hours, budgets, now=int(self.clock()))

    def judge(self, namespace: str, class_name: str, config: ConfigSnapshot) -> QuotaVerdict | None:
        """Judge a new pod of a class against its namespace's GPU-hour budgets (queue mode is
        judged as enforce: the caller holds what does not fit). None: no budget applies."""
        terms = config.quotas.terms(namespace)
        if not budgets_on(class_name, terms.budgets):
            return None
        if not (self.read_once and self.pods_ready()):
            return QuotaVerdict(False, NOT_READ)
        now = int(self.clock())
        spending, stale = self._work_out(namespace, now, config.quotas)
        if isinstance(spending, RecordError):
            return QuotaVerdict(
                False,
                f'namespace "{namespace}": its GPU-hour record {spending}; until then gpuadm '
                "admits no pods of classes with a budget here",
            )
        if stale is not None:
            return QuotaVerdict(False, stale)
        mode = "enforce" if terms.mode == "queue" else terms.mode
        return judge_budget(
            namespace=namespace,
            class_name=class_name,
            budgets=terms.budgets,
            spending=spending,
            now=now,
            mode=mode,
        )

    def held(
        self, namespace: str, classes: Iterable[str], config: ConfigSnapshot
    ) -> dict[str, str]:
        """Return the classes of a queue line that must keep waiting for their budget, each
        with why."""
        held = {}
        for class_name in classes:
            verdict = self.judge(namespace, class_name, config)
            if verdict is not None and not verdict.allowed:
                held[class_name] = verdict.message or "GPU-hour budget spent"
        return held

    def readings(self, quotas: QuotaConfig) -> list[HoursReading]:
        """Return, per namespace and class that used GPUs, its GPU-seconds, and what it used
        of its budget's window; a budget across classes as the class `*`, without
        GPU-seconds of its own (they are its classes'). None before the records are read:
        every run would be counted from its start."""
        if not self.read_once:
            return []
        now = int(self.clock())
        readings = []
        for namespace in sorted(set(self._records) | set(self.runs.namespaces())):
            spending = self.spending(namespace, now, quotas)
            if isinstance(spending, RecordError):
                continue
            budgets = quotas.budgets_for(namespace)
            for class_name in sorted(set(spending.hours.classes) | set(budgets)):
                budget = budgets.get(class_name)
                used = (
                    None
                    if budget is None
                    else float(spending.used(class_name, now=now, window=budget.window))
                )
                total = (
                    None if class_name == ALL_CLASSES else float(spending.hours.total(class_name))
                )
                readings.append(
                    HoursReading(
                        namespace,
                        class_name,
                        total,
                        used,
                        None if budget is None else float(budget.gpu_seconds),
                    )
                )
        return readings

    def notice(self) -> str | None:
        """Say which namespaces' records have a problem, for /readyz to show without failing
        (None: none has)."""
        if not self._problems:
            return None
        named = sorted(self._problems.items())
        said = ", ".join(
            f"{ns} ({', '.join(problems)})" for ns, problems in named[:NOTICE_NAMESPACES]
        )
        if len(named) > NOTICE_NAMESPACES:
            said += f" and {len(named) - NOTICE_NAMESPACES} more"
        return (
            f"GPU-hour records with a problem: {said}; a namespace whose record is stale or "
            "unreadable is refused pods of its budgeted classes "
            "(gpuadm_gpu_hours_record_problems, docs/operations.md#gpu-hour-records)"
        )

    def _review(self, now: int) -> None:
        """Work out each namespace's record problems, for the metric and /readyz: unreadable
        or stale (its budgeted classes are refused), and unwritable (this leader's last
        write of it failed)."""
        problems: dict[str, list[str]] = {}
        for namespace in set(self._records) | set(self.runs.namespaces()) | set(self._unwritten):
            stored = self._records.get(namespace)
            hours = _believed(stored, now)
            found = []
            if isinstance(hours, RecordError):
                found.append("unreadable")
            elif self._stale(namespace, stored, hours, now) is not None:
                found.append("stale")
            if namespace in self._unwritten:
                found.append("unwritable")
            if found:
                problems[namespace] = found
        self._problems = problems
        if self.metrics is not None:
            gauge = self.metrics.hours_record_problems
            gauge.clear()
            for namespace, kinds in problems.items():
                for problem in kinds:
                    gauge.labels(namespace, problem).set(1)

    # --- the leader -----------------------------------------------------------------------

    async def checkpoint_forever(
        self, quotas: Callable[[], QuotaConfig], progress: Callable[[], None]
    ) -> None:
        """Checkpoint every `checkpoint_seconds` while this replica leads (`LeaderOnly`)."""
        try:
            while True:
                await asyncio.sleep(self.checkpoint_seconds)
                if self.pods_ready():
                    await self.checkpoint(quotas())
                    progress()
        finally:
            # No longer leading: the next leader's writes are its own.
            self._unwritten.clear()

    async def checkpoint(self, quotas: QuotaConfig) -> int:
        """Count every namespace's runs into its record up to now; return how many records
        were written. A record that moved since it was read is left for the next one."""
        if self.store is None:
            return 0
        records = await self.store.read_all(self._records)
        now = int(self.clock())
        written = 0
        for namespace in sorted(set(records) | set(self.runs.namespaces())):
            stored = records.get(namespace)
            old = _believed(stored, now)
            if isinstance(old, RecordError):
                self._log_unreadable(namespace, old)
                continue
            new = self._counted(namespace, old, quotas, now)
            if new.classes == old.classes and (stored is None or stored.labelled):
                continue  # nothing ran: the record, and its checkpoint, stay as they are
            found = await self._write(self.store, namespace, new, stored)
            if found is not None:
                records[namespace] = found
                if found.hours is new:
                    written += 1
        self._records = records
        self.read_once = True
        self._review(now)
        return written

    def _counted(self, namespace: str, old: Hours, quotas: QuotaConfig, now: int) -> Hours:
        """Return a namespace's record with its runs counted to now, kept small."""
        shape = self._tiers(quotas, namespace)
        runs = self.runs.runs(namespace)
        counted = accrue(old, runs, now=now, width=self.bucket_seconds, since=now - shape.keep_for)
        return fit(compact(counted, now=now, tiers=shape), max_bytes=RECORD_MAX_BYTES)

    async def _write(
        self, store: HoursStore, namespace: str, new: Hours, stored: Stored | None
    ) -> Stored | None:
        """Write a namespace's record; return the record now in force (None: as it was)."""
        try:
            version = await store.write(namespace, new, None if stored is None else stored.version)
        except Moved:
            if stored is None:
                return await self._created_meanwhile(store, namespace)
            log.info("the GPU-hour record of %s moved; counted at the next checkpoint", namespace)
            return None
        except RecordTooLarge as error:
            self._failed(namespace, "too_large", str(error))
            return None
        except KubeError as error:
            # The apiserver refuses a ConfigMap over 1 MiB with 422 (413 past its body limit).
            self._failed(
                namespace, "too_large" if error.status in (413, 422) else "apiserver", str(error)
            )
            return None
        if stored is not None and not stored.labelled:
            log.warning(
                "the GPU-hour record ConfigMap %s had lost its labels (%s: %s); written back "
                "with them",
                hours_record_name(namespace),
                HOURS_RECORD_LABEL,
                namespace,
            )
        if self._unwritten.pop(namespace, None) is not None:
            log.info("the GPU-hour record of %s is written again", namespace)
        return Stored(namespace, new, version)

    async def _created_meanwhile(self, store: HoursStore, namespace: str) -> Stored | None:
        """Read, by its name, a record created since the list that showed none: the next
        checkpoint counts into it. One that cannot be read refuses its namespace's
        budgeted classes, as any does."""
        try:
            found = await store.read_one(namespace)
        except KubeError as error:
            self._failed(namespace, "apiserver", f"created meanwhile, and cannot be read: {error}")
            return None
        if found is None:
            log.info(
                "the GPU-hour record of %s came and went; counted at the next checkpoint", namespace
            )
        elif isinstance(found.hours, RecordError):
            self._log_unreadable(namespace, found.hours)
        else:
            log.warning(
                "the GPU-hour record of %s was created meanwhile by another writer; counted "
                "into at the next checkpoint",
                namespace,
            )
        return found

    def _failed(self, namespace: str, reason: str, why: str) -> None:
        """Say, loudly, that a namespace's record could not be written."""
        if self.metrics is not None:
            self.metrics.hours_record_write_failures.labels(reason).inc()
        self._unwritten[namespace] = reason
        now = self.clock()
        if now - self._logged_failure.get(namespace, float("-inf")) >= RELOG_SECONDS:
            self._logged_failure[namespace] = now
            log.error(
                "cannot write the GPU-hour record of namespace %s (%s): %s. Its pods' time "
                "stays uncounted in memory until a write succeeds; once the record is %d s "
                "behind while its pods run, its budgeted classes are refused",
                namespace,
                reason,
                why,
                self.stale_seconds,
            )

    def _tiers(self, quotas: QuotaConfig, namespace: str) -> Tiers:
        """Return how a namespace's record keeps its buckets: fine for its own longest
        budget window, and no run counted further back than it keeps (`accrue`'s `since`),
        by a judgement or a checkpoint alike."""
        longest = max((b.window for b in quotas.budgets_for(namespace).values()), default=0)
        return tiers(longest, self.bucket_seconds)

    def _log_unreadable(self, namespace: str, error: RecordError) -> None:
        now = self.clock()
        if now - self._logged.get(namespace, float("-inf")) >= RELOG_SECONDS:
            self._logged[namespace] = now
            log.error("GPU-hour record of namespace %s: %s", namespace, error)


def _believed(stored: Stored | None, now: int) -> Hours | RecordError:
    """Return a namespace's record as it may be counted on: none is an empty one; one that
    cannot be read, or whose checkpoint is far ahead of this clock, says why not."""
    if stored is None:
        return Hours()
    hours = stored.hours
    if isinstance(hours, Hours) and hours.checkpoint > now + MAX_SKEW_SECONDS:
        return RecordError(
            f"ConfigMap {hours_record_name(stored.namespace)} is counted to "
            f"{timestamp(hours.checkpoint)}, ahead of this replica's clock by "
            f"{hours.checkpoint - now} s; fix the clocks, or the record"
        )
    return hours
