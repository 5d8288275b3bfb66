"""GPU-hours records kept in ConfigMaps, one per tenant namespace, in gpuadm's namespace.

`gpuadm-gpu-hours-<namespace>`, labelled `gpuadm.io/gpu-hours-for: <namespace>`, holds the
namespace's `Hours` as JSON (`policies.gpu_hours.encode_hours`). Only the leader writes, with
the resourceVersion it read: a leader that lost the Lease and writes late is refused (409)
and counts nothing twice. Every replica, and `gpuadm usage`, lists them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from policies.gpu_hours import Hours, RecordError, decode_hours, encode_hours
from webhook.kube.errors import KubeError
from webhook.kube.objects import (
    HOURS_DATA_KEY,
    HOURS_RECORD_LABEL,
    MANAGED_BY,
    hours_record_name,
)
from webhook.kube.rest import AsyncApi


class Moved(Exception):
    """The record changed since it was read (another writer): read it again."""


@dataclass(frozen=True, slots=True)
class Stored:
    """A namespace's record as read: its hours, or why they cannot be read; its version."""

    namespace: str
    hours: Hours | RecordError
    version: str | None


def read_record(config_map: dict[str, Any]) -> Stored:
    """Read the record a ConfigMap holds; a record that cannot be read says why."""
    metadata = config_map.get("metadata") or {}
    labels = metadata.get("labels") or {}
    namespace = str(labels.get(HOURS_RECORD_LABEL) or "")
    version = metadata.get("resourceVersion")
    text = (config_map.get("data") or {}).get(HOURS_DATA_KEY)
    hours: Hours | RecordError
    try:
        if not isinstance(text, str):
            raise RecordError(f"it has no key {HOURS_DATA_KEY}")
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as error:
            raise RecordError(f"{HOURS_DATA_KEY} is not JSON: {error}") from None
        hours = decode_hours(data)
    except RecordError as error:
        hours = RecordError(
            f"ConfigMap {metadata.get('name')} cannot be read: {error}; fix or delete it "
            "(deleting it forgets the namespace's counted hours)"
        )
    return Stored(namespace, hours, str(version) if version else None)


class HoursStore:
    """The GPU-hours records, through the apiserver."""

    def __init__(self, api: AsyncApi, namespace: str) -> None:
        """Keep records in gpuadm's `namespace`, through `api`."""
        self.api = api
        self.namespace = namespace

    async def read_all(self, known: Mapping[str, Stored] | None = None) -> dict[str, Stored]:
        """Return every namespace's record, by tenant namespace. A record in `known` at the
        version listed is not decoded again: most records change at no checkpoint."""
        page = await self.api.list_configmaps(self.namespace, HOURS_RECORD_LABEL)
        records = {}
        for item in page.items:
            metadata = item.get("metadata") or {}
            namespace = str((metadata.get("labels") or {}).get(HOURS_RECORD_LABEL) or "")
            kept = (known or {}).get(namespace)
            if (
                kept is not None
                and kept.version
                and kept.version == metadata.get("resourceVersion")
            ):
                records[namespace] = kept
                continue
            stored = read_record(item)
            if stored.namespace:
                records[stored.namespace] = stored
        return records

    async def write(self, namespace: str, hours: Hours, version: str | None) -> str:
        """Create or replace a namespace's record at `version`; raise `Moved` if it changed.

        Returns the new version."""
        metadata: dict[str, Any] = {
            "name": hours_record_name(namespace),
            "namespace": self.namespace,
            "labels": {**MANAGED_BY, HOURS_RECORD_LABEL: namespace},
        }
        if version is not None:
            metadata["resourceVersion"] = version
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {HOURS_DATA_KEY: orjson.dumps(encode_hours(hours)).decode()},
        }
        call = self.api.create_configmap if version is None else self.api.replace_configmap
        try:
            stored = await call(self.namespace, body)
        except KubeError as error:
            if error.status == 409:
                raise Moved(namespace) from None
            raise
        return str(stored["metadata"]["resourceVersion"])
