"""The GPUQuota objects against a stand-in for the apiserver that keeps its rules for a custom
resource: a create of a name that exists is a 409, and an update must name the object's
current resourceVersion (none at all is a 422, an old one a 409)."""

from __future__ import annotations

import copy
import itertools
from fractions import Fraction
from typing import Any

from tests.builders import POLICY_YAML
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi
from webhook.leader.publish import CLASS_LABEL, QuotaPublisher
from webhook.quota.holdings import Holding
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex

QUOTAS = """
namespaces:
  team-q: {mode: queue, a100: 1}
"""


class GPUQuotas:
    """GPUQuota objects by (namespace, name), each stored at its own resourceVersion."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self._versions = itertools.count(1)
        # Objects another writer stores just after this leader lists what is published.
        self.written_after_list: list[dict[str, Any]] = []

    def store(self, body: dict[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[stored["metadata"]["namespace"], stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    async def list_all(self, path: str, label_selector: str) -> list[dict[str, Any]]:
        assert path.endswith("/gpuquotas")
        listed = [copy.deepcopy(o) for o in self.objects.values()]
        for body in self.written_after_list:
            self.store(body)
        self.written_after_list = []
        return listed

    async def get_quota_status(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def create_quota_status(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if (namespace, name) in self.objects:
            raise KubeError(409, f'gpuquotas.gpuadm.io "{name}" already exists')
        return self.store(body)

    async def replace_quota_status(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        current = self.objects.get((namespace, name))
        if current is None:
            raise KubeError(404, f'gpuquotas.gpuadm.io "{name}" not found')
        version = body["metadata"].get("resourceVersion")
        if not version:
            raise KubeError(
                422,
                f'GPUQuota.gpuadm.io "{name}" is invalid: metadata.resourceVersion: Invalid '
                "value: 0x0: must be specified for an update",
            )
        if version != current["metadata"]["resourceVersion"]:
            raise KubeError(
                409,
                f'Operation cannot be fulfilled on gpuquotas.gpuadm.io "{name}": the object '
                "has been modified; please apply your changes to the latest version and try "
                "again",
            )
        return self.store(body)

    async def delete_quota_status(self, namespace: str, name: str) -> None:
        self.objects.pop((namespace, name), None)


def publisher(api: GPUQuotas) -> QuotaPublisher:
    snapshot = snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")
    usage = UsageIndex()
    usage.replace_all({"uid-trainer": Holding("team-q", "a100", Fraction(1, 2), "trainer")}, now=0)
    stand_in: Any = api
    typed: AsyncApi = stand_in
    return QuotaPublisher(
        QuotaLedger(usage, MemoryStore(), pods_visible=True).line,
        usage,
        ConfigHolder(snapshot),
        typed,
        ready=lambda: True,
    )


async def test_an_object_an_earlier_leader_wrote_is_replaced_at_its_own_resource_version() -> None:
    api = GPUQuotas()
    # The earlier leader, its lease just lost, writes once more after this leader listed: the
    # create finds the object there (409).
    api.written_after_list.append(
        {
            "apiVersion": "gpuadm.io/v1alpha1",
            "kind": "GPUQuota",
            "metadata": {
                "name": "a100",
                "namespace": "team-q",
                "labels": {CLASS_LABEL: "a100"},
            },
            "status": {"class": "a100", "mode": "queue", "inUse": "1", "limit": "1"},
        }
    )
    await publisher(api).pass_once()
    stored = api.objects["team-q", "a100"]
    assert stored["status"]["inUse"] == "0.5"
    assert stored["status"]["holders"] == [{"pod": "trainer", "gpus": "0.5"}]
    assert stored["metadata"]["resourceVersion"] != "1"
