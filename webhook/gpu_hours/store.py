"""GPU-hours records kept in ConfigMaps, one per tenant namespace, in gpuadm's namespace.

`gpuadm-gpu-hours-<namespace>` holds the namespace's `Hours` as JSON
(`policies.quota.gpu_hours.encode_hours`), labelled `gpuadm.io/gpu-hours-for: <namespace>`. A
record is found by its name, never by its label: every read lists the ConfigMaps of
gpuadm's namespace and keeps those whose name makes them records, so a record whose label
was taken off or changed is still read, never taken for none (the leader writes its labels
back: `Stored.labelled`). Only the leader writes, with the resourceVersion it read: a leader
that lost the Lease and writes late is refused (409) and counts nothing twice. A text
larger than `RECORD_MAX_BYTES` is never sent. Every replica, `gpuadm usage` and `gpuadm
quota` read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from policies.quota.gpu_hours import (
    RECORD_MAX_BYTES,
    Hours,
    RecordError,
    decode_hours,
    encode_hours,
)
from webhook.kube.errors import KubeError
from webhook.kube.objects import (
    HOURS_DATA_KEY,
    HOURS_RECORD_LABEL,
    HOURS_RECORD_PREFIX,
    MANAGED_BY,
    hours_record_name,
)
from webhook.kube.rest import AsyncApi


class Moved(Exception):
    """The record changed since it was read, or was created meanwhile: read it again."""


class RecordTooLarge(Exception):
    """A record's text is larger than `RECORD_MAX_BYTES`: it was not sent."""

    def __init__(self, namespace: str, size: int) -> None:
        super().__init__(
            f"its text takes {size} bytes, more than the {RECORD_MAX_BYTES} gpuadm writes"
        )
        self.namespace = namespace
        self.size = size


@dataclass(frozen=True, slots=True)
class Stored:
    """A namespace's record as read: its hours, or why they cannot be read; its version; and
    whether it carries the labels the leader writes (if not, the leader writes them back)."""

    namespace: str
    hours: Hours | RecordError
    version: str | None
    labelled: bool = True


def record_namespace(name: object) -> str | None:
    """Return the tenant namespace a ConfigMap's name makes it the record of, or None."""
    if not isinstance(name, str) or not name.startswith(HOURS_RECORD_PREFIX):
        return None
    return name[len(HOURS_RECORD_PREFIX) :] or None


def record_labels(namespace: str) -> dict[str, str]:
    """Return the labels the leader writes on a namespace's record."""
    return {**MANAGED_BY, HOURS_RECORD_LABEL: namespace}


def read_record(config_map: Mapping[str, Any]) -> Stored:
    """Read the record a ConfigMap named as one holds; a record that cannot be read says why."""
    metadata = config_map.get("metadata") or {}
    name = metadata.get("name")
    namespace = record_namespace(name) or ""
    labels = metadata.get("labels") or {}
    labelled = all(labels.get(key) == value for key, value in record_labels(namespace).items())
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
            f"ConfigMap {name} cannot be read: {error}; fix or delete it "
            "(deleting it forgets the namespace's counted hours)"
        )
    return Stored(namespace, hours, str(version) if version else None, labelled)


class HoursStore:
    """The GPU-hours records, through the apiserver."""

    def __init__(self, api: AsyncApi, namespace: str) -> None:
        """Keep records in gpuadm's `namespace`, through `api`."""
        self.api = api
        self.namespace = namespace

    async def read_all(self, known: Mapping[str, Stored] | None = None) -> dict[str, Stored]:
        """Return every namespace's record, by tenant namespace, found by name among all the
        ConfigMaps of gpuadm's namespace, labelled or not. A record in `known` at the
        version listed is not decoded again: most records change at no checkpoint."""
        page = await self.api.list_configmaps(self.namespace, "")
        records = {}
        for item in page.items:
            metadata = item.get("metadata") or {}
            namespace = record_namespace(metadata.get("name"))
            if namespace is None:
                continue
            kept = (known or {}).get(namespace)
            if (
                kept is not None
                and kept.version
                and kept.version == metadata.get("resourceVersion")
            ):
                records[namespace] = kept
            else:
                records[namespace] = read_record(item)
        return records

    async def read_one(self, namespace: str) -> Stored | None:
        """Return a namespace's record, read by its name; None if there is none."""
        found = await self.api.get_configmap(self.namespace, hours_record_name(namespace))
        return None if found is None else read_record(found)

    async def write(self, namespace: str, hours: Hours, version: str | None) -> str:
        """Create (`version` None) or replace a namespace's record at `version`, with its
        labels; raise `Moved` if it changed or exists already, `RecordTooLarge` if its text
        is larger than gpuadm writes.

        Returns the new version."""
        text = orjson.dumps(encode_hours(hours))
        if len(text) > RECORD_MAX_BYTES:
            raise RecordTooLarge(namespace, len(text))
        metadata: dict[str, Any] = {
            "name": hours_record_name(namespace),
            "namespace": self.namespace,
            "labels": record_labels(namespace),
        }
        if version is not None:
            metadata["resourceVersion"] = version
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {HOURS_DATA_KEY: text.decode()},
        }
        call = self.api.create_configmap if version is None else self.api.replace_configmap
        try:
            stored = await call(self.namespace, body)
        except KubeError as error:
            if error.status == 409:
                raise Moved(namespace) from None
            raise
        return str(stored["metadata"]["resourceVersion"])
