"""CPU pinning: the server under test on one CPU, the load generator on the other.

On Linux a process starts with its parent's CPU set, so a server started while this process
is pinned to `SERVER_CPU` stays there, and so does vegeta, started on `GENERATOR_CPU`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

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


def stolen_seconds() -> float | None:
    """Return the CPU time the hypervisor has given to others so far (Linux's steal), or None.

    A virtual machine whose host is busy loses CPU time that no process here sees; a run
    during which that grows measures the host, not gpuadm.
    """
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    if fields[0] != "cpu" or len(fields) < 9:
        return None
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")
