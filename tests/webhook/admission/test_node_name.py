"""A pod created with spec.nodeName in a queue namespace: the apiserver refuses a scheduling
gate on a pod already bound to a node, so gpuadm gives it none and judges it as in enforce."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest

from tests.builders import POLICY_YAML, pod, review
from tests.webhook.calls import Client, MakeClient, decoded_patch, post
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.server.app import create_app
from webhook.server.settings import Settings

# h100 (the nvidia backend) has no scheduler of its own, so gpuadm lets its pods set nodeName.
QUOTAS = """
namespaces:
  team-q: {mode: queue, h100: 1}
"""


@pytest.fixture
def ledger() -> QuotaLedger:
    return QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False)


@pytest.fixture
async def client(aiohttp_client: MakeClient, ledger: QuotaLedger) -> Client:
    snapshot = snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")
    return await aiohttp_client(create_app(Settings(), ConfigHolder(snapshot), quota=ledger))


async def create_bound(client: Client, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Send a pod bound to a node through /mutate, then, as stored, through /validate: the
    pod as stored, and what /validate answered."""
    body = pod({"gpuadm.io/h100": "1"}, nodeName="node-1")
    body["metadata"].update(name=name, namespace="team-q", uid=f"uid-{name}")
    mutated = await post(client, "/mutate", review(body, namespace="team-q", uid=f"m-{name}"))
    assert mutated["allowed"] is True, mutated
    stored: dict[str, Any] = jsonpatch.apply_patch(body, decoded_patch(mutated))
    validated = await post(client, "/validate", review(stored, namespace="team-q", uid=f"v-{name}"))
    return stored, validated


async def test_a_pod_with_node_name_gets_no_gate_and_is_charged_or_refused_as_in_enforce(
    client: Client, ledger: QuotaLedger
) -> None:
    first, validated = await create_bound(client, "first")
    assert "schedulingGates" not in first["spec"]
    assert validated["allowed"] is True
    assert ledger.book.in_use("team-q") == {"h100": 1}

    # The quota is full: refused, not queued behind a gate.
    second, validated = await create_bound(client, "second")
    assert "schedulingGates" not in second["spec"]
    assert validated["allowed"] is False
    assert validated["status"]["message"].startswith(
        'namespace "team-q": h100 quota exceeded: requested 1, in use 1 of 1'
    )
    assert ledger.book.in_use("team-q") == {"h100": 1}


async def test_a_pod_with_node_name_refused_in_a_queue_namespace_is_told_what_enforce_says(
    client: Client,
) -> None:
    await create_bound(client, "first")
    _, validated = await create_bound(client, "second")
    assert validated["allowed"] is False
    assert validated["status"]["message"] == (
        'namespace "team-q": h100 quota exceeded: requested 1, in use 1 of 1'
    )
