"""Small helpers shared by the suites and the benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """Return a TCP port that is free on loopback now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def spawn_serve(port: int, *args: str, log: IO[bytes] | IO[str]) -> subprocess.Popen[bytes]:
    """Start `gpuadm serve` on loopback with extra arguments, its output going to `log`."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *args,
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def wait_until_listening(
    process: subprocess.Popen[bytes], port: int, describe: Callable[[], str], seconds: float = 30
) -> None:
    """Wait until `port` accepts connections; fail with `describe()` if the process exits."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}:\n{describe()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the server did not listen on port {port} within {seconds} s")
