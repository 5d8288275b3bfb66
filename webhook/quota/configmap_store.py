"""Reservation records kept in ConfigMaps, shared by every replica through the apiserver.

One ConfigMap per tenant namespace, `gpuadm-usage-<namespace>`, in gpuadm's own namespace.
Writes carry the resourceVersion that was read; the apiserver refuses a stale one with 409,
which is exactly the compare-and-swap the ledger needs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from webhook.kube.client import MANAGED_BY, USAGE_RECORD_LABEL, Kube, KubeError
from webhook.kube.rest import AsyncApi
from webhook.quota.reservations import EMPTY, Conflict, Record, Reservation

DATA_KEY = "reservations.json"


def record_name(namespace: str) -> str:
    """Name the ConfigMap that holds a tenant namespace's reservations."""
    return f"gpuadm-usage-{namespace}"


def record_of(config_map: dict[str, Any]) -> Record:
    """Read the record a ConfigMap holds."""
    raw = orjson.loads((config_map.get("data") or {}).get(DATA_KEY) or "{}")
    reservations = {uid: Reservation.from_json(entry) for uid, entry in raw.items()}
    return Record(reservations, config_map["metadata"]["resourceVersion"])


class ConfigMapStore:
    """A `ReservationStore` on ConfigMaps in gpuadm's namespace."""

    def __init__(self, kube: Kube, api: AsyncApi, namespace: str) -> None:
        """Keep records in `namespace`: reads and writes on the admission path through `api`,
        listing and deleting (pruning, off that path) through `kube`."""
        self.kube = kube
        self.api = api
        self.namespace = namespace

    async def read(self, namespace: str) -> Record:
        """Return the tenant namespace's record; a missing ConfigMap is an empty record."""
        found = await self.api.get_configmap(self.namespace, record_name(namespace))
        return EMPTY if found is None else record_of(found)

    async def write(
        self, namespace: str, reservations: dict[str, Reservation], version: str | None
    ) -> str:
        """Create or replace the record at `version`; raise `Conflict` if it moved on."""
        metadata: dict[str, Any] = {
            "name": record_name(namespace),
            "namespace": self.namespace,
            "labels": {**MANAGED_BY, USAGE_RECORD_LABEL: namespace},
        }
        if version is not None:
            metadata["resourceVersion"] = version
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {
                DATA_KEY: orjson.dumps(
                    {uid: r.to_json() for uid, r in sorted(reservations.items())}
                ).decode()
            },
        }
        call = self.api.create_configmap if version is None else self.api.replace_configmap
        try:
            stored = await call(self.namespace, body)
        except KubeError as error:
            if error.status == 409:
                raise Conflict(namespace) from None
            raise
        return str(stored["metadata"]["resourceVersion"])

    async def delete(self, namespace: str, version: str) -> None:
        """Delete the record if it is still at `version`; raise `Conflict` if it moved on."""
        try:
            await asyncio.to_thread(
                self.kube.delete_configmap,
                self.namespace,
                record_name(namespace),
                resource_version=version,
            )
        except KubeError as error:
            if error.status == 409:
                raise Conflict(namespace) from None
            if error.status != 404:  # gone already: what deleting wanted
                raise

    async def namespaces(self) -> list[str]:
        """Return the tenant namespaces that have a record, by the records' label."""
        page = await asyncio.to_thread(
            self.kube.list_configmaps, self.namespace, label_selector=USAGE_RECORD_LABEL
        )
        return [str(m["metadata"]["labels"][USAGE_RECORD_LABEL]) for m in page.items]
