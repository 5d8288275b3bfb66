"""What `/metrics` reads of quota at each scrape: each namespace's holdings against its
limits, and each line of waiting pods with its longest wait."""

from __future__ import annotations

import time
from datetime import datetime

from policies.quota.quotas import QuotaConfig
from webhook.config.snapshot import ConfigHolder
from webhook.observe.metrics import Metrics
from webhook.observe.readings import QueueReading, QuotaReading
from webhook.quota.book import ReservationBook
from webhook.quota.usage import UsageIndex


def export_quota(
    metrics: Metrics, book: ReservationBook, holder: ConfigHolder, usage: UsageIndex
) -> None:
    """Export, at each scrape, what the book's namespaces hold under the quotas in force,
    and the lines of waiting pods."""
    metrics.watch_quota(
        lambda: quota_readings(book, holder.current.quotas) if holder.loaded else []
    )
    metrics.watch_queue(lambda: queue_readings(usage, time.time()))


def quota_readings(book: ReservationBook, quotas: QuotaConfig) -> list[QuotaReading]:
    """Return what each namespace holding GPUs has in use of each class, and its limit.

    Only namespaces that hold pods or reservations appear, so the metric series of a
    namespace go away with its usage.
    """
    namespaces = set(book.usage.namespaces()) | set(book.copied_namespaces())
    readings = []
    for namespace in sorted(namespaces):
        limits = quotas.limits_for(namespace)
        for class_name, used in sorted(book.in_use(namespace, set_aside=False).items()):
            limit = limits.get(class_name)
            readings.append(
                QuotaReading(
                    namespace,
                    class_name,
                    float(used),
                    None if limit is None else float(limit),
                )
            )
    return readings


def queue_readings(usage: UsageIndex, now: float) -> list[QueueReading]:
    """Return each line's length and its longest wait, per namespace and class."""
    readings = []
    for namespace in sorted(usage.waiting_namespaces()):
        # Counted by the line's index, per class, with its oldest pod: no pass over the line.
        line = usage.line(namespace)
        gangs = line.gangs_by_class()
        for class_name, (count, oldest) in sorted(line.by_class().items()):
            in_gangs, oldest_gang = gangs.get(class_name, (0, ""))
            readings.append(
                QueueReading(
                    namespace,
                    class_name,
                    count,
                    _since(oldest, now),
                    in_gangs,
                    _since(oldest_gang, now) if in_gangs else 0.0,
                )
            )
    return readings


def _since(created: str, now: float) -> float:
    try:
        return max(0.0, now - datetime.fromisoformat(created).timestamp())
    except ValueError:
        return 0.0
