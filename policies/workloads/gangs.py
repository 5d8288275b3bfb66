"""Gangs: the pods of a workload that must all run, or none is useful.

A gang is known from what the workload already says, never from a pod alone: where a pod
names a group, its size is the group's object's (a PodGroup's `minMember`) or an annotation
every pod of the group carries; where a controller owns the pods, it is the owner's spec.
Each form, with where its keys are defined upstream, is in docs/quota.md ("Gangs").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# scheduler-plugins' coscheduling: a label naming a PodGroup of scheduling.x-k8s.io.
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
# Volcano: an annotation naming a PodGroup of scheduling.volcano.sh.
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
# KAI Scheduler: an annotation naming a PodGroup of scheduling.run.ai.
KAI_ANNOTATION = "pod-group-name"
# Kueue's plain pod groups: the group's name and, on every pod, its total count.
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
# gpuadm's own, for anything else: a name and a size, on every pod of the gang.
GANG_KEY = "gpuadm.io/gang"
GANG_SIZE_KEY = "gpuadm.io/gang-size"

# The PodGroup kinds a pod's group names, by the form that names them.
POD_GROUP_APIS = {
    "coscheduling": "scheduling.x-k8s.io",
    "volcano": "scheduling.volcano.sh",
    "kai": "scheduling.run.ai",
}
# The Job a pod's controller reference names, whose spec sizes its gang.
JOB_API_VERSION = "batch/v1"
# The longest name of a gang: an object's name (a PodGroup's, a Job's) is at most this long,
# and the name goes into records, messages and the GPUQuota status.
MAX_GANG_NAME = 253
# A gang larger than this is not a gang any scheduler would place whole: read as a mistake.
MAX_GANG_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class Gang:
    """A gang: its form (`source`), its name within the namespace, and how many pods it has
    (None when the object that says so is not at hand)."""

    source: str
    name: str
    size: int | None

    @property
    def key(self) -> str:
        """Return what tells this gang from the others of its namespace: its form and name."""
        return f"{self.source}/{self.name}"

    def describe(self) -> str:
        """Say which gang this is, as a message names it."""
        size = "of unknown size" if self.size is None else f"of {self.size}"
        return f"gang {self.name!r} {size} ({self.source})"


class GangError(ValueError):
    """A pod or workload says it is in a gang in a way that cannot be read."""


def pod_group_key(document: Mapping[str, Any]) -> tuple[str, str] | None:
    """Return (form, name) of a PodGroup object of one of `POD_GROUP_APIS`; None for any
    other object."""
    api_version = str(document.get("apiVersion") or "")
    if document.get("kind") != "PodGroup":
        return None
    group = api_version.partition("/")[0]
    for source, api in POD_GROUP_APIS.items():
        if group == api:
            name = (document.get("metadata") or {}).get("name")
            return (source, str(name)) if name else None
    return None


def min_member(document: Mapping[str, Any]) -> int:
    """Return a PodGroup's `spec.minMember` (every form calls it so). Absent, or 0 (Volcano
    and KAI allow it: no gang), it is 1."""
    spec = document.get("spec")
    value = spec.get("minMember") if isinstance(spec, Mapping) else None
    what = f"PodGroup {_name(document)}: spec.minMember"
    return 1 if value in (None, 0) else _size(value, what)


def named_group(
    metadata: Mapping[str, Any], pod_groups: Mapping[tuple[str, str], int]
) -> Gang | None:
    """Return the gang a pod's own labels or annotations name it a member of; None if they
    name none.

    `pod_groups` maps (form, name) to the `minMember` of each PodGroup at hand; a group whose
    object is not at hand has no known size. Kueue's and gpuadm's forms carry the size on the
    pod itself. Raises `GangError` for a size that is not a whole number from 1 to
    `MAX_GANG_SIZE`, or a size without a name.
    """
    found = _named_group(metadata, pod_groups)
    if found is not None and len(found.name) > MAX_GANG_NAME:
        raise GangError(
            f"the {found.source} gang's name is {len(found.name)} characters long: at most "
            f"{MAX_GANG_NAME}, as an object's name"
        )
    return found


def _named_group(
    metadata: Mapping[str, Any], pod_groups: Mapping[tuple[str, str], int]
) -> Gang | None:
    labels = _strings(metadata.get("labels"))
    annotations = _strings(metadata.get("annotations"))
    for source, name in (
        ("coscheduling", labels.get(COSCHEDULING_LABEL)),
        ("volcano", annotations.get(VOLCANO_ANNOTATION)),
        ("kai", annotations.get(KAI_ANNOTATION)),
    ):
        if name:
            return Gang(source, name, pod_groups.get((source, name)))
    # Kueue reads its group's name from the annotation first, then the label.
    kueue = annotations.get(KUEUE_GROUP_LABEL) or labels.get(KUEUE_GROUP_LABEL)
    for source, name_key, size_key, name in (
        ("kueue", KUEUE_GROUP_LABEL, KUEUE_COUNT_ANNOTATION, kueue),
        ("gpuadm", GANG_KEY, GANG_SIZE_KEY, annotations.get(GANG_KEY) or labels.get(GANG_KEY)),
    ):
        size = annotations.get(size_key)
        if name:
            if size is None:
                raise GangError(f"{name_key}={name!r} needs the annotation {size_key}")
            return Gang(source, name, _size(size, size_key))
        if size is not None:
            raise GangError(f"{size_key} is set without {name_key}")
    return None


def pod_gang(metadata: Mapping[str, Any]) -> Gang | None:
    """Return the gang a pod is a member of, from the pod alone; None if it is in none.

    A group its labels or annotations name comes first (`named_group`): Kueue's and gpuadm's
    forms carry the size, a PodGroup's size is its object's, not at hand here. Else a pod
    whose controller is a Job (`batch/v1`) is in that Job's gang, sized by the Job's spec
    (`job_gang_size`), never by the pod. Raises `GangError` as `named_group` does.
    """
    gang = named_group(metadata, {})
    if gang is not None:
        return gang
    owners = metadata.get("ownerReferences")
    for owner in owners if isinstance(owners, list) else ():
        if (
            isinstance(owner, Mapping)
            and owner.get("controller") is True
            and owner.get("kind") == "Job"
            and owner.get("apiVersion") == JOB_API_VERSION
            and owner.get("name")
        ):
            return Gang("job", str(owner["name"]), None)
    return None


def job_gang_size(job: Mapping[str, Any]) -> int:
    """Return how many pods of a Job must run together: its `parallelism` (1 if absent),
    no more than the completions it still needs (`completions` less `status.succeeded`), so
    that the last pods of a Job are never held for partners it will not make. At least 1."""
    spec = job.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    status = job.get("status")
    status = status if isinstance(status, Mapping) else {}
    parallelism = spec.get("parallelism")
    size = parallelism if isinstance(parallelism, int) and not isinstance(parallelism, bool) else 1
    completions = spec.get("completions")
    if isinstance(completions, int) and not isinstance(completions, bool):
        succeeded = status.get("succeeded")
        done = succeeded if isinstance(succeeded, int) and not isinstance(succeeded, bool) else 0
        size = min(size, completions - done)
    return max(1, min(size, MAX_GANG_SIZE))


def _size(value: object, what: str) -> int:
    text = str(value).strip()
    whole = text.isascii() and text.isdigit() and len(text) <= len(str(MAX_GANG_SIZE))
    if isinstance(value, bool) or not whole or not 1 <= int(text) <= MAX_GANG_SIZE:
        raise GangError(
            f"{what} is {value!r}: a gang's size is a whole number from 1 to {MAX_GANG_SIZE}"
        )
    return int(text)


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(key): str(item) for key, item in value.items() if item is not None}


def _name(document: Mapping[str, Any]) -> str:
    metadata = document.get("metadata") or {}
    return str(metadata.get("name") or "")
