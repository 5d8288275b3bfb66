"""The pods a workload stands for, and the gang they form: one row per form, as each
controller reads its own spec (the forms and their sources are in docs/quota.md)."""

from __future__ import annotations

from typing import Any

import pytest

from policies.workloads import (
    Gang,
    GangError,
    job_gang_size,
    min_member,
    pod_gang,
    pod_group_key,
    pod_sets,
)

SPEC = {"containers": [{"name": "main", "image": "x"}]}


def template(**metadata: Any) -> dict[str, Any]:
    return {"metadata": metadata, "spec": SPEC}


def obj(kind: str, spec: dict[str, Any], api: str = "v1", name: str = "w") -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name}, "spec": spec}


def job_template(parallelism: int) -> dict[str, Any]:
    return {"spec": {"parallelism": parallelism, "template": template()}}


FORMS = [
    pytest.param(
        {"kind": "Pod", "metadata": {"name": "p"}, "spec": SPEC}, [("", 1)], None, id="pod"
    ),
    pytest.param(
        {"kind": "PodTemplate", "metadata": {"name": "w"}, "template": template()},
        [("template", 1)],
        None,
        id="pod-template",
    ),
    pytest.param(
        obj("Deployment", {"replicas": 4, "template": template()}), [("", 4)], None, id="deployment"
    ),
    pytest.param(
        obj("Deployment", {"template": template()}), [("", 1)], None, id="replicas-absent"
    ),
    pytest.param(
        obj("Deployment", {"replicas": 0, "template": template()}),
        [("", 0)],
        None,
        id="scaled-to-0",
    ),
    pytest.param(
        obj("StatefulSet", {"replicas": 3, "template": template()}),
        [("", 3)],
        None,
        id="statefulset",
    ),
    pytest.param(
        obj("ReplicaSet", {"replicas": 2, "template": template()}), [("", 2)], None, id="replicaset"
    ),
    pytest.param(
        obj("ReplicationController", {"replicas": 2, "template": template()}),
        [("", 2)],
        None,
        id="replication-controller",
    ),
    pytest.param(obj("DaemonSet", {"template": template()}), [("", None)], None, id="daemonset"),
    pytest.param(
        obj("Job", {"parallelism": 3, "completions": 3, "template": template()}),
        [("", 3)],
        Gang("Job", "w", 3),
        id="job",
    ),
    pytest.param(
        obj(
            "Job",
            {
                "parallelism": 4,
                "completions": 2,
                "completionMode": "Indexed",
                "template": template(),
            },
        ),
        [("", 2)],
        Gang("Job", "w", 2),
        id="job-fewer-completions-than-parallelism",
    ),
    pytest.param(
        obj("Job", {"parallelism": 2, "completions": 10, "template": template()}),
        [("", 2)],
        Gang("Job", "w", 2),
        id="job-more-completions-than-parallelism",
    ),
    pytest.param(obj("Job", {"template": template()}), [("", 1)], None, id="job-of-one-is-no-gang"),
    pytest.param(
        obj("CronJob", {"schedule": "@daily", "jobTemplate": job_template(2)}),
        [("", 2)],
        Gang("CronJob", "w", 2),
        id="cronjob",
    ),
    pytest.param(
        obj(
            "JobSet",
            {
                "replicatedJobs": [
                    {"name": "driver", "replicas": 1, "template": job_template(1)},
                    {"name": "workers", "replicas": 2, "template": job_template(4)},
                ]
            },
            "jobset.x-k8s.io/v1alpha2",
        ),
        [("replicatedJobs[driver]", 1), ("replicatedJobs[workers]", 8)],
        Gang("JobSet", "w", 9),
        id="jobset",
    ),
    pytest.param(
        obj(
            "PyTorchJob",
            {
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "template": template()},
                    "Worker": {"replicas": 3, "template": template()},
                }
            },
            "kubeflow.org/v1",
        ),
        [("pytorchReplicaSpecs.Master", 1), ("pytorchReplicaSpecs.Worker", 3)],
        Gang("PyTorchJob", "w", 4),
        id="pytorchjob",
    ),
    pytest.param(
        obj(
            "TFJob",
            {
                "runPolicy": {"schedulingPolicy": {"minAvailable": 2}},
                "tfReplicaSpecs": {
                    "PS": {"replicas": 1, "template": template()},
                    "Worker": {"replicas": 4, "template": template()},
                },
            },
            "kubeflow.org/v1",
        ),
        [("tfReplicaSpecs.PS", 1), ("tfReplicaSpecs.Worker", 4)],
        Gang("TFJob", "w", 2),
        id="tfjob-min-available",
    ),
    pytest.param(
        obj(
            "MPIJob",
            {
                "mpiReplicaSpecs": {
                    "Launcher": {"template": template()},
                    "Worker": {"replicas": 2, "template": template()},
                }
            },
            "kubeflow.org/v2beta1",
        ),
        [("mpiReplicaSpecs.Launcher", 1), ("mpiReplicaSpecs.Worker", 2)],
        Gang("MPIJob", "w", 3),
        id="mpijob",
    ),
    pytest.param(
        obj(
            "LeaderWorkerSet",
            {
                "replicas": 2,
                "leaderWorkerTemplate": {
                    "size": 4,
                    "leaderTemplate": template(),
                    "workerTemplate": template(),
                },
            },
            "leaderworkerset.x-k8s.io/v1",
        ),
        [("leaderTemplate", 2), ("workerTemplate", 6)],
        Gang("LeaderWorkerSet", "w", 4),
        id="leaderworkerset",
    ),
    pytest.param(
        obj(
            "LeaderWorkerSet",
            {"leaderWorkerTemplate": {"size": 1, "workerTemplate": template()}},
            "leaderworkerset.x-k8s.io/v1",
        ),
        [("leaderTemplate", 1)],
        None,
        id="leaderworkerset-of-one",
    ),
    pytest.param(
        obj(
            "RayCluster",
            {
                "headGroupSpec": {"template": template()},
                "workerGroupSpecs": [
                    {"groupName": "gpu", "replicas": 2, "numOfHosts": 2, "template": template()},
                    {"groupName": "idle", "minReplicas": 1, "template": template()},
                    {"groupName": "none", "template": template()},
                ],
            },
            "ray.io/v1",
        ),
        [
            ("headGroupSpec", 1),
            ("workerGroupSpecs[gpu]", 4),
            ("workerGroupSpecs[idle]", 1),
            ("workerGroupSpecs[none]", 0),
        ],
        None,
        id="raycluster",
    ),
    pytest.param(
        obj(
            "RayJob",
            {"rayClusterSpec": {"headGroupSpec": {"template": template()}}},
            "ray.io/v1",
        ),
        [("headGroupSpec", 1)],
        None,
        id="rayjob",
    ),
    pytest.param(
        obj(
            "Notebook",
            {
                "template": template(),
                "sidecars": [{"replicas": 3, "template": template()}],
                "runs": {"template": {"spec": {"template": template()}}},
            },
            "kubeflow.org/v1",
        ),
        [
            ("spec.template", 1),
            ("spec.sidecars[0].template", 3),
            ("spec.runs.template.spec.template", 1),
        ],
        None,
        id="unknown-kind-by-shape",
    ),
    pytest.param(obj("Service", {"ports": [{"port": 80}]}), [], None, id="no-pods"),
]


@pytest.mark.parametrize(("document", "expected", "gang"), FORMS)
def test_each_form_says_how_many_pods_of_each_template(
    document: dict[str, Any], expected: list[tuple[str, int | None]], gang: Gang | None
) -> None:
    found = pod_sets(document, {})
    assert [(s.where, s.count) for s in found] == expected
    assert {s.gang for s in found} <= {gang}


def grouped(
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    metadata = {"name": "p", "labels": labels or {}, "annotations": annotations or {}}
    return {"kind": "Pod", "metadata": metadata, "spec": SPEC}


GROUPS = {("coscheduling", "g"): 3, ("volcano", "g"): 4, ("kai", "g"): 5}


@pytest.mark.parametrize(
    ("pod", "gang"),
    [
        pytest.param(
            grouped({"scheduling.x-k8s.io/pod-group": "g"}),
            Gang("coscheduling", "g", 3),
            id="coscheduling",
        ),
        pytest.param(
            grouped(annotations={"scheduling.k8s.io/group-name": "g"}),
            Gang("volcano", "g", 4),
            id="volcano",
        ),
        pytest.param(grouped(annotations={"pod-group-name": "g"}), Gang("kai", "g", 5), id="kai"),
        pytest.param(
            grouped({"scheduling.x-k8s.io/pod-group": "other"}),
            Gang("coscheduling", "other", None),
            id="podgroup-not-at-hand",
        ),
        pytest.param(
            grouped(
                {"kueue.x-k8s.io/pod-group-name": "g"},
                annotations={"kueue.x-k8s.io/pod-group-total-count": "6"},
            ),
            Gang("kueue", "g", 6),
            id="kueue-label",
        ),
        pytest.param(
            grouped(
                annotations={
                    "kueue.x-k8s.io/pod-group-name": "a",
                    "kueue.x-k8s.io/pod-group-total-count": "2",
                }
            ),
            Gang("kueue", "a", 2),
            id="kueue-annotation",
        ),
        pytest.param(
            grouped(annotations={"gpuadm.io/gang": "g", "gpuadm.io/gang-size": "8"}),
            Gang("gpuadm", "g", 8),
            id="gpuadm",
        ),
        pytest.param(grouped({"app": "x"}), None, id="no-group"),
    ],
)
def test_a_pod_in_a_named_group_is_in_that_gang(pod: dict[str, Any], gang: Gang | None) -> None:
    (found,) = pod_sets(pod, GROUPS)
    assert found.gang == gang


def test_a_group_the_pods_name_overrides_the_owners_own_size() -> None:
    pods = template(annotations={"scheduling.k8s.io/group-name": "g"})
    job = obj("Job", {"parallelism": 6, "template": pods})
    (found,) = pod_sets(job, GROUPS)
    assert (found.count, found.gang) == (6, Gang("volcano", "g", 4))


@pytest.mark.parametrize(
    ("document", "error"),
    [
        pytest.param(
            grouped(annotations={"gpuadm.io/gang": "g"}),
            "gpuadm.io/gang='g' needs the annotation gpuadm.io/gang-size",
            id="name-without-size",
        ),
        pytest.param(
            grouped(annotations={"gpuadm.io/gang-size": "3"}),
            "gpuadm.io/gang-size is set without gpuadm.io/gang",
            id="size-without-name",
        ),
        pytest.param(
            grouped(annotations={"gpuadm.io/gang": "g", "gpuadm.io/gang-size": "0"}),
            "gpuadm.io/gang-size is '0': a gang's size is a whole number from 1 to 10000",
            id="size-0",
        ),
        pytest.param(
            grouped(annotations={"gpuadm.io/gang": "g", "gpuadm.io/gang-size": "10001"}),
            "from 1 to 10000",
            id="size-too-large",
        ),
        pytest.param(
            grouped(annotations={"gpuadm.io/gang": "g", "gpuadm.io/gang-size": "2.5"}),
            "gpuadm.io/gang-size is '2.5'",
            id="size-not-whole",
        ),
        pytest.param(
            obj("Deployment", {"replicas": -1, "template": template()}),
            "Deployment/w: replicas is -1, not a whole number of 0 or more",
            id="negative-replicas",
        ),
        pytest.param(
            obj("Job", {"parallelism": True, "template": template()}),
            "Job/w: parallelism is True",
            id="boolean-parallelism",
        ),
        pytest.param(
            obj("StatefulSet", {"replicas": 1}),
            "StatefulSet/w has no pod template",
            id="no-template",
        ),
        pytest.param(
            obj("PyTorchJob", {"pytorchReplicaSpecs": {"Worker": {"replicas": 2}}}),
            "PyTorchJob/w has no pod template at pytorchReplicaSpecs.Worker",
            id="replica-spec-without-template",
        ),
    ],
)
def test_what_cannot_be_read_is_said(document: dict[str, Any], error: str) -> None:
    with pytest.raises(GangError) as raised:
        pod_sets(document, {})
    assert error in str(raised.value)


@pytest.mark.parametrize(
    ("document", "key", "size"),
    [
        pytest.param(
            obj("PodGroup", {"minMember": 3}, "scheduling.x-k8s.io/v1alpha1", "g"),
            ("coscheduling", "g"),
            3,
            id="coscheduling",
        ),
        pytest.param(
            obj("PodGroup", {"minMember": 0}, "scheduling.volcano.sh/v1beta1", "g"),
            ("volcano", "g"),
            1,
            id="volcano-0-is-no-gang",
        ),
        pytest.param(
            obj("PodGroup", {}, "scheduling.run.ai/v2alpha2", "g"), ("kai", "g"), 1, id="kai-absent"
        ),
    ],
)
def test_a_podgroup_gives_its_groups_size(
    document: dict[str, Any], key: tuple[str, str], size: int
) -> None:
    assert pod_group_key(document) == key
    assert min_member(document) == size


def test_a_podgroup_of_another_api_is_not_a_group() -> None:
    assert pod_group_key(obj("PodGroup", {"minMember": 2}, "example.com/v1", "g")) is None
    assert pod_group_key(obj("Deployment", {}, "apps/v1", "g")) is None


def test_a_template_named_by_many_aliases_is_walked_once() -> None:
    # What YAML aliases make: one object named 8^8 times through nested lists.
    shared: object = {"template": template()}
    for _ in range(8):
        shared = [shared] * 8
    found = pod_sets(obj("Weird", {"nested": shared}, "example.com/v1"), {})
    assert [(s.where, s.count) for s in found] == [
        ("spec.nested[0][0][0][0][0][0][0][0].template", 1)
    ]


# --- the gang of a pod, as admission and the line read it ------------------------------------


def _job_owner(**changes: object) -> dict[str, object]:
    owner: dict[str, object] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": "train",
        "uid": "u1",
        "controller": True,
    }
    return {**owner, **changes}


@pytest.mark.parametrize(
    ("metadata", "gang"),
    [
        pytest.param({"ownerReferences": [_job_owner()]}, Gang("job", "train", None), id="job"),
        pytest.param(
            {"ownerReferences": [_job_owner(controller=False)]}, None, id="not-its-controller"
        ),
        pytest.param(
            {"ownerReferences": [_job_owner(apiVersion="example.com/v1")]}, None, id="not-batch"
        ),
        pytest.param({"ownerReferences": [_job_owner(kind="ReplicaSet")]}, None, id="a-replicaset"),
        pytest.param(
            {
                "ownerReferences": [_job_owner()],
                "labels": {"scheduling.x-k8s.io/pod-group": "pg"},
            },
            Gang("coscheduling", "pg", None),
            id="a-named-group-comes-before-its-job",
        ),
        pytest.param(
            {"annotations": {"gpuadm.io/gang": "g", "gpuadm.io/gang-size": "4"}},
            Gang("gpuadm", "g", 4),
            id="gpuadm",
        ),
        pytest.param({"ownerReferences": "nonsense"}, None, id="owners-not-a-list"),
        pytest.param({}, None, id="none"),
    ],
)
def test_the_gang_of_a_pod(metadata: dict[str, object], gang: Gang | None) -> None:
    assert pod_gang(metadata) == gang
    if gang is not None:
        assert gang.key == f"{gang.source}/{gang.name}"


@pytest.mark.parametrize(
    ("job", "size"),
    [
        pytest.param({"spec": {"parallelism": 3}}, 3, id="parallelism"),
        pytest.param({"spec": {}}, 1, id="one-by-default"),
        pytest.param(
            {"spec": {"parallelism": 3, "completions": 2}}, 2, id="bounded-by-completions"
        ),
        pytest.param(
            {"spec": {"parallelism": 3, "completions": 10}, "status": {"succeeded": 8}},
            2,
            id="the-last-pods-wait-for-no-partner-the-job-will-not-make",
        ),
        pytest.param(
            {"spec": {"parallelism": 3, "completions": 3}, "status": {"succeeded": 3}},
            1,
            id="at-least-one",
        ),
        pytest.param({"spec": {"parallelism": True}}, 1, id="a-bool-is-no-count"),
        pytest.param({"spec": {"parallelism": 10**9}}, 10_000, id="bounded"),
    ],
)
def test_a_job_gang_size(job: dict[str, object], size: int) -> None:
    assert job_gang_size(job) == size


def test_a_gang_name_longer_than_an_object_name_is_refused() -> None:
    metadata = {"annotations": {"gpuadm.io/gang": "g" * 254, "gpuadm.io/gang-size": "2"}}
    with pytest.raises(GangError, match="254 characters long: at most 253"):
        pod_gang(metadata)
    metadata["annotations"]["gpuadm.io/gang"] = "g" * 253
    assert pod_gang(metadata) == Gang("gpuadm", "g" * 253, 2)
