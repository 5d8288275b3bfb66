"""Prometheus metrics, in a registry of the application's own (no process-wide globals)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from webhook.observe.readings import (
    AuditReading,
    HoursReading,
    MemoReading,
    QueueReading,
    QuotaReading,
    TaskReading,
)


class _QuotaCollector(Collector):
    """Reads quota use at scrape time, for the namespaces that hold GPUs now and no others."""

    def __init__(self, read: Callable[[], Iterable[QuotaReading]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        labels = ["namespace", "gpu_class"]
        in_use = GaugeMetricFamily(
            "gpuadm_quota_in_use_gpus",
            "GPUs a namespace holds of a class now: its pods and its reservations.",
            labels=labels,
        )
        limit = GaugeMetricFamily(
            "gpuadm_quota_limit_gpus", "Quota limit of a namespace for a class.", labels=labels
        )
        for reading in self._read():
            in_use.add_metric([reading.namespace, reading.gpu_class], reading.in_use)
            if reading.limit is not None:
                limit.add_metric([reading.namespace, reading.gpu_class], reading.limit)
        yield in_use
        yield limit


class _HoursCollector(Collector):
    """Reads GPU-seconds and budgets at scrape time, for the namespaces that used GPUs."""

    def __init__(self, read: Callable[[], Iterable[HoursReading]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        labels = ["namespace", "gpu_class"]
        seconds = CounterMetricFamily(
            "gpuadm_gpu_seconds",
            "GPU-seconds a namespace's pods of a class have run, each pod charged its share: "
            "the counted record and what ran since its last checkpoint.",
            labels=labels,
        )
        used = GaugeMetricFamily(
            "gpuadm_gpu_budget_used_seconds",
            "GPU-seconds a namespace used of a class in the window of its GPU-hour budget.",
            labels=labels,
        )
        budget = GaugeMetricFamily(
            "gpuadm_gpu_budget_seconds",
            "The GPU-hour budget of a namespace for a class, in GPU-seconds per window.",
            labels=labels,
        )
        for reading in self._read():
            key = [reading.namespace, reading.gpu_class]
            if reading.gpu_seconds is not None:
                seconds.add_metric(key, reading.gpu_seconds)
            if reading.budget is not None and reading.budget_used is not None:
                used.add_metric(key, reading.budget_used)
                budget.add_metric(key, reading.budget)
        yield seconds
        yield used
        yield budget


class _QueueCollector(Collector):
    """Reads the lines of waiting pods at scrape time (queue mode), one series per line."""

    def __init__(self, read: Callable[[], Iterable[QueueReading]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        labels = ["namespace", "gpu_class"]
        waiting = GaugeMetricFamily(
            "gpuadm_queue_waiting_pods",
            "Pods of a namespace waiting behind gpuadm's scheduling gate for a class.",
            labels=labels,
        )
        oldest = GaugeMetricFamily(
            "gpuadm_queue_oldest_wait_seconds",
            "How long the longest-waiting pod of a namespace and class has waited.",
            labels=labels,
        )
        gangs = GaugeMetricFamily(
            "gpuadm_queue_waiting_gangs",
            "Gangs of a namespace waiting whole behind gpuadm's scheduling gate, by the class "
            "of each gang's first pod in line.",
            labels=labels,
        )
        oldest_gang = GaugeMetricFamily(
            "gpuadm_queue_oldest_gang_wait_seconds",
            "How long the longest-waiting gang of a namespace and class has waited, from the "
            "creation of its first pod in line (0 with no gang waiting).",
            labels=labels,
        )
        for reading in self._read():
            key = [reading.namespace, reading.gpu_class]
            waiting.add_metric(key, reading.waiting)
            oldest.add_metric(key, reading.oldest_seconds)
            gangs.add_metric(key, reading.gangs)
            oldest_gang.add_metric(key, reading.oldest_gang_seconds)
        yield waiting
        yield oldest
        yield gangs
        yield oldest_gang


class _TaskCollector(Collector):
    """Reads the supervised background tasks at scrape time."""

    def __init__(self, read: Callable[[], Iterable[TaskReading]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily(
            "gpuadm_task_running",
            "1 while a background task runs, 0 while it waits to restart or, for leader-only "
            "work, while this replica does not lead.",
            labels=["task"],
        )
        age = GaugeMetricFamily(
            "gpuadm_task_last_success_age_seconds",
            "Seconds since a background task last made progress (a list, a watch call, a "
            "poll, a pass), or since it started if it has made none.",
            labels=["task"],
        )
        for reading in self._read():
            running.add_metric([reading.task], 1 if reading.running else 0)
            age.add_metric([reading.task], reading.seconds_since_progress)
        yield running
        yield age


class _AuditCollector(Collector):
    """Reads the audit writer at scrape time."""

    def __init__(self, read: Callable[[], AuditReading]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        reading = self._read()
        yield GaugeMetricFamily(
            "gpuadm_audit_records_pending",
            "Audit records accepted and not yet written (they wait while the sink fails).",
            reading.pending,
        )
        yield CounterMetricFamily(
            "gpuadm_audit_records_dropped",
            "Audit records dropped because too many were waiting for a failing sink.",
            reading.dropped,
        )
        yield CounterMetricFamily(
            "gpuadm_audit_write_errors",
            "Failed writes of the audit log (each is retried, the records kept).",
            reading.write_errors,
        )


class _PlanMemoCollector(Collector):
    """Reads the plan memo of the config in force at scrape time (it changes on reload)."""

    def __init__(self, read: Callable[[], MemoReading]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        reading = self._read()
        yield GaugeMetricFamily(
            "gpuadm_plan_memo_entries", "Plans remembered for the config in force.", reading.entries
        )
        yield GaugeMetricFamily(
            "gpuadm_plan_memo_bytes",
            "Estimated memory the remembered plans take (bounded; see docs/operations.md).",
            reading.weight_bytes,
        )
        yield CounterMetricFamily(
            "gpuadm_plan_memo_evictions",
            "Plans dropped from the memo to stay within its bounds.",
            reading.evictions,
        )


# Most answers take well under a millisecond, so the buckets start at 100 µs.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class Metrics:
    """Every metric gpuadm exports."""

    def __init__(self) -> None:
        # A `_created` series beside each counter and histogram child doubles the series
        # Prometheus stores, and no rule or panel reads them.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        self._request_children: dict[tuple[str, str, str], Any] = {}
        self._latency_children: dict[str, Any] = {}
        r = self.registry
        self.requests = Counter(
            "gpuadm_admission_requests",
            "Admission reviews answered.",
            ["endpoint", "operation", "decision"],
            registry=r,
        )
        self.latency = Histogram(
            "gpuadm_admission_duration_seconds",
            "Time to answer an admission review.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.bad_requests = Counter(
            "gpuadm_bad_requests",
            "Requests refused before admission: an HTTP 4xx for a malformed or oversized "
            "review, 503 for one the replica had no room to take in time.",
            ["endpoint", "status"],
            registry=r,
        )
        self.config_reloads = Counter(
            "gpuadm_config_reloads",
            "Config loads by source and result (applied or rejected).",
            ["config", "result"],
            registry=r,
        )
        self.config_valid = Gauge(
            "gpuadm_config_valid",
            "1 if the latest version of a config source is valid, else 0 "
            "(the last valid one stays in force).",
            ["config"],
            registry=r,
        )
        self.config_revision = Gauge(
            "gpuadm_config_revision_info",
            "The config in force: 1 for its revisions (content digests, as in the audit log).",
            ["policy", "quotas"],
            registry=r,
        )
        self.record_conflicts = Counter(
            "gpuadm_quota_record_conflicts",
            "Usage-record writes that lost a race and were retried.",
            registry=r,
        )
        self.admitted_aside = Counter(
            "gpuadm_quota_admitted_from_room_aside",
            "Admissions under quota judged from the room set aside for this replica, without "
            "a write of the usage record.",
            registry=r,
        )
        self.record_bytes_written = Counter(
            "gpuadm_quota_record_bytes_written",
            "Bytes of usage-record bodies sent to the apiserver, in creates and replaces "
            "(those that lost a race included): what the quota costs etcd.",
            registry=r,
        )
        self.tracked_pods = Gauge(
            "gpuadm_tracked_gpu_pods",
            "GPU pods in the usage index.",
            registry=r,
        )
        self.hours_record_write_failures = Counter(
            "gpuadm_gpu_hours_record_write_failures",
            "GPU-hour record writes the leader could not make, by reason: too_large (over "
            "gpuadm's 512 KiB, or refused by the apiserver as too long), apiserver (any other "
            "error). The namespace's time stays uncounted in memory until a write succeeds.",
            ["reason"],
            registry=r,
        )
        self.hours_record_problems = Gauge(
            "gpuadm_gpu_hours_record_problems",
            "1 for each namespace whose GPU-hour record has a problem: unreadable or stale "
            "(its budgeted classes are refused), or unwritable (the leader's last write of it "
            "failed).",
            ["namespace", "problem"],
            registry=r,
        )
        self.hours_runs_dropped = Counter(
            "gpuadm_gpu_hours_runs_dropped",
            "Ended GPU pod runs dropped uncounted because more than 100,000 waited for their "
            "records to be written: GPU time lost to the count.",
            registry=r,
        )
        self.queue_releases = Counter(
            "gpuadm_queue_releases",
            "Waiting pods released: charged to their namespace's quota and ungated.",
            registry=r,
        )
        self.queue_leader = Gauge(
            "gpuadm_queue_leader",
            "1 while this replica holds the Lease that lets it release waiting pods, else 0.",
            registry=r,
        )
        self.cohort_borrowed = Gauge(
            "gpuadm_cohort_borrowed_gpus",
            "GPUs a cohort member holds beyond its nominal quota of a class, borrowed from "
            "the idle quota its cohort lends (set by the leader).",
            ["cohort", "namespace", "gpu_class"],
            registry=r,
        )
        self.cohort_lent = Gauge(
            "gpuadm_cohort_lent_gpus",
            "GPUs of a cohort member's idle quota of a class that borrowers hold (set by the "
            "leader).",
            ["cohort", "namespace", "gpu_class"],
            registry=r,
        )
        self.cohort_reclaims = Counter(
            "gpuadm_cohort_reclaims",
            "Evictions of borrowed pods to give a lender its quota back, by outcome: evicted, "
            "disruption_budget (a PodDisruptionBudget refused it), failed.",
            ["cohort", "gpu_class", "reason"],
            registry=r,
        )
        self.task_restarts = Counter(
            "gpuadm_task_restarts",
            "Background tasks restarted after they failed (an error, or an unexpected return).",
            ["task"],
            registry=r,
        )
        # HTTP/1.1 is the one protocol served; the label stays for the dashboards that read it.
        self.connections_opened = Counter(
            "gpuadm_connections_opened",
            "Connections served, by protocol: http/1.1, the only one gpuadm serves.",
            ["protocol"],
            registry=r,
        ).labels("http/1.1")
        self.connections_refused = Counter(
            "gpuadm_connections_refused",
            "Connections closed on arrival because the replica served its maximum already.",
            registry=r,
        )
        self.budget_in_use = Gauge(
            "gpuadm_request_budget_in_use_bytes",
            "Bytes of a request budget held now: large bodies being read, decoded reviews.",
            ["budget"],
            registry=r,
        )
        self.certificate_expiry = Gauge(
            "gpuadm_certificate_expiry_timestamp_seconds",
            "When the served certificate expires (Unix time).",
            registry=r,
        )
        # 0 until the app says how it is ready (`watch_readiness`).
        self.ready = Gauge(
            "gpuadm_ready", "1 when this replica is ready (/readyz answers ok), else 0", registry=r
        )
        Gauge(
            "gpuadm_process_resident_memory_bytes",
            "Resident memory of the gpuadm process (from /proc; NaN where there is none).",
            registry=r,
        ).set_function(resident_memory_bytes)

    def answered(self, endpoint: str, operation: str, decision: str, seconds: float) -> None:
        """Count one answered review and its latency (label children cached: hot path)."""
        key = (endpoint, operation, decision)
        counter = self._request_children.get(key)
        if counter is None:
            counter = self._request_children[key] = self.requests.labels(*key)
        counter.inc()
        histogram = self._latency_children.get(endpoint)
        if histogram is None:
            histogram = self._latency_children[endpoint] = self.latency.labels(endpoint)
        histogram.observe(seconds)

    def watch_quota(self, read: Callable[[], Iterable[QuotaReading]]) -> None:
        """Export quota use and limits, read from `read` at each scrape."""
        self.registry.register(_QuotaCollector(read))

    def watch_hours(self, read: Callable[[], Iterable[HoursReading]]) -> None:
        """Export GPU-seconds and budgets, read from `read` at each scrape."""
        self.registry.register(_HoursCollector(read))

    def watch_queue(self, read: Callable[[], Iterable[QueueReading]]) -> None:
        """Export the lines of waiting pods, read from `read` at each scrape."""
        self.registry.register(_QueueCollector(read))

    def watch_tasks(self, read: Callable[[], Iterable[TaskReading]]) -> None:
        """Export the background tasks' state, read from `read` at each scrape."""
        self.registry.register(_TaskCollector(read))

    def watch_audit(self, read: Callable[[], AuditReading]) -> None:
        """Export the audit writer's backlog and failures, read from `read` at each scrape."""
        self.registry.register(_AuditCollector(read))

    def watch_plan_memo(self, read: Callable[[], MemoReading]) -> None:
        """Export the plan memo's size and evictions, read from `read` at each scrape."""
        self.registry.register(_PlanMemoCollector(read))

    def watch_readiness(self, ready: Callable[[], bool]) -> None:
        """Export readiness as /readyz answers it (1 ready, 0 not), read at each scrape."""
        self.ready.set_function(lambda: 1.0 if ready() else 0.0)

    def watch_budget(self, name: str, read: Callable[[], int]) -> None:
        """Export how much of the request budget `name` is held, read at each scrape."""
        self.budget_in_use.labels(name).set_function(read)

    def config_in_force(self, policy_revision: str, quotas_revision: str) -> None:
        """Export which config is in force, replacing the previous one."""
        self.config_revision.clear()
        self.config_revision.labels(policy_revision, quotas_revision).set(1)

    def exposition(self) -> bytes:
        """Return the text format Prometheus scrapes."""
        return generate_latest(self.registry)


def resident_memory_bytes() -> float:
    """Return the process's resident memory, from /proc (Linux); NaN where there is none."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return float("nan")
    return float(pages * os.sysconf("SC_PAGE_SIZE"))
