"""Small helpers shared by the suites and the benchmarks."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """Return a TCP port that is free on loopback now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_gpuadm(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a `gpuadm` command to its end, as a user's shell would; it may fail, but never
    with a traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


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


class ServeProcess:
    """A standalone `gpuadm serve` subprocess on a loopback port, and calls to it."""

    def __init__(self, tmp_path: Path, policy: Path, quotas: Path, *extra: str) -> None:
        """Serve `policy` and `quotas`, with TLS material and the log under `tmp_path`.

        `extra` are more `gpuadm serve` arguments.
        """
        self.port = free_port()
        self.tls_dir = tmp_path / "tls"
        self.log = (tmp_path / "serve.log").open("w")
        self.process = spawn_serve(
            self.port,
            "--tls-dir",
            str(self.tls_dir),
            "--policy",
            str(policy),
            "--quotas",
            str(quotas),
            *extra,
            log=self.log,
        )
        wait_until_listening(self.process, self.port, Path(self.log.name).read_text)
        self.ssl = ssl.create_default_context(cafile=self.tls_dir / "ca.crt")

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST a JSON body; return the status and the JSON answer."""

        async def call() -> tuple[int, dict[str, Any]]:
            async with aiohttp.ClientSession() as session:
                url = f"https://localhost:{self.port}{path}"
                async with session.post(url, json=body, ssl=self.ssl) as response:
                    return response.status, await response.json()

        return asyncio.run(call())

    def get(self, path: str) -> str:
        """GET a path of the server and return the body."""

        async def call() -> str:
            async with aiohttp.ClientSession() as session:
                url = f"https://localhost:{self.port}{path}"
                async with session.get(url, ssl=self.ssl) as response:
                    return await response.text()

        return asyncio.run(call())

    def resident_bytes(self) -> int:
        """Return the server process's resident memory (VmRSS) now."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS in /proc/<pid>/status")

    def stop(self) -> None:
        """Stop the server and close its log."""
        self.process.terminate()
        self.process.wait(timeout=10)
        self.log.close()
