"""What gpuadm's objects and lists share, whichever client reads or writes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies import policy

# The label on every object gpuadm creates for itself (usage records, its TLS Secret).
MANAGED_BY = {policy.MANAGED_BY: policy.MANAGER}
# The label that marks a usage record and names its tenant namespace (a ConfigMap's name
# may be cut; a label value holds the whole namespace name).
USAGE_RECORD_LABEL = "gpuadm.io/usage-for"
# The label on a GPU-hours record that names its tenant namespace, for people and tools:
# gpuadm finds a record by its name, and writes the label back on one that lost it.
HOURS_RECORD_LABEL = "gpuadm.io/gpu-hours-for"
# The key of a GPU-hours record's data (`policies.quota.gpu_hours.encode_hours`, as JSON).
HOURS_DATA_KEY = "hours.json"


# The start of a GPU-hours record's name; the rest is its tenant namespace's name, whole (a
# namespace's name has at most 63 characters, a ConfigMap's 253).
HOURS_RECORD_PREFIX = "gpuadm-gpu-hours-"


def hours_record_name(namespace: str) -> str:
    """Name the ConfigMap that holds a tenant namespace's counted GPU-hours."""
    return f"{HOURS_RECORD_PREFIX}{namespace}"


# events.k8s.io/v1 refuses a note over 1 KiB; core/v1 Events are held to the same size, so
# that the same Event is valid through either API and `kubectl describe` stays readable.
EVENT_MESSAGE_MAX = 1024


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list call."""

    items: list[dict[str, Any]]
    resource_version: str
    next_token: str | None
