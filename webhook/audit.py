"""The audit log: one JSON line per admission decision, apart from the operational log.

Writing never blocks the event loop: a record is put on a queue, and a listener thread writes
it to stdout or to a file that rotates by size. `close` writes every record already accepted
before it returns, so a shutdown loses nothing.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from policies.quantity import format_amount
from webhook.admission import Decision
from webhook.config import ConfigSnapshot
from webhook.review import AdmissionRequest

DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_BACKUPS = 5


class AuditLog:
    """Accepts records on the event loop; a background thread writes them."""

    def __init__(
        self,
        destination: str = "-",
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
    ) -> None:
        """Write to stdout for `-`, else to the file, rotated at `max_bytes`."""
        handler: logging.Handler
        if destination == "-":
            handler = logging.StreamHandler(sys.stdout)
        else:
            Path(destination).parent.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(
                destination, maxBytes=max_bytes, backupCount=backups, encoding="utf-8"
            )
        handler.setFormatter(logging.Formatter("%(message)s"))
        self._queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self._listener = logging.handlers.QueueListener(self._queue, handler)
        self._handler = handler
        self._open = False

    def start(self) -> None:
        """Start the writer thread."""
        self._listener.start()
        self._open = True

    def close(self) -> None:
        """Write every accepted record, then stop the writer thread."""
        if self._open:
            self._open = False
            self._listener.stop()
        self._handler.close()

    def write(self, entry: dict[str, Any]) -> None:
        """Accept one record; it is written in order, off the event loop."""
        line = orjson.dumps(entry).decode()
        record = logging.LogRecord("gpuadm.audit", logging.INFO, "", 0, line, None, None)
        self._queue.put(record)


def audit_entry(
    *,
    endpoint: str,
    request: AdmissionRequest,
    decision: Decision,
    config: ConfigSnapshot | None,
    latency: float,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Return the audit record of one decision, with the same fields for every decision."""
    plan = decision.plan
    quota = decision.quota
    return {
        "time": (now or datetime.now(UTC)).isoformat(timespec="milliseconds"),
        "endpoint": endpoint,
        "uid": request.uid,
        "operation": request.operation,
        "dryRun": request.dry_run,
        "namespace": request.namespace,
        "pod": request.pod_name,
        "user": request.user,
        "groups": list(request.groups),
        "class": plan.class_name if plan else None,
        "demand": plan.demand if plan else None,
        "decision": decision.outcome,
        "reason": decision.reason or None,
        "warnings": list(decision.warnings),
        "patch": sorted({op["path"] for op in decision.patch}),
        "quotaInUse": _amount(quota.in_use) if quota else None,
        "quotaLimit": _amount(quota.limit) if quota else None,
        "wouldDeny": quota.would_deny if quota else False,
        "policyRevision": config.policy_revision if config else None,
        "quotasRevision": config.quotas_revision if config else None,
        "latencyMs": round(latency * 1000, 3),
    }


def _amount(value: Any) -> str | None:
    return None if value is None else format_amount(value)
