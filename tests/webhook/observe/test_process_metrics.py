"""Readiness and the process's memory, exported as metrics and read at each scrape."""

from __future__ import annotations

import asyncio
import os

from tests.builders import POLICY_YAML
from tests.webhook.calls import MakeClient
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.observe.metrics import Metrics, resident_memory_bytes
from webhook.server.app import create_app
from webhook.server.lifecycle import Background, Progress, Supervisor
from webhook.server.settings import Settings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_ready_follows_readyz(aiohttp_client: MakeClient) -> None:
    clock = Clock()
    metrics = Metrics()
    beat: list[Progress] = []

    async def watch(progress: Progress) -> None:
        beat.append(progress)
        progress()
        await asyncio.Event().wait()

    holder = ConfigHolder(
        snapshot_from_text(POLICY_YAML, None, policy_source="p", quotas_source="q")
    )
    app = create_app(
        Settings(),
        holder,
        metrics=metrics,
        supervisor=Supervisor(metrics, clock=clock),
        background=[Background("configmaps", watch, stale_after=90)],
    )
    client = await aiohttp_client(app)
    for _ in range(100):
        if beat:
            break
        await asyncio.sleep(0.01)

    async def scraped() -> str:
        return await (await client.get("/metrics")).text()

    assert (await client.get("/readyz")).status == 200
    assert "gpuadm_ready 1.0" in await scraped()
    clock.now += 91  # the watch stalls: /readyz fails, and so does the metric
    assert (await client.get("/readyz")).status == 503
    assert "gpuadm_ready 0.0" in await scraped()
    beat[0]()
    assert "gpuadm_ready 1.0" in await scraped()


def test_ready_is_0_until_an_app_says_how_it_is_ready() -> None:
    assert Metrics().registry.get_sample_value("gpuadm_ready") == 0


def test_resident_memory_is_the_process_s() -> None:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    vm_rss = int(line.split()[1]) * 1024
    exported = Metrics().registry.get_sample_value("gpuadm_process_resident_memory_bytes")
    assert exported is not None
    # Two reads a moment apart of a live process: the same within a few MiB.
    assert abs(exported - vm_rss) < 16 * 2**20
    assert resident_memory_bytes() > 0
    assert os.sysconf("SC_PAGE_SIZE") > 0


def test_no_created_series_beside_the_counters_and_histograms() -> None:
    metrics = Metrics()
    metrics.requests.labels("validate", "CREATE", "allowed").inc()
    text = metrics.exposition().decode()
    assert "gpuadm_admission_requests_total" in text
    assert "_created" not in text
