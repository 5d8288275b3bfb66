"""What the metrics read at each scrape, as plain values.

Kept apart from `metrics.py` so that the modules that hand these over (the plan memo, the
audit writer, the quota ledger, the supervisor) do not load the Prometheus client: `gpuadm
review` runs the admission path without any metrics to export.
"""

from __future__ import annotations

from typing import NamedTuple


class AuditReading(NamedTuple):
    """The audit writer as the metrics show it."""

    pending: int
    dropped: int
    write_errors: int


class MemoReading(NamedTuple):
    """The plan memo as the metrics show it."""

    entries: int
    weight_bytes: int
    evictions: int


class QuotaReading(NamedTuple):
    """What a namespace holds of a class now, and its limit (None: unlimited)."""

    namespace: str
    gpu_class: str
    in_use: float
    limit: float | None


class QueueReading(NamedTuple):
    """The pods of a namespace waiting in line for a class, and the longest wait among them."""

    namespace: str
    gpu_class: str
    waiting: int
    oldest_seconds: float
    # The gangs among them (counted by the class of each gang's first pod in line), and how
    # long the longest-waiting of those has waited.
    gangs: int = 0
    oldest_gang_seconds: float = 0.0


class TaskReading(NamedTuple):
    """A background task as the metrics show it: running or not, and since its progress."""

    task: str
    running: bool
    seconds_since_progress: float


class HoursReading(NamedTuple):
    """A namespace's GPU-seconds of a class: all counted, and within its budget's window."""

    namespace: str
    gpu_class: str
    # None for `*`, whose GPU-seconds are its classes'.
    gpu_seconds: float | None
    # Used in the budget's window, and the budget (None: no budget on the class).
    budget_used: float | None = None
    budget: float | None = None
