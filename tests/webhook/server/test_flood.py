"""A flood of large, distinct pods: memory stays bounded and small reviews are still answered.

A tenant can send pods of about a megabyte each (thousands of containers), every one of them
different, as fast as `kubectl create --dry-run=server` goes. gpuadm plans each (linear in
the pod, off the event loop), remembers none of them for long (the plan memo is bounded in
bytes), and keeps answering ordinary reviews correctly meanwhile.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.builders import POLICY_YAML, QUOTAS_YAML, large_pod, pod, review
from tests.support import ServeProcess
from webhook.config.plan_memo import MAX_MEMO_BYTES

MiB = 1024 * 1024
FLOOD_PODS = 12
# Before the memo was bounded in bytes, each of these pods stayed in memory at 4 to 6 MiB,
# so two floods grew the process by about 130 MiB. Now the first floods set the working set
# (a few large reviews in flight at a time) and later floods reuse it; what is left varies
# with how the allocator's free lists fall (15 to 45 MiB over two floods in repeated runs),
# so the bound sits halfway between that and the unbounded growth.
SETTLING_FLOODS = 2
MEASURED_FLOODS = 2
ALLOWED_GROWTH = 64 * MiB


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServeProcess]:
    policy, quotas = tmp_path / "policy.yaml", tmp_path / "quotas.yaml"
    policy.write_text(POLICY_YAML)
    quotas.write_text(QUOTAS_YAML)
    running = ServeProcess(tmp_path, policy, quotas)
    yield running
    running.stop()


async def _flood(server: ServeProcess, large: list[bytes]) -> list[dict[str, Any]]:
    """Send the large reviews all at once, and small ones while they are being planned."""
    url = f"https://localhost:{server.port}/mutate"
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:

        async def send(body: bytes) -> dict[str, Any]:
            async with session.post(url, data=body, headers=headers, ssl=server.ssl) as answer:
                assert answer.status == 200, await answer.text()
                decided: dict[str, Any] = (await answer.json())["response"]
                return decided

        async def small_ones() -> list[dict[str, Any]]:
            answers = []
            for index in range(20):
                small = review(pod({"gpuadm.io/h100": "1"}), uid=f"small-{index}")
                answers.append(await send(orjson.dumps(small)))
            return answers

        flood = asyncio.gather(*(send(body) for body in large))
        small = await small_ones()
        for answer in await flood:
            assert answer["allowed"] is True
        return small


def test_a_flood_of_large_distinct_pods_leaves_memory_bounded(server: ServeProcess) -> None:
    def reviews(count: int) -> list[bytes]:
        return [orjson.dumps(review(large_pod(uuid.uuid4().hex[:8]))) for _ in range(count)]

    assert len(reviews(1)[0]) > 800 * 1024
    for _ in range(SETTLING_FLOODS):
        asyncio.run(_flood(server, reviews(FLOOD_PODS)))
    settled = server.resident_bytes()
    for _ in range(MEASURED_FLOODS):
        small = asyncio.run(_flood(server, reviews(FLOOD_PODS)))
    growth = server.resident_bytes() - settled
    assert growth < ALLOWED_GROWTH, f"grew by {growth / MiB:.0f} MiB over {MEASURED_FLOODS} floods"

    for index, answer in enumerate(small):
        assert answer["uid"] == f"small-{index}"
        assert answer["allowed"] is True
        assert answer["patchType"] == "JSONPatch"
    memo_bytes = re.search(r"^gpuadm_plan_memo_bytes (\S+)$", server.get("/metrics"), re.M)
    assert memo_bytes is not None
    assert float(memo_bytes.group(1)) <= MAX_MEMO_BYTES
