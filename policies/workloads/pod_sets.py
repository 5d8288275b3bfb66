"""The pods a workload stands for: each pod template it holds, how many pods of it its
controller makes, and the gang they belong to.

Every form is read from the workload's own spec, as its controller reads it:

- Deployment, ReplicaSet, StatefulSet, ReplicationController: `spec.replicas` (1 if absent);
- DaemonSet: one pod per node, a count no manifest holds;
- Job: `spec.parallelism` (1 if absent), no more than `spec.completions`; CronJob: its job
  template's; a Job of more than one pod is a gang;
- JobSet: each replicated Job's `replicas` times its Job's pods, one gang for the whole set;
- Kubeflow's training jobs (PyTorchJob, TFJob, MPIJob, XGBoostJob, PaddleJob, JAXJob): each
  replica spec's `replicas`, one gang for all of them, of `minAvailable` if the run policy
  sets it;
- LeaderWorkerSet: `spec.replicas` groups of `leaderWorkerTemplate.size` pods, one leader
  and `size - 1` workers each; each group a gang;
- RayCluster (and the cluster of a RayJob or RayService): one head and each worker group's
  `replicas` times `numOfHosts`;
- any other kind: every pod template found by its shape (a `template` whose `spec` has
  `containers`), `replicas` beside it if it has one, else one pod.

A pod whose own labels or annotations name a group (`gangs.named_group`) is in that group,
whatever its owner says.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from policies.workloads.gangs import Gang, GangError, named_group

# Templates found by shape are looked for this deep at most; a manifest is no deeper.
MAX_DEPTH = 12
# Each workload kind whose pods the platform's controllers make from `spec.template`.
REPLICATED = ("Deployment", "ReplicaSet", "StatefulSet", "ReplicationController")
# The API groups of the kinds read by form ("" too: a manifest that names no group, or the
# core one); a kind of the same name in another group (Volcano's `batch.volcano.sh` Job) is
# read by its shape.
GROUPS = {
    "Pod": ("",),
    "PodTemplate": ("",),
    "ReplicationController": ("",),
    "Deployment": ("apps", "extensions"),
    "ReplicaSet": ("apps", "extensions"),
    "StatefulSet": ("apps",),
    "DaemonSet": ("apps", "extensions"),
    "Job": ("batch",),
    "CronJob": ("batch",),
    "JobSet": ("jobset.x-k8s.io",),
    "PyTorchJob": ("kubeflow.org",),
    "TFJob": ("kubeflow.org",),
    "MPIJob": ("kubeflow.org",),
    "XGBoostJob": ("kubeflow.org",),
    "PaddleJob": ("kubeflow.org",),
    "JAXJob": ("kubeflow.org",),
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io",),
    "RayCluster": ("ray.io",),
    "RayJob": ("ray.io",),
    "RayService": ("ray.io",),
}
TRAINING_JOBS = {
    "PyTorchJob": "pytorchReplicaSpecs",
    "TFJob": "tfReplicaSpecs",
    "MPIJob": "mpiReplicaSpecs",
    "XGBoostJob": "xgbReplicaSpecs",
    "PaddleJob": "paddleReplicaSpecs",
    "JAXJob": "jaxReplicaSpecs",
}


@dataclass(frozen=True, slots=True)
class PodSet:
    """Pods made from one template: `count` of them (None: one per node), at `where` in
    the workload, in `gang` if they must all run together."""

    kind: str
    name: str
    where: str
    template: Mapping[str, Any]
    count: int | None
    gang: Gang | None = None

    @property
    def label(self) -> str:
        """Name the template as `kind/name`, and where in the workload it sits."""
        return f"{self.kind}/{self.name}" + (f" {self.where}" if self.where else "")


def pod_sets(
    document: Mapping[str, Any], pod_groups: Mapping[tuple[str, str], int]
) -> list[PodSet]:
    """Return the pod sets of one object; [] for an object that makes no pods.

    `pod_groups` maps (form, name) to the `minMember` of each PodGroup at hand. Raises
    `GangError` for a count or gang size that cannot be read.
    """
    kind = str(document.get("kind") or "Pod")
    metadata = _mapping(document.get("metadata"))
    name = str(metadata.get("name") or metadata.get("generateName") or "")
    spec = _mapping(document.get("spec"))
    group = str(document.get("apiVersion") or "").rpartition("/")[0]
    if kind in GROUPS and group not in (*GROUPS[kind], ""):
        kind = f"{group}/{kind}"  # a kind of that name of another API: found by its shape
    found: list[PodSet]
    if kind == "Pod":
        found = [PodSet(kind, name, "", document, 1)]
    elif kind == "PodTemplate":
        found = _at(kind, name, "template", document.get("template"), 1)
    elif kind in REPLICATED:
        found = _at(
            kind,
            name,
            "",
            spec.get("template"),
            _count(spec, "replicas", f"{kind}/{name}", least=0),
        )
    elif kind == "DaemonSet":
        found = _at(kind, name, "", spec.get("template"), None)
    elif kind == "Job":
        found = _job(kind, name, "", spec)
    elif kind == "CronJob":
        job = _mapping(_mapping(spec.get("jobTemplate")).get("spec"))
        found = _job(kind, name, "", job)
    elif kind == "JobSet":
        found = _job_set(name, spec)
    elif kind in TRAINING_JOBS:
        found = _training_job(kind, name, spec)
    elif kind == "LeaderWorkerSet":
        found = _leader_worker_set(name, spec)
    elif kind in ("RayCluster", "RayJob", "RayService"):
        cluster = {"RayCluster": spec, "RayJob": spec.get("rayClusterSpec")}
        held = cluster.get(kind, spec.get("rayClusterConfig"))
        # A RayJob may run on a cluster that exists (`clusterSelector`): it makes no pods.
        found = _ray_cluster(kind, name, held) if isinstance(held, Mapping) else []
    else:
        found = [
            PodSet(kind, name, where, template, count)
            for where, template, count in _by_shape(document, "", 0)
        ]
    return [_named(pod_set, pod_groups) for pod_set in found]


def _named(pod_set: PodSet, pod_groups: Mapping[tuple[str, str], int]) -> PodSet:
    """Put a pod set in the group its pods' labels name, if they name one."""
    metadata = _mapping(pod_set.template.get("metadata"))
    named = named_group(metadata, pod_groups)
    if named is None:
        return pod_set
    return PodSet(pod_set.kind, pod_set.name, pod_set.where, pod_set.template, pod_set.count, named)


def _at(kind: str, name: str, where: str, template: object, count: int | None) -> list[PodSet]:
    if not isinstance(template, Mapping):
        raise GangError(f"{kind}/{name} has no pod template" + (f" at {where}" if where else ""))
    return [PodSet(kind, name, where, template, count)]


def _job(kind: str, name: str, where: str, spec: Mapping[str, Any]) -> list[PodSet]:
    """A Job runs `parallelism` pods at once, never more than its `completions`."""
    pods = _job_pods(spec, f"{kind}/{name}")
    gang = Gang(kind, name, pods) if pods > 1 else None
    (found,) = _at(kind, name, where, spec.get("template"), pods)
    return [PodSet(found.kind, found.name, found.where, found.template, pods, gang)]


def _job_pods(spec: Mapping[str, Any], what: str) -> int:
    parallelism = _count(spec, "parallelism", what, least=0)
    if spec.get("completions") is None:
        return parallelism
    return min(parallelism, _count(spec, "completions", what, least=0))


def _job_set(name: str, spec: Mapping[str, Any]) -> list[PodSet]:
    found = []
    jobs = spec.get("replicatedJobs")
    for index, job in enumerate(jobs if isinstance(jobs, list) else ()):
        job = _mapping(job)
        where = f"replicatedJobs[{job.get('name') or index}]"
        job_spec = _mapping(_mapping(job.get("template")).get("spec"))
        pods = _count(job, "replicas", f"JobSet/{name} {where}") * _job_pods(
            job_spec, f"JobSet/{name} {where}"
        )
        found += _at("JobSet", name, where, job_spec.get("template"), pods)
    return _one_gang("JobSet", name, found, None)


def _training_job(kind: str, name: str, spec: Mapping[str, Any]) -> list[PodSet]:
    found = []
    replica_specs = _mapping(spec.get(TRAINING_JOBS[kind]))
    for replica_type, replica in replica_specs.items():
        replica = _mapping(replica)
        where = f"{TRAINING_JOBS[kind]}.{replica_type}"
        pods = _count(replica, "replicas", f"{kind}/{name} {where}", least=0)
        found += _at(kind, name, where, replica.get("template"), pods)
    policy = _mapping(_mapping(spec.get("runPolicy")).get("schedulingPolicy"))
    least = policy.get("minAvailable")
    size = None if least is None else _count(policy, "minAvailable", f"{kind}/{name}")
    return _one_gang(kind, name, found, size)


def _one_gang(kind: str, name: str, found: list[PodSet], size: int | None) -> list[PodSet]:
    """Put every pod set of a workload in one gang: of `size`, or of all its pods."""
    total = sum(pod_set.count or 0 for pod_set in found)
    gang = Gang(kind, name, total if size is None else size)
    if gang.size is not None and gang.size <= 1:
        return found
    return [PodSet(s.kind, s.name, s.where, s.template, s.count, gang) for s in found]


def _leader_worker_set(name: str, spec: Mapping[str, Any]) -> list[PodSet]:
    what = f"LeaderWorkerSet/{name}"
    groups = _count(spec, "replicas", what, least=0)
    templates = _mapping(spec.get("leaderWorkerTemplate"))
    size = _count(templates, "size", what)
    workers = templates.get("workerTemplate")
    leader = templates.get("leaderTemplate") or workers
    found = _at("LeaderWorkerSet", name, "leaderTemplate", leader, groups)
    if size > 1:
        found += _at("LeaderWorkerSet", name, "workerTemplate", workers, groups * (size - 1))
    # Each group is a gang of its own: one name for all, `groups` times its size in pods.
    gang = Gang("LeaderWorkerSet", name, size) if size > 1 else None
    return [PodSet(s.kind, s.name, s.where, s.template, s.count, gang) for s in found]


def _ray_cluster(kind: str, name: str, spec: Mapping[str, Any]) -> list[PodSet]:
    head = _mapping(spec.get("headGroupSpec"))
    found = _at(kind, name, "headGroupSpec", head.get("template"), 1)
    groups = spec.get("workerGroupSpecs")
    for index, group in enumerate(groups if isinstance(groups, list) else ()):
        group = _mapping(group)
        where = f"workerGroupSpecs[{group.get('groupName') or index}]"
        what = f"{kind}/{name} {where}"
        # KubeRay's defaults: `replicas` absent is `minReplicas`, and that absent is 0.
        field = "replicas" if group.get("replicas") is not None else "minReplicas"
        replicas = _count(group, field, what, least=0) if group.get(field) is not None else 0
        found += _at(
            kind, name, where, group.get("template"), replicas * _count(group, "numOfHosts", what)
        )
    return found


def _by_shape(
    value: object, where: str, depth: int, seen: set[int] | None = None
) -> Iterator[tuple[str, Mapping[str, Any], int]]:
    """Yield (where, template, count) of every pod template inside an object of a kind no
    form knows: a `template` whose `spec` has `containers`. Each object is visited once,
    however many YAML aliases name it, so that a few lines of aliases cannot make the walk
    endless."""
    seen = set() if seen is None else seen
    if depth > MAX_DEPTH or id(value) in seen:
        return
    if isinstance(value, (Mapping, list)):
        seen.add(id(value))
    if isinstance(value, Mapping):
        template = _mapping(value.get("template"))
        found = isinstance(_mapping(template.get("spec")).get("containers"), list)
        if found:
            place = f"{where}.template" if where else "template"
            count = (
                1 if value.get("replicas") is None else _count(value, "replicas", place, least=0)
            )
            yield place, template, count
        for key, item in value.items():
            if key not in ("metadata", "status") and not (found and key == "template"):
                yield from _by_shape(item, f"{where}.{key}" if where else str(key), depth + 1, seen)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _by_shape(item, f"{where}[{index}]", depth + 1, seen)


def _count(spec: Mapping[str, Any], field: str, what: str, *, least: int = 1) -> int:
    """Return a count field of a spec: 1 if absent, else a whole number of at least `least`."""
    value = spec.get(field)
    if value is None:
        return 1
    if type(value) is not int or value < least:
        raise GangError(f"{what}: {field} is {value!r}, not a whole number of {least} or more")
    return value


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
