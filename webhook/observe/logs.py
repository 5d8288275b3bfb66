"""Operational logs: levelled, one JSON object a line on stderr (the audit log is separate)."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime

import orjson


class JsonFormatter(logging.Formatter):
    """Format a log record as a JSON object with time, level, logger and message."""

    def format(self, record: logging.LogRecord) -> str:
        """Return one JSON line."""
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def configure(level: str, fmt: str) -> None:
    """Send gpuadm's operational logs to stderr, as JSON lines or as plain text."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
