"""Forged reviews for made-up namespaces leave nothing behind: no record, no metric series.

The suite's replicas answer only the apiserver's client certificate; these reviews present
it, as a forger would who got hold of it, or as anyone can where `--client-ca-file` is off.
The apiserver never sends a pod create for a namespace that does not exist, so gpuadm asks
before it judges, and writes nothing for such a namespace.
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from typing import Any

import aiohttp
import jsonpatch

from policies import load_policy, plan
from tests.builders import POLICY_YAML, pod, review
from tests.e2e.cluster import ControlPlane
from tests.e2e.fixtures import NO_QUOTAS, Deployment
from tests.e2e.gpuadm import NAMESPACE

FORGED_NAMESPACES = 2000
PREFIX = "forged-"
# Concurrent forged requests: enough to keep one replica busy, few enough for two cores.
CONCURRENCY = 32


def stored_gpu_pod() -> dict[str, Any]:
    """Return an h100 pod as gpuadm's mutating webhook would have it stored."""
    body = pod({"gpuadm.io/h100": "1"})
    stored: dict[str, Any] = jsonpatch.apply_patch(body, plan(body, load_policy(POLICY_YAML)).patch)
    return stored


async def _forge(port: int, context: ssl.SSLContext, count: int) -> list[dict[str, Any]]:
    url = f"https://127.0.0.1:{port}/validate"
    gate = asyncio.Semaphore(CONCURRENCY)
    stored = stored_gpu_pod()
    async with aiohttp.ClientSession() as session:

        async def one(index: int) -> dict[str, Any]:
            namespace = f"{PREFIX}{index}-{uuid.uuid4().hex[:6]}"
            body = {**stored, "metadata": {**stored["metadata"], "namespace": namespace}}
            body["metadata"]["uid"] = str(uuid.uuid4())
            forged = review(body, namespace=namespace, uid=f"forged-{index}")
            async with gate, session.post(url, json=forged, ssl=context) as response:
                assert response.status == 200, await response.text()
                answer: dict[str, Any] = (await response.json())["response"]
                return answer

        return await asyncio.gather(*(one(index) for index in range(count)))


def test_forged_reviews_for_made_up_namespaces_leave_nothing_behind(
    gpuadm: Deployment, control_plane: ControlPlane
) -> None:
    # A default limit, so that every namespace's pods are judged and would be reserved.
    gpuadm.set_quotas("default: {h100: 1}\n")
    try:
        target = gpuadm.processes[0]
        lines_before = len(target.metrics().splitlines())
        context = ssl.create_default_context(cafile=gpuadm.ca_file)
        context.load_cert_chain(*control_plane.webhook_client_files)
        answers = asyncio.run(_forge(target.port, context, FORGED_NAMESPACES))
    finally:
        gpuadm.set_quotas(NO_QUOTAS)

    assert {a["allowed"] for a in answers} == {False}
    assert all("does not exist" in a["status"]["message"] for a in answers)
    assert {a["uid"] for a in answers} == {f"forged-{i}" for i in range(FORGED_NAMESPACES)}
    records = gpuadm.core.list_namespaced_config_map(
        NAMESPACE, label_selector="gpuadm.io/usage-for", _preload_content=False
    )
    assert PREFIX not in records.data.decode()
    metrics = target.metrics()
    assert PREFIX not in metrics
    # New lines are new label values of the request counters and the latency histogram's
    # buckets, a few dozen at most; before, every forged namespace added two series.
    assert len(metrics.splitlines()) - lines_before < 100
