"""Small helpers shared by the suites and the benchmarks."""

from __future__ import annotations

import socket


def free_port() -> int:
    """Return a TCP port that is free on loopback now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
