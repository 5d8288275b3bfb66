"""CPU pinning: the server under test on one CPU, the load generator on the other.

On Linux a process starts with its parent's CPU set, so a server started while this process
is pinned to `SERVER_CPU` stays there, and so does vegeta, started on `GENERATOR_CPU`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

SERVER_CPU = 0
GENERATOR_CPU = 1
# Read once: while pinned, this process sees one CPU, however many the machine has.
_USABLE = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()


def can_pin() -> bool:
    """Tell whether this machine lets the two sides have a CPU each."""
    return {SERVER_CPU, GENERATOR_CPU} <= _USABLE


def describe() -> str:
    """Say where the server and the load generator run."""
    if can_pin():
        return f"server on CPU {SERVER_CPU}, load generator on CPU {GENERATOR_CPU}"
    return "server and load generator share the CPUs (cannot pin here)"


@contextlib.contextmanager
def pinned(cpu: int) -> Iterator[None]:
    """Run this process, and what it starts meanwhile, on `cpu` alone; then as before."""
    if not can_pin():
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
