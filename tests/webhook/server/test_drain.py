"""A replica told to stop drains first: it answers, fails /readyz, and keeps no connection.

The kubelet sends SIGTERM while the Service still routes to the pod; a replica that stopped
listening at once would fail the calls of that moment, and the validating webhook fails
closed. The rollout in tests/e2e/test_installed.py proves the whole; these pin each part.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.builders import POLICY_YAML, QUOTAS_YAML, pod, review
from tests.support import ServeProcess

# The longest allowed, and longer than any test here runs: a replica still serving after its
# signal is draining, not slow to stop.
LONG_DRAIN = "60"
# How long a stopped replica may take to exit: its in-flight answers and its audit flush.
EXIT_BOUND = 20


@pytest.fixture
def config(tmp_path: Path) -> tuple[Path, Path]:
    policy, quotas = tmp_path / "policy.yaml", tmp_path / "quotas.yaml"
    policy.write_text(POLICY_YAML)
    quotas.write_text(QUOTAS_YAML)
    return policy, quotas


@pytest.fixture
def draining(tmp_path: Path, config: tuple[Path, Path]) -> Iterator[ServeProcess]:
    server = ServeProcess(tmp_path, *config, "--shutdown-delay-seconds", LONG_DRAIN)
    yield server
    if server.process.poll() is None:
        server.process.kill()
    server.process.wait()
    server.log.close()


async def _call(
    server: ServeProcess, method: str, path: str, body: object = None
) -> tuple[int, str, str]:
    """One request on a fresh connection: status, Connection header, body."""
    async with aiohttp.ClientSession() as session:
        url = f"https://localhost:{server.port}{path}"
        async with session.request(method, url, json=body, ssl=server.ssl) as response:
            return response.status, response.headers.get("Connection", ""), await response.text()


def _wait_for_readyz(server: ServeProcess, status: int) -> str:
    deadline = time.monotonic() + EXIT_BOUND
    while time.monotonic() < deadline:
        got, _, text = asyncio.run(_call(server, "GET", "/readyz"))
        if got == status:
            return text
        time.sleep(0.1)
    raise AssertionError(f"/readyz never answered {status}")


def test_after_sigterm_the_replica_answers_but_leaves_the_service(draining: ServeProcess) -> None:
    _wait_for_readyz(draining, 200)
    status, connection, _ = asyncio.run(_call(draining, "POST", "/validate", review(pod())))
    assert status == 200
    assert connection.lower() in ("", "keep-alive")  # HTTP/1.1 keeps it open unless told

    draining.process.send_signal(signal.SIGTERM)

    assert "shutting down" in _wait_for_readyz(draining, 503)
    status, connection, body = asyncio.run(_call(draining, "POST", "/validate", review(pod())))
    assert status == 200, body
    assert '"allowed":true' in body.replace(" ", "")
    # The caller dials again for its next call, and reaches a replica that stays.
    assert connection.lower() == "close"
    assert draining.process.poll() is None


def test_a_second_signal_ends_the_drain(draining: ServeProcess) -> None:
    draining.process.send_signal(signal.SIGTERM)
    _wait_for_readyz(draining, 503)
    draining.process.send_signal(signal.SIGTERM)
    assert draining.process.wait(timeout=EXIT_BOUND) == 0
    assert "draining for 60 s" in Path(draining.log.name).read_text()


def test_sigint_skips_the_drain(draining: ServeProcess) -> None:
    _wait_for_readyz(draining, 200)
    draining.process.send_signal(signal.SIGINT)
    assert draining.process.wait(timeout=EXIT_BOUND) == 0
    assert "draining" not in Path(draining.log.name).read_text()


def test_without_a_delay_sigterm_stops_at_once(tmp_path: Path, config: tuple[Path, Path]) -> None:
    server = ServeProcess(tmp_path, *config)
    _wait_for_readyz(server, 200)
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=EXIT_BOUND) == 0
    server.log.close()
    assert "draining" not in Path(server.log.name).read_text()


@pytest.mark.parametrize("value", ["-1", "61", "soon"])
def test_a_delay_out_of_range_is_refused(value: str) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "serve", "--shutdown-delay-seconds", value],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "--shutdown-delay-seconds" in result.stderr
    assert "Traceback" not in result.stderr
