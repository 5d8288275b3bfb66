"""The chart's memory limit holds against every flood a neighbour can send a real replica.

`gpuadm serve` runs as a process, and each flood goes at it over TLS, as a tenant that can
reach the port would send it: compressed bombs, reviews of tiny objects (few bytes, a lot
to decode), heavy reviews that fit the budget, more connections than it serves, and
senders that stall. Meanwhile an established connection, as the apiserver keeps one, gets
its small reviews answered; at the end the process's peak resident memory is under 512 MiB.
"""

from __future__ import annotations

import asyncio
import gzip
import re
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.builders import POLICY_YAML, QUOTAS_YAML, pod, review
from tests.support import ServeProcess
from webhook.reviews.request import decoded_weight
from webhook.server.budget import LARGE_DECODE_BYTES, MiB
from webhook.server.listener import MAX_CONNECTIONS

# The chart's limit (deploy/helm/gpuadm/values.yaml, resources.limits.memory).
CHART_LIMIT = 512 * MiB
JSON = {"Content-Type": "application/json"}
# Connections opened at once in the connection flood: 176 more than a replica serves.
OPENED = 1200


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServeProcess]:
    policy, quotas = tmp_path / "policy.yaml", tmp_path / "quotas.yaml"
    policy.write_text(POLICY_YAML)
    quotas.write_text(QUOTAS_YAML)
    running = ServeProcess(tmp_path, policy, quotas)
    yield running
    running.stop()


def peak_resident_bytes(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM)."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^VmHWM:\s+(\d+) kB$", status, re.M)
    assert found is not None
    return int(found.group(1)) * 1024


def stuffed(objects: int, uid: str) -> bytes:
    """A GPU pod's review whose status holds `objects` empty objects."""
    body = review(pod({"gpuadm.io/h100": "1"}), uid=uid)
    body["request"]["object"]["status"] = {"conditions": [{}] * objects}
    return orjson.dumps(body)


class Neighbour:
    """The flood's sender, and the apiserver's one established connection beside it."""

    def __init__(self, server: ServeProcess) -> None:
        self.base = f"https://localhost:{server.port}"
        self.ssl = server.ssl
        self.flood = aiohttp.ClientSession(self.base, connector=aiohttp.TCPConnector(limit=0))
        # One connection, opened first and kept, as the apiserver keeps its pool.
        self.apiserver = aiohttp.ClientSession(
            self.base, connector=aiohttp.TCPConnector(limit=1, keepalive_timeout=600)
        )
        self.answered = 0

    async def close(self) -> None:
        await self.flood.close()
        await self.apiserver.close()

    async def send(self, path: str, body: bytes, headers: dict[str, str] = JSON) -> int:
        async with self.flood.post(path, data=body, headers=headers, ssl=self.ssl) as answer:
            await answer.read()
            return answer.status

    async def small_review(self) -> None:
        uid = f"small-{self.answered}"
        body = orjson.dumps(review(pod({"gpuadm.io/h100": "1"}), uid=uid))
        async with self.apiserver.post("/mutate", data=body, headers=JSON, ssl=self.ssl) as a:
            assert a.status == 200, await a.text()
            decided: dict[str, Any] = (await a.json())["response"]
        assert decided["uid"] == uid
        assert decided["allowed"] is True
        self.answered += 1

    async def meanwhile(self, *flood: Any) -> list[Any]:
        """Run the flood; answer small reviews on the kept connection until it is over."""
        running = asyncio.gather(*flood)
        while not running.done():
            await self.small_review()
            await asyncio.sleep(0.02)
        return list(await running)


async def _floods(server: ServeProcess) -> Neighbour:
    neighbour = Neighbour(server)
    await neighbour.small_review()
    paths = ("/mutate", "/validate")

    # 1. Compressed bombs: 7 KiB on the wire, 7 MiB inflated, refused unread.
    bomb = gzip.compress(b"[" + b"{}," * (7 * MiB // 3) + b"{}]", compresslevel=9)
    assert len(bomb) < 64 * 1024
    gzipped = JSON | {"Content-Encoding": "gzip"}
    statuses = await neighbour.meanwhile(
        *(neighbour.send(path, bomb, gzipped) for path in paths for _ in range(6))
    )
    assert statuses == [415] * 12

    # 2. Reviews of tiny objects at the size limit: 168 MiB each to decode, refused undecoded.
    tiny = stuffed(2_300_000, "tiny")
    assert len(tiny) > 6 * MiB
    statuses = await neighbour.meanwhile(
        *(neighbour.send(path, tiny) for path in paths for _ in range(4))
    )
    assert statuses == [413] * 8

    # 3. Heavy reviews that fit the budget: decoded and judged, one at a time.
    heavy = stuffed(450_000, "heavy")
    assert decoded_weight(heavy) <= LARGE_DECODE_BYTES
    statuses = await neighbour.meanwhile(
        *(neighbour.send(path, heavy) for path in paths for _ in range(6))
    )
    assert statuses == [200] * 12

    # 4. More connections than a replica serves, each through its handshake and then idle.
    client_tls = ssl.create_default_context(cafile=server.tls_dir / "ca.crt")

    async def connect() -> asyncio.StreamWriter:
        _, writer = await asyncio.open_connection(
            "localhost", server.port, ssl=client_tls, limit=1024
        )
        return writer

    writers: list[asyncio.StreamWriter] = []
    for _ in range(OPENED // 100):
        writers += await neighbour.meanwhile(*(connect() for _ in range(100)))
    await neighbour.small_review()
    for writer in writers:
        writer.close()

    # 5. Senders that announce 100 kB and stall, beside a legitimate review of 66 KB.
    stalled = []
    for _ in range(2):
        _, writer = await asyncio.open_connection("localhost", server.port, ssl=client_tls)
        writer.write(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n{"
        )
        stalled.append(writer)
    large = review(pod({"gpuadm.io/h100": "1"}, annotations={"big": "x" * 66_000}), uid="66k")
    async with neighbour.apiserver.post(
        "/mutate", data=orjson.dumps(large), headers=JSON, ssl=neighbour.ssl
    ) as answer:
        assert answer.status == 200
        assert (await answer.json())["response"]["uid"] == "66k"
    for writer in stalled:
        writer.close()
    await neighbour.small_review()
    await neighbour.close()
    return neighbour


def test_a_replica_stays_under_the_charts_memory_limit_and_keeps_answering(
    server: ServeProcess,
) -> None:
    neighbour = asyncio.run(_floods(server))
    assert neighbour.answered > 10
    refused = re.search(r"^gpuadm_connections_refused_total (\S+)$", server.get("/metrics"), re.M)
    assert refused is not None
    assert float(refused.group(1)) >= OPENED - MAX_CONNECTIONS
    peak = peak_resident_bytes(server.process.pid)
    assert peak < CHART_LIMIT, f"peak resident memory {peak / MiB:.0f} MiB"
