"""An apiserver's ConfigMaps in memory, as the GPU-hours records meet them: versions, 409 on
a stale write or a second create, lists by label or of every ConfigMap, a get by name, and
the apiserver's refusal of a ConfigMap whose values take more than 1 MiB."""

from __future__ import annotations

import copy
from typing import Any

import orjson

from policies.quota.gpu_hours import Hours, decode_hours
from webhook.kube.endpoint import Endpoint
from webhook.kube.errors import KubeError
from webhook.kube.objects import HOURS_DATA_KEY, Page, hours_record_name
from webhook.kube.rest import AsyncApi

# The apiserver refuses a ConfigMap whose values take more than this (422, "Too long").
CONFIGMAP_MAX_BYTES = 1024 * 1024


class ConfigMaps(AsyncApi):
    """ConfigMaps of one namespace, kept as an apiserver keeps them."""

    def __init__(self) -> None:
        super().__init__(Endpoint("https://127.0.0.1:9", None, None, None, False, lambda: None))
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.writes = 0
        self.refused: list[KubeError] = []

    def _store(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        size = sum(len(value.encode()) for value in (body.get("data") or {}).values())
        if size > CONFIGMAP_MAX_BYTES:
            error = KubeError(
                422,
                f'ConfigMap "{name}" is invalid: []: Too long: may not be more than '
                f"{CONFIGMAP_MAX_BYTES} bytes",
            )
            self.refused.append(error)
            raise error
        self.version += 1
        self.writes += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.objects[name] = stored
        return copy.deepcopy(stored)

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get(name)
        return None if found is None else copy.deepcopy(found)

    async def create_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        if body["metadata"]["name"] in self.objects:
            raise KubeError(409, f'configmaps "{body["metadata"]["name"]}" already exists')
        return self._store(body)

    async def replace_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        found = self.objects.get(body["metadata"]["name"])
        if found is None or found["metadata"]["resourceVersion"] != body["metadata"].get(
            "resourceVersion"
        ):
            raise KubeError(409, "the object has been modified")
        return self._store(body)

    async def list_configmaps(self, namespace: str, label_selector: str) -> Page:
        # Only the "has this label" selectors gpuadm sends, or none.
        items = [
            copy.deepcopy(o)
            for o in self.objects.values()
            if not label_selector or label_selector in (o["metadata"].get("labels") or {})
        ]
        return Page(items, str(self.version), None)

    def hours(self, namespace: str) -> Hours:
        """Return a namespace's record as stored."""
        data = self.objects[hours_record_name(namespace)]["data"][HOURS_DATA_KEY]
        return decode_hours(orjson.loads(data))

    def labels(self, namespace: str) -> dict[str, str]:
        """Return the labels of a namespace's record as stored."""
        labels: dict[str, str] = (
            self.objects[hours_record_name(namespace)]["metadata"].get("labels") or {}
        )
        return labels
