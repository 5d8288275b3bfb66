"""A hostile or unlucky edit of a config file, met by a serving replica: refused at once,
the last good config in force, every endpoint answering, and SIGTERM obeyed.

Before the loader bounded loops and the nodes behind aliases, an alias inside the block it
names spun the reload forever on the event loop: /healthz and /mutate stopped answering,
a good file never applied again, and only SIGKILL ended the process.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.builders import ALIAS_CYCLE, LAUGHS, POLICY_YAML, QUOTAS_YAML, pod, review
from tests.support import ServeProcess

# Longer than a poll of the files and a read of a bounded config take, on a busy machine.
SETTLES = 30.0
# Any answer of a replica that is not stuck: a hung one never answers at all.
ANSWERS = 5.0
EXIT_BOUND = 20


def _get(server: ServeProcess, path: str) -> str:
    async def call() -> str:
        timeout = aiohttp.ClientTimeout(total=ANSWERS)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            url = f"https://localhost:{server.port}{path}"
            async with session.get(url, ssl=server.ssl) as response:
                assert response.status == 200, path
                return await response.text()

    return asyncio.run(call())


def _quotas_valid(server: ServeProcess) -> float | None:
    metrics = _get(server, "/metrics")
    found = re.search(r'^gpuadm_config_valid\{config="gpuadm-quotas"\} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else None


def _wait_for(server: ServeProcess, valid: float) -> None:
    deadline = time.monotonic() + SETTLES
    while _quotas_valid(server) != valid:
        assert time.monotonic() < deadline, f"gpuadm_config_valid never became {valid}"
        time.sleep(0.2)


@pytest.mark.parametrize(
    "hostile", [pytest.param(ALIAS_CYCLE, id="alias-cycle"), pytest.param(LAUGHS, id="laughs")]
)
def test_a_hostile_quota_edit_is_refused_and_the_replica_stays_responsive(
    tmp_path: Path, hostile: str
) -> None:
    policy, quotas = tmp_path / "policy.yaml", tmp_path / "quotas.yaml"
    policy.write_text(POLICY_YAML)
    quotas.write_text(QUOTAS_YAML)
    server = ServeProcess(tmp_path, policy, quotas)
    try:
        _wait_for(server, 1)
        quotas.write_text(hostile)
        _wait_for(server, 0)
        assert _get(server, "/healthz")
        assert _get(server, "/readyz")  # the last good config is in force: still ready
        status, answer = server.post("/mutate", review(pod({"gpuadm.io/a100": "1"})))
        assert status == 200
        assert answer["response"]["allowed"]

        quotas.write_text(QUOTAS_YAML.replace("a100: 4", "a100: 6"))
        _wait_for(server, 1)  # a good edit after it applies
        quotas.write_text(hostile)
        _wait_for(server, 0)
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=EXIT_BOUND) == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()
        server.log.close()
    log = Path(server.log.name).read_text()
    assert "config not reloaded (gpuadm-quotas)" in log
    assert "Traceback" not in log
