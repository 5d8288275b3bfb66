"""GPU-hours across replicas: counted by the leader into records, read by every replica.

Every replica keeps the runs of GPU pods its pod watch shows (`runs.RunIndex`) and reads the
records every `checkpoint_seconds`. The leader, at each checkpoint, counts each namespace's
runs into its record, from the record's last checkpoint to now (`policies.gpu_hours.accrue`),
and writes the record with the version it read. So:

- what a namespace used is its record plus what its runs used since the record's checkpoint
  (`unrecorded`), and every replica computes the same from the same pods, whether its copy
  of the record is the newest or one checkpoint old;
- a leader that dies between checkpoints loses nothing the next leader's pod watch still
  shows: the next checkpoint counts from the record's. Lost is only the time of a pod that
  ended and was deleted while no replica watched, since the last checkpoint: at most one
  interval of it;
- a write refused because the record moved (a second leader for a moment) counts nothing:
  the next checkpoint reads the record again.

A record that cannot be read is never overwritten and never read as zero: the namespace's
budgeted classes admit no pods until an admin fixes or deletes it, and the log says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction

from policies.budget import DAY, Budget
from policies.gpu_hours import (
    Hours,
    RecordError,
    Spending,
    accrue,
    compact,
    judge_budget,
    running_shares,
    timestamp,
    used_in_windows,
)
from policies.judge import QuotaVerdict
from policies.quotas import ALL_CLASSES, QuotaConfig, budgets_on
from webhook.config.snapshot import ConfigSnapshot
from webhook.gpu_hours.runs import RunIndex
from webhook.gpu_hours.store import HoursStore, Moved, Stored
from webhook.kube.errors import KubeError
from webhook.kube.objects import hours_record_name
from webhook.observe.readings import HoursReading

log = logging.getLogger("gpuadm.gpu_hours")

CHECKPOINT_SECONDS = 60.0
BUCKET_SECONDS = 3600
# Showback keeps a month and a bit of usage in day-wide buckets, whatever the budgets.
KEEP_SECONDS = 35 * DAY
# A record that cannot be read is logged again this often.
RELOG_SECONDS = 600.0
# Records are kept hour by hour for at least this long (and the longest budget window):
# so a budget shortened for a while, then lengthened again, finds its hours still there.
FINE_SECONDS = 8 * DAY
# A checkpoint further ahead of this replica's clock than this is not believed: every run
# would go uncounted until the clock caught up.
MAX_SKEW_SECONDS = 300

# Namespaces whose spending is kept between judgements, at most (a few KiB each).
MAX_KEPT_SPENDINGS = 10_000

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
        keep_seconds: int = KEEP_SECONDS,
    ) -> None:
        """Count `runs` into records kept in `store` (None: standalone, with no pods and no
        records). `pods_ready` says whether the pod watch is in sync."""
        self.runs = runs
        self.store = store
        self.pods_ready = pods_ready
        self.clock = clock
        self.checkpoint_seconds = checkpoint_seconds
        self.bucket_seconds = bucket_seconds
        self.keep_seconds = keep_seconds
        self._records: dict[str, Stored] = {}
        self.read_once = store is None
        self._logged: dict[str, float] = {}
        # Per namespace, its spending as last worked out, and from what (`spending`).
        self._spent: dict[str, tuple[tuple[int, Stored | None, int], Spending | RecordError]] = {}

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
        self.runs.prune(now=self.clock(), counted_to=self._counted_to)

    def _counted_to(self, namespace: str) -> int:
        """Return the moment a namespace's record counts its runs up to (0: none, or a
        record not believed, whose runs must stay until one is)."""
        counted = _believed(self._records.get(namespace), int(self.clock()))
        return counted.checkpoint if isinstance(counted, Hours) else 0

    def spending(self, namespace: str, now: int, quotas: QuotaConfig) -> Spending | RecordError:
        """Return what a namespace used by now (its record, and its runs since the record's
        checkpoint counted as the next checkpoint will), or why its record cannot be read."""
        stored = self._records.get(namespace)
        # Worked out once a second at most (while the record stays the same): a burst of
        # creates, the releaser and a scrape share it, and a namespace of 10,000 GPU pods
        # costs one pass over them a second, not one per admission. A run that starts or
        # ends within the second is judged from the next one.
        _, keep_for = self._horizons(quotas)
        known = self._spent.get(namespace)
        if known is not None:
            (at, known_stored, known_keep_for), kept = known
            if at == now and known_stored is stored and known_keep_for == keep_for:
                return kept
        hours = _believed(stored, now)
        spending: Spending | RecordError
        if isinstance(hours, RecordError):
            spending = hours
        else:
            counted = accrue(
                hours,
                self.runs.runs(namespace),
                now=now,
                width=self.bucket_seconds,
                since=now - keep_for,
            )
            rates = running_shares(self.runs.runs(namespace), now=now)
            spending = Spending(counted, rates)
        if len(self._spent) > MAX_KEPT_SPENDINGS:
            self._spent.clear()
        self._spent[namespace] = ((now, stored, keep_for), spending)
        return spending

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
        spending = self.spending(namespace, now, config.quotas)
        if isinstance(spending, RecordError):
            return QuotaVerdict(
                False,
                f'namespace "{namespace}": its GPU-hour record {spending}; until then gpuadm '
                "admits no pods of classes with a budget here",
            )
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

    # --- the leader -----------------------------------------------------------------------

    async def checkpoint_forever(
        self, quotas: Callable[[], QuotaConfig], progress: Callable[[], None]
    ) -> None:
        """Checkpoint every `checkpoint_seconds` while this replica leads (`LeaderOnly`)."""
        while True:
            await asyncio.sleep(self.checkpoint_seconds)
            if self.pods_ready():
                await self.checkpoint(quotas())
                progress()

    async def checkpoint(self, quotas: QuotaConfig) -> int:
        """Count every namespace's runs into its record up to now; return how many records
        were written. A record that moved since it was read is left for the next one."""
        if self.store is None:
            return 0
        records = await self.store.read_all(self._records)
        now = int(self.clock())
        fine_for, keep_for = self._horizons(quotas)
        written = 0
        for namespace in sorted(set(records) | set(self.runs.namespaces())):
            stored = records.get(namespace)
            old = _believed(stored, now)
            if isinstance(old, RecordError):
                self._log_unreadable(namespace, old)
                continue
            runs = self.runs.runs(namespace)
            counted = accrue(old, runs, now=now, width=self.bucket_seconds, since=now - keep_for)
            new = compact(counted, now=now, fine_for=fine_for, keep_for=keep_for)
            if new.classes == old.classes:
                continue  # nothing ran: the record, and its checkpoint, stay as they are
            try:
                version = await self.store.write(
                    namespace, new, None if stored is None else stored.version
                )
            except Moved:
                log.info(
                    "the GPU-hour record of %s moved; counted at the next checkpoint", namespace
                )
                continue
            except KubeError as error:
                log.warning("cannot write the GPU-hour record of %s: %s", namespace, error)
                continue
            records[namespace] = Stored(namespace, new, version)
            written += 1
        self._records = records
        self.read_once = True
        return written

    def _horizons(self, quotas: QuotaConfig) -> tuple[int, int]:
        """Return how long buckets stay hour-wide, and how long they are kept: hour by hour
        for the longest window (8 days at least), so that no window judged ever counts a
        day-wide bucket (`compact`); kept a day past that at least, and no run is counted
        further back (`accrue`'s `since`), by a judgement or a checkpoint alike."""
        fine_for = max(quotas.longest_window(), FINE_SECONDS) + self.bucket_seconds
        return fine_for, max(self.keep_seconds, fine_for + DAY)

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
