"""Workloads: the pods a workload's controller makes from it, and the gangs among them."""

from policies.workloads.gangs import (
    Gang,
    GangError,
    job_gang_size,
    min_member,
    named_group,
    pod_gang,
    pod_group_key,
)
from policies.workloads.pod_sets import PodSet, pod_sets

__all__ = [
    "Gang",
    "GangError",
    "PodSet",
    "job_gang_size",
    "min_member",
    "named_group",
    "pod_gang",
    "pod_group_key",
    "pod_sets",
]
