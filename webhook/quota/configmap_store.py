"""Reservation records kept in ConfigMaps, shared by every replica through the apiserver.

One ConfigMap per tenant namespace, `gpuadm-usage-<namespace>`, in gpuadm's own namespace.
Writes carry the resourceVersion that was read; the apiserver refuses a stale one with 409,
which is exactly the compare-and-swap the reservation book needs.

The record's format, and why a replica of 0.1.0 never misreads it:

- 0.1.0 wrote `reservations.json` as a mapping of pod uid to reservation, and nothing else.
  It counts every reservation of the last 90 s, and knows neither the watermark of the
  reservations that left the record as their pods were shown (`shown.json`) nor the room set
  aside for replicas (`allowances.json`). Given a record with either, it would count too
  little and admit past a limit.
- So this format (`format: "2"`) writes `reservations.json` as a list of reservations, each
  with its uid. 0.1.0 reads that key as a mapping, fails on a list, and refuses the pod with
  "gpuadm failed to judge this request; retry"; it never writes a record it failed to read.
  While both run (a `helm upgrade`), a namespace whose record this version wrote is judged
  by this version's replicas alone, and 0.1.0's refuse there: never an admission past a
  limit.
- This version reads 0.1.0's mapping as it is (no mark, no room aside: every reservation of
  the last 90 s counts) and writes it back in its own format.
- A record of a format this version does not know (a later one) is not read at all:
  `UnreadableRecord`, and the pod is refused with "retry", as 0.1.0 does with this one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from policies.quota.cohorts import is_cohort_key
from webhook.kube.errors import KubeError
from webhook.kube.objects import MANAGED_BY, USAGE_RECORD_LABEL
from webhook.kube.rest import AsyncApi
from webhook.quota.reservations import (
    EMPTY,
    NO_MARK,
    Allowance,
    Conflict,
    Mark,
    Record,
    RecordFull,
    Reservation,
    UnreadableRecord,
)

if TYPE_CHECKING:
    from webhook.observe.metrics import Metrics

DATA_KEY = "reservations.json"
# The record's format; absent in 0.1.0's records.
FORMAT_KEY = "format"
FORMAT = "2"
# A cohort's record, shared by its members (`policies.quota.cohorts`): each reservation names
# the namespace it charges. A replica that knows only format 2 refuses to read it, and so
# never writes it back without those names.
COHORT_FORMAT = "3"
FORMATS = (FORMAT, COHORT_FORMAT)
# The watermark of the reservations that left the record as their pods were shown; absent
# while none has (`Mark`).
MARK_KEY = "shown.json"
# The room set aside for replicas to admit from without a write, by replica; absent while
# none is (`Allowance`).
ALLOWANCES_KEY = "allowances.json"
# The apiserver refuses a ConfigMap whose values take more than 1 MiB in all.
RECORD_MAX_BYTES = 1024 * 1024


def record_name(namespace: str) -> str:
    """Name the ConfigMap that holds a tenant namespace's reservations (or a cohort's, by
    its key `cohort.<name>`: a namespace's name has no dot)."""
    return f"gpuadm-usage-{namespace}"


class RecordText:
    """Encodes records as JSON, each reservation once.

    A record holds every reservation of the last 90 s and is written whole at each
    admission, while a write adds one reservation or a few: each namespace's reservations
    are kept with their text from its last write, and only new ones are encoded. A
    reservation is reused only if it is the very object encoded before (reservations are
    immutable), so the text is always that of the reservation written.
    """

    def __init__(self) -> None:
        # Per namespace, each reservation last written with its text.
        self._encoded: dict[str, dict[str, tuple[Reservation, bytes]]] = {}

    def encode(self, namespace: str, reservations: Mapping[str, Reservation]) -> bytes:
        """Return the record's JSON: the same bytes as encoding the whole list at once, in
        the mapping's order (readers parse it, so the order carries nothing)."""
        before = self._encoded.get(namespace, {})
        encoded = {
            uid: (
                known
                if (known := before.get(uid)) is not None and known[0] is reservation
                else (reservation, _entry(uid, reservation))
            )
            for uid, reservation in reservations.items()
        }
        self._encoded[namespace] = encoded
        return b"[" + b",".join([text for _, text in encoded.values()]) + b"]"

    def forget(self, namespace: str) -> None:
        """Drop what is kept of a namespace whose record is gone."""
        self._encoded.pop(namespace, None)

    def namespaces(self) -> list[str]:
        """Return the namespaces whose reservations' text is kept."""
        return list(self._encoded)

    def keep_only(self, namespaces: Iterable[str]) -> None:
        """Drop what is kept of every namespace but these, whose records exist: another
        replica may have deleted the others' (and their namespaces may be gone)."""
        keep = set(namespaces)
        self._encoded = {
            namespace: entries for namespace, entries in self._encoded.items() if namespace in keep
        }


def _entry(uid: str, reservation: Reservation) -> bytes:
    """Return one reservation as the record's list holds it: its uid, then its fields."""
    return orjson.dumps({"uid": uid, **reservation.to_json()})


def body_size(body: dict[str, Any], text: bytes) -> int:
    """Return the length of `orjson.dumps(body)` once the record's `text` is its data value
    (the body's data holds an empty string in its place), without encoding the record again.

    Inside a JSON string, orjson escapes a quote or a backslash with one more byte, and
    control characters, which the record's own JSON never holds raw; other bytes, UTF-8
    included, are written as they are.
    """
    return len(orjson.dumps(body)) + len(text) + text.count(b'"') + text.count(b"\\")


def record_of(config_map: dict[str, Any]) -> Record:
    """Read the record a ConfigMap holds, in this format or 0.1.0's; raise `UnreadableRecord`
    for any other, or for one that is not what this format writes."""
    metadata = config_map.get("metadata") or {}
    data = config_map.get("data") or {}
    namespace = str((metadata.get("labels") or {}).get(USAGE_RECORD_LABEL, metadata.get("name")))
    written = data.get(FORMAT_KEY)
    if written is not None and written not in FORMATS:
        raise UnreadableRecord(
            namespace,
            f"it is in format {written!r}, of a later gpuadm; this one reads "
            f"{' and '.join(FORMATS)}",
        )
    try:
        raw = orjson.loads(data.get(DATA_KEY) or "[]")
        if written is None and isinstance(raw, dict):  # 0.1.0's mapping of uid to reservation
            entries = [{**entry, "uid": uid} for uid, entry in raw.items()]
        elif isinstance(raw, list):
            entries = raw
        else:
            raise ValueError(f"{DATA_KEY} is neither a list nor 0.1.0's mapping")
        reservations = {str(entry["uid"]): Reservation.from_json(entry) for entry in entries}
        mark = Mark.from_json(orjson.loads(data[MARK_KEY])) if MARK_KEY in data else NO_MARK
        allowances = {
            str(holder): Allowance.from_json(entry)
            for holder, entry in orjson.loads(data.get(ALLOWANCES_KEY) or "{}").items()
        }
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        reason = f"{type(error).__name__}: {error}" if isinstance(error, KeyError) else error
        raise UnreadableRecord(namespace, f"it is not a record gpuadm wrote ({reason})") from None
    return Record(reservations, metadata["resourceVersion"], mark, allowances)


class ConfigMapStore:
    """A `ReservationStore` on ConfigMaps in gpuadm's namespace."""

    def __init__(self, api: AsyncApi, namespace: str, *, metrics: Metrics | None = None) -> None:
        """Keep records in `namespace`, read, written, listed and deleted through `api`;
        count the bytes of each write's body in `metrics`."""
        self.api = api
        self.namespace = namespace
        self.text = RecordText()
        self._metrics = metrics

    async def read(self, namespace: str) -> Record:
        """Return the tenant namespace's record; a missing ConfigMap is an empty record."""
        found = await self.api.get_configmap(self.namespace, record_name(namespace))
        return EMPTY if found is None else record_of(found)

    async def write(
        self,
        namespace: str,
        reservations: dict[str, Reservation],
        version: str | None,
        mark: Mark = NO_MARK,
        allowances: Mapping[str, Allowance] | None = None,
    ) -> str:
        """Create or replace the record at `version`; raise `Conflict` if it moved on, and
        `RecordFull`, writing nothing, if it is larger than a ConfigMap may be."""
        text = self.text.encode(namespace, reservations)
        marked = orjson.dumps(mark.to_json()).decode() if mark != NO_MARK else None
        set_aside = (
            orjson.dumps({holder: a.to_json() for holder, a in allowances.items()}).decode()
            if allowances
            else None
        )
        if len(text) + len(marked or "") + len(set_aside or "") > RECORD_MAX_BYTES:
            raise RecordFull(namespace, len(reservations), RECORD_MAX_BYTES)
        metadata: dict[str, Any] = {
            "name": record_name(namespace),
            "namespace": self.namespace,
            "labels": {**MANAGED_BY, USAGE_RECORD_LABEL: namespace},
        }
        if version is not None:
            metadata["resourceVersion"] = version
        data = {FORMAT_KEY: COHORT_FORMAT if is_cohort_key(namespace) else FORMAT, DATA_KEY: ""}
        if marked is not None:
            data[MARK_KEY] = marked
        if set_aside is not None:
            data[ALLOWANCES_KEY] = set_aside
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}
        if self._metrics is not None:
            # What the apiserver receives (its request_body_size), counted before it is sent:
            # a write that loses its race costs the apiserver its body all the same.
            self._metrics.record_bytes_written.inc(body_size(body, text))
        data[DATA_KEY] = text.decode()
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
            await self.api.delete_configmap(
                self.namespace, record_name(namespace), resource_version=version
            )
        except KubeError as error:
            if error.status == 409:
                raise Conflict(namespace) from None
            if error.status != 404:  # gone already: what deleting wanted
                raise
        self.text.forget(namespace)

    async def namespaces(self) -> list[str]:
        """Return the tenant namespaces that have a record, by the records' label."""
        records = await self.api.list_configmaps(self.namespace, USAGE_RECORD_LABEL)
        names = [str(m["metadata"]["labels"][USAGE_RECORD_LABEL]) for m in records.items]
        self.text.keep_only(names)
        return names
