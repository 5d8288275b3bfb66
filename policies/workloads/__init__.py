"""Workloads: the pods a workload's controller makes from it, and the gangs among them."""

from policies.workloads.gangs import Gang, GangError, min_member, named_group, pod_group_key
from policies.workloads.pod_sets import PodSet, pod_sets

__all__ = [
    "Gang",
    "GangError",
    "PodSet",
    "min_member",
    "named_group",
    "pod_group_key",
    "pod_sets",
]
