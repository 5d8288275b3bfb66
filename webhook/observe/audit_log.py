"""The audit log: one JSON line per admission decision, apart from the operational log.

Writing never blocks the event loop: a record is put on a queue, and a writer thread writes
it to stdout or to a file that rotates by size. `close` writes every record already accepted
before it returns, so a shutdown loses nothing.

A write that fails (a full disk, a file removed under it, stdout closed) never ends the
writer: the batch is kept and written again after a backoff, the file reopened, and the
failure logged once with its reason. Records wait meanwhile, up to `MAX_PENDING_RECORDS`;
past that, new ones are dropped and counted (`gpuadm_audit_records_dropped_total`), since a
replica that ran out of memory would lose more than its audit records.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from webhook.observe.readings import AuditReading

log = logging.getLogger("gpuadm.audit")

DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_BACKUPS = 5
# A record reaches the file at most this late.
BATCH_SECONDS = 0.05
# Records written with one write call at most: at a few hundred bytes each, about 1 MiB, so
# a burst is written in a few large writes and a slow disk never holds much in memory.
MAX_BATCH_RECORDS = 4096
# Records kept while the sink fails: at a few hundred bytes each, some 60 MiB at most.
MAX_PENDING_RECORDS = 200_000
# Waits between attempts to write a batch that failed, doubling.
FIRST_RETRY_SECONDS = 0.5
MAX_RETRY_SECONDS = 30.0


class AuditLog:
    """Accepts records on the event loop; a background thread writes them in batches."""

    def __init__(
        self,
        destination: str = "-",
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
    ) -> None:
        """Write to stdout for `-`, else to the file, rotated at `max_bytes`."""
        self._destination = destination
        self._max_bytes = max_bytes
        self._backups = backups
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # Counts shared with the writer thread; each += is under the lock.
        self._lock = threading.Lock()
        self._pending = 0
        self._dropped = 0
        self._write_errors = 0
        self._closing = False

    def reading(self) -> AuditReading:
        """Return how many records wait, were dropped, and how many writes failed."""
        with self._lock:
            return AuditReading(self._pending, self._dropped, self._write_errors)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread = threading.Thread(
            target=self._write_forever, name="gpuadm-audit", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Write every accepted record, then stop the writer thread.

        While the sink fails, the writer keeps trying for at most one more retry period.
        """
        if self._thread is not None:
            self._closing = True
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def write(self, entry: dict[str, Any]) -> None:
        """Accept one record; it is written in order, off the event loop."""
        with self._lock:
            if self._pending >= MAX_PENDING_RECORDS:
                self._dropped += 1
                return
            self._pending += 1
        self._queue.put(orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE))

    def _write_forever(self) -> None:
        sink: _Sink | None = None
        retry = FIRST_RETRY_SECONDS
        failure: str | None = None
        try:
            while True:
                batch, done = self._next_batch()
                while True:
                    try:
                        sink = sink or _Sink(self._destination, self._max_bytes, self._backups)
                        sink.write(batch)
                        break
                    except (OSError, ValueError) as error:  # ValueError: a closed stream
                        failure = self._failed(error, failure, retry)
                        sink = None
                        if self._closing and retry >= MAX_RETRY_SECONDS:
                            log.error("audit log: %d records not written at shutdown", len(batch))
                            return
                        time.sleep(retry)
                        retry = min(retry * 2, MAX_RETRY_SECONDS)
                with self._lock:
                    self._pending -= len(batch)
                if failure is not None:
                    log.info("audit log: writing again after the failure (%s)", failure)
                    failure, retry = None, FIRST_RETRY_SECONDS
                if done:
                    return
        finally:
            if sink is not None:
                sink.close()

    def _next_batch(self) -> tuple[list[bytes], bool]:
        """Wait for records; return a batch of them and whether `close` was asked."""
        first = self._queue.get()
        batch = [first]
        if first is not None:
            # Let records gather, then write them at once: under load the thread wakes a
            # few times a second instead of once a record, so it takes the interpreter from
            # request handling only briefly.
            time.sleep(BATCH_SECONDS)
        while len(batch) < MAX_BATCH_RECORDS:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return [line for line in batch if line is not None], None in batch

    def _failed(self, error: Exception, failure: str | None, retry: float) -> str:
        reason = f"{type(error).__name__}: {error}"
        with self._lock:
            self._write_errors += 1
        if reason != failure:
            log.error(
                "audit log: cannot write to %s, records wait (retrying in %.1f s): %s",
                self._destination,
                retry,
                reason,
            )
        return reason


class _Sink:
    """stdout, or a file that is rotated (`audit.log.1`, `.2`, ...) once it reaches a size."""

    def __init__(self, destination: str, max_bytes: int, backups: int) -> None:
        self._path = None if destination == "-" else Path(destination)
        self._max_bytes = max_bytes
        self._backups = backups
        self._stream: BinaryIO = sys.stdout.buffer if self._path is None else self._open()

    def _open(self) -> BinaryIO:
        assert self._path is not None
        self._path.parent.mkdir(parents=True, exist_ok=True)
        return self._path.open("ab")

    def write(self, lines: list[bytes]) -> None:
        """Write whole lines, rotating between two lines when the file would pass its size."""
        chunk: list[bytes] = []
        size = self._stream.tell() if self._path is not None else 0
        for line in lines:
            if self._path is not None and size and size + len(line) > self._max_bytes:
                self._stream.write(b"".join(chunk))
                self._rotate()
                chunk, size = [], 0
            chunk.append(line)
            size += len(line)
        self._stream.write(b"".join(chunk))
        self._stream.flush()

    def _rotate(self) -> None:
        assert self._path is not None
        self._stream.close()
        for index in range(self._backups - 1, 0, -1):
            older = self._path.with_name(f"{self._path.name}.{index}")
            if older.exists():
                older.replace(self._path.with_name(f"{self._path.name}.{index + 1}"))
        if self._backups > 0:
            self._path.replace(self._path.with_name(f"{self._path.name}.1"))
        else:
            self._path.unlink()
        self._stream = self._open()

    def close(self) -> None:
        if self._path is not None:
            self._stream.close()
        else:
            self._stream.flush()
