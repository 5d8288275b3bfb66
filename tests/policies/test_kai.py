"""The `kai` backend: whole GPUs as `nvidia.com/gpu`, a share as KAI's pod annotations, read
back as the pod's demand, charged as KAI counts it, and guarded like the other stacks' keys."""

from __future__ import annotations

import copy
import math
from fractions import Fraction
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import (
    ConfigError,
    Denial,
    Policy,
    check_added_containers,
    check_guard,
    check_update,
    load_policy,
    plan,
    pod_charge,
    require_fixed_point,
)
from policies.access.guard import check_allocation_update, check_devices_config_map
from policies.access.rewrite import memo_key
from policies.classes.backends.kai import SHARE_CONFIG_MAPS
from policies.policy import DEFAULT_GPU_STACK_USERS, routing_warnings
from policies.quantity import format_amount
from tests.apiserver_rules import violations
from tests.builders import POLICY_YAML, container, pod

KAI_POLICY_YAML = """
domain: gpuadm.io
defaultClass: h100
classes:
  a100:
    backend: kai
    memory: 80Gi
    models: [NVIDIA A100-SXM4-80GB]
    queue: research
    namespaces:
      team-a: {queue: team-a}
      team-b: {schedulerName: kai-scheduler-b}
  h100:
    backend: kai
    memory: 80Gi
    models: [NVIDIA H100 80GB HBM3]
  whole:
    backend: kai
    shareable: false
  a10:
    backend: hami
    memory: 24Gi
    models: [NVIDIA A10]
"""
GPU = "nvidia.com/gpu"
QUEUE = "kai.scheduler/queue"


@pytest.fixture(scope="module")
def kai() -> Policy:
    return load_policy(KAI_POLICY_YAML)


def apply(
    policy: Policy, body: dict[str, Any], namespace: str | None = None
) -> tuple[dict[str, Any], Any]:
    """Plan, apply the patch, check it as the apiserver would, and that it is a fixed point."""
    result = plan(body, policy, namespace=namespace)
    mutated = jsonpatch.apply_patch(body, result.patch)
    assert violations(mutated, policy.domain) == []
    again = plan(mutated, policy, namespace=namespace)
    assert again.patch == [], "the rewrite is not idempotent"
    assert again.charge == result.charge, "the stored pod is not charged what was admitted"
    return mutated, result


def annotations_of(mutated: dict[str, Any]) -> dict[str, str]:
    return dict(mutated["metadata"].get("annotations") or {})


def kai_annotations(mutated: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in annotations_of(mutated).items() if not k.startswith("gpuadm.io/")}


def limits(mutated: dict[str, Any], index: int = 0, kind: str = "containers") -> dict[str, str]:
    resources = mutated["spec"][kind][index].get("resources") or {}
    assert resources.get("limits") == resources.get("requests")
    return dict(resources.get("limits") or {})


# --- what a pod gets, and what it is charged ---------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "stored", "written", "charge"),
    [
        pytest.param({"gpuadm.io/h100": "2"}, {GPU: "2"}, {}, 2, id="whole"),
        pytest.param(
            {"gpuadm.io/h100": "0.5"},
            {},
            {"gpu-fraction": "0.5", "gpu-fraction-container-name": "main"},
            Fraction(1, 2),
            id="share",
        ),
        pytest.param(
            {"gpuadm.io/h100": "250m"},
            {},
            {"gpu-fraction": "0.25", "gpu-fraction-container-name": "main"},
            Fraction(1, 4),
            id="share-in-milli-written-as-a-decimal",
        ),
        # KAI counts a portion in hundredths: 0.333 is written, and charged, as 0.33, three
        # of which fit one GPU (three of 0.34 would not).
        pytest.param(
            {"gpuadm.io/h100": "0.333"},
            {},
            {"gpu-fraction": "0.33", "gpu-fraction-container-name": "main"},
            Fraction(33, 100),
            id="share-rounded-down-to-a-hundredth",
        ),
        pytest.param(
            {"gpuadm.io/h100": "1m"},
            {},
            {"gpu-fraction": "0.01", "gpu-fraction-container-name": "main"},
            Fraction(1, 100),
            id="smallest-share-is-a-hundredth",
        ),
        pytest.param(
            {"gpuadm.io/h100": "0.995"},
            {},
            {"gpu-fraction": "0.99", "gpu-fraction-container-name": "main"},
            Fraction(99, 100),
            id="share-just-under-one-gpu-rounded-down",
        ),
        # 10Gi is 10240 MiB; KAI counts the 81920 MiB GPU as 81900, and 10240/81900 as 0.13:
        # so it is written as a MiB under 12 hundredths of 81900 MiB (9828), which KAI counts
        # as 0.12.
        pytest.param(
            {"gpuadm.io/h100-memory": "10Gi"},
            {},
            {"gpu-memory": "9827", "gpu-fraction-container-name": "main"},
            Fraction(12, 100),
            id="memory-rounded-down-to-hundredths-kai-counts",
        ),
        pytest.param(
            {"gpuadm.io/h100-memory": "1500Ki"},
            {},
            {"gpu-memory": "818", "gpu-fraction-container-name": "main"},
            Fraction(1, 100),
            id="memory-below-a-hundredth-takes-one",
        ),
        # All KAI counts of the GPU, or more: the pod gets a GPU of its own.
        pytest.param(
            {"gpuadm.io/h100-memory": "81900Mi"}, {GPU: "1"}, {}, 1, id="memory-of-all-the-gpu"
        ),
        # 81900 MiB is all KAI counts of the GPU: asking for more, the pod gets a GPU of its own.
        pytest.param(
            {"gpuadm.io/h100-memory": "81901Mi"}, {GPU: "1"}, {}, 1, id="memory-of-one-gpu"
        ),
        pytest.param(
            {"gpuadm.io/h100": "1", "gpuadm.io/h100-memory": "40Gi"},
            {GPU: "1"},
            {},
            1,
            id="whole-with-a-memory-cap",
        ),
        pytest.param({GPU: "3"}, {GPU: "3"}, {}, 3, id="untyped-count"),
    ],
)
def test_each_form(
    kai: Policy,
    asked: dict[str, str],
    stored: dict[str, str],
    written: dict[str, str],
    charge: Fraction,
) -> None:
    mutated, result = apply(kai, pod(asked))
    assert limits(mutated) == stored
    assert kai_annotations(mutated) == written
    assert result.charge == charge
    assert annotations_of(mutated)["gpuadm.io/demand"] == f"h100={format_amount(charge)}"
    assert mutated["spec"]["schedulerName"] == "kai-scheduler"
    assert pod_charge(mutated, kai) == ("h100", charge)
    # A whole GPU never comes with a share: KAI refuses a pod with both.
    assert not (stored and written)


def test_the_rounding_is_said(kai: Policy) -> None:
    _, result = apply(kai, pod({"gpuadm.io/h100": "0.333"}))
    assert result.warnings == (
        'container "main": a share of 0.333 of h100 rounded down to 0.33 GPU (annotation '
        "gpu-fraction: 0.33), so that shares adding up to one GPU fit on one; quota is "
        "charged 0.33",
    )


def test_a_memory_cap_on_whole_gpus_is_ignored_with_a_warning(kai: Policy) -> None:
    _, result = apply(kai, pod({"gpuadm.io/h100": "1", "gpuadm.io/h100-memory": "40Gi"}))
    assert "KAI gives a whole GPU all of its memory: the memory cap is ignored" in result.warnings


def test_models_become_node_affinity(kai: Policy) -> None:
    mutated, _ = apply(kai, pod({"gpuadm.io/a100": "0.5"}))
    required = mutated["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {
                    "key": "nvidia.com/gpu.product",
                    "operator": "In",
                    "values": ["NVIDIA-A100-SXM4-80GB"],
                }
            ]
        }
    ]


def test_the_share_goes_to_the_container_that_asks(kai: Policy) -> None:
    body = pod({"cpu": "1"}, extra=[container("trainer", {"gpuadm.io/h100": "0.5"})])
    mutated, result = apply(kai, body)
    assert kai_annotations(mutated) == {
        "gpu-fraction": "0.5",
        "gpu-fraction-container-name": "trainer",
    }
    assert result.charge == Fraction(1, 2)


def test_a_share_of_an_init_container_is_named_and_counted_by_the_init_rule(kai: Policy) -> None:
    body = pod({"cpu": "1"}, init=[container("warmup", {"gpuadm.io/h100": "0.25"})])
    mutated, result = apply(kai, body)
    assert kai_annotations(mutated) == {
        "gpu-fraction": "0.25",
        "gpu-fraction-container-name": "warmup",
    }
    assert result.charge == Fraction(1, 4)


# --- KAI's own form, read back as the pod's demand ---------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "written", "charge"),
    [
        pytest.param(
            {"gpu-fraction": "0.5"},
            {"gpu-fraction": "0.5", "gpu-fraction-container-name": "main"},
            Fraction(1, 2),
            id="fraction",
        ),
        pytest.param(
            {"gpu-fraction": "5e-1"},
            {"gpu-fraction": "0.5", "gpu-fraction-container-name": "main"},
            Fraction(1, 2),
            id="fraction-in-scientific-notation",
        ),
        pytest.param(
            {"gpu-fraction": ".125"},
            {"gpu-fraction": "0.12", "gpu-fraction-container-name": "main"},
            Fraction(12, 100),
            id="fraction-rounded-down",
        ),
        # KAI counts 2000 MiB of its 81900 as 3 hundredths: read, written and charged as
        # those, 2456 MiB (as a pod stored by an earlier gpuadm is charged: never less).
        pytest.param(
            {"gpu-memory": "2000"},
            {"gpu-memory": "2456", "gpu-fraction-container-name": "main"},
            Fraction(3, 100),
            id="memory-in-mib-read-as-the-hundredths-kai-counts",
        ),
        # 5733 MiB is 7 hundredths exactly, which KAI's float64 counts as 8: a MiB under.
        pytest.param(
            {"gpu-memory": "5733"},
            {"gpu-memory": "5732", "gpu-fraction-container-name": "main"},
            Fraction(7, 100),
            id="memory-of-whole-hundredths-written-a-mib-under",
        ),
        pytest.param(
            {"gpu-fraction": "0.999"},
            {"gpu-fraction": "0.99", "gpu-fraction-container-name": "main"},
            Fraction(99, 100),
            id="a-fraction-just-under-one-rounded-down",
        ),
        pytest.param({"gpu-memory": "81900"}, {}, 1, id="a-whole-gpu-takes-the-share-away"),
    ],
)
def test_kais_own_annotations_are_the_pods_request(
    kai: Policy, annotations: dict[str, str], written: dict[str, str], charge: Fraction
) -> None:
    body = pod({"cpu": "1"}, annotations={"gpuadm.io/class": "h100", **annotations})
    mutated, result = apply(kai, body)
    assert kai_annotations(mutated) == written
    assert result.charge == charge
    assert pod_charge(mutated, kai) == ("h100", charge)


def test_a_stored_share_is_a_fixed_point_and_holds_its_share(kai: Policy) -> None:
    mutated, _ = apply(kai, pod({"gpuadm.io/h100": "0.5"}))
    assert require_fixed_point(plan(mutated, kai)).charge == Fraction(1, 2)
    # As the scheduler leaves it, bound to a node with KAI's labels: still charged the same.
    bound = copy.deepcopy(mutated)
    bound["spec"]["nodeName"] = "node-1"
    bound["metadata"]["labels"]["runai-gpu-group"] = "5b2a"
    bound["metadata"]["annotations"]["received-resource-type"] = "Fraction"
    assert pod_charge(bound, kai) == ("h100", Fraction(1, 2))


def test_a_share_annotation_is_a_gpu_pod_in_a_namespace_with_a_default_class(kai: Policy) -> None:
    body = pod({"cpu": "1"}, annotations={"gpu-fraction": "0.5"})
    assert plan(body, kai).class_name == "h100"  # the policy's default
    assert plan(body, kai, namespace_default_class="a100").class_name == "a100"


# --- per class and per namespace: the queue and the scheduler ----------------------------------


@pytest.mark.parametrize(
    ("namespace", "queue", "scheduler"),
    [
        pytest.param(None, "research", "kai-scheduler", id="the-class-s"),
        pytest.param("team-x", "research", "kai-scheduler", id="another-namespace"),
        pytest.param("team-a", "team-a", "kai-scheduler", id="a-namespace-s-queue"),
        pytest.param("team-b", "research", "kai-scheduler-b", id="a-namespace-s-scheduler"),
    ],
)
def test_queue_and_scheduler(
    kai: Policy, namespace: str | None, queue: str, scheduler: str
) -> None:
    mutated, _ = apply(kai, pod({"gpuadm.io/a100": "0.5"}), namespace=namespace)
    assert mutated["metadata"]["labels"][QUEUE] == queue
    assert mutated["spec"]["schedulerName"] == scheduler


def test_a_class_without_a_queue_leaves_the_label_to_kai(kai: Policy) -> None:
    mutated, _ = apply(kai, pod({"gpuadm.io/h100": "1"}))
    assert QUEUE not in mutated["metadata"]["labels"]
    own = pod({"gpuadm.io/h100": "1"})
    own["metadata"]["labels"] = {QUEUE: "mine"}
    mutated, result = apply(kai, own)
    assert mutated["metadata"]["labels"][QUEUE] == "mine"
    assert result.warnings == ()


def test_a_pods_own_queue_is_replaced_by_the_class_s_with_a_note(kai: Policy) -> None:
    body = pod({"gpuadm.io/a100": "1"})
    body["metadata"]["labels"] = {QUEUE: "someone-else"}
    mutated, result = apply(kai, body, namespace="team-a")
    assert mutated["metadata"]["labels"][QUEUE] == "team-a"
    assert result.warnings == (
        f"label {QUEUE}: 'someone-else' replaced by 'team-a', the value class a100 gives it",
    )


def test_the_queue_label_follows_kais_queue_label_key() -> None:
    policy = load_policy(
        "classes:\n  a:\n    backend: kai\n    memory: 16Gi\n"
        "    queue: q1\n    queueLabel: example.com/queue\n"
    )
    mutated, _ = apply(policy, pod({"gpuadm.io/a": "1"}))
    assert mutated["metadata"]["labels"]["example.com/queue"] == "q1"
    assert QUEUE not in mutated["metadata"]["labels"]


def test_the_default_scheduler_is_replaced_and_another_denied(kai: Policy) -> None:
    body = pod({"gpuadm.io/a100": "0.5"}, schedulerName="default-scheduler")
    mutated, _ = apply(kai, body, namespace="team-b")
    assert mutated["spec"]["schedulerName"] == "kai-scheduler-b"
    # The class's own scheduler is another one in team-b.
    with pytest.raises(Denial, match="class a100 is scheduled by 'kai-scheduler-b'"):
        plan(pod({"gpuadm.io/a100": "1"}, schedulerName="kai-scheduler"), kai, namespace="team-b")
    with pytest.raises(Denial, match="sets nodeName 'node-1', which bypasses it"):
        plan(pod({"gpuadm.io/a100": "0.5"}, nodeName="node-1"), kai)


def test_the_memo_key_tells_apart_only_the_namespaces_a_class_names(kai: Policy) -> None:
    body = pod({"gpuadm.io/a100": "0.5"})
    assert memo_key(body, kai, namespace="team-x") == memo_key(body, kai, namespace="team-y")
    assert memo_key(body, kai, namespace="team-a") != memo_key(body, kai, namespace="team-x")
    labelled = pod({"gpuadm.io/a100": "0.5"})
    labelled["metadata"]["labels"] = {QUEUE: "other"}
    assert memo_key(labelled, kai) != memo_key(body, kai)
    annotated = pod({"gpuadm.io/a100": "0.5"}, annotations={"gpu-fraction": "0.5"})
    assert memo_key(annotated, kai) != memo_key(body, kai)


# --- denials -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            pod({"gpuadm.io/h100": "0.5"}, extra=[container("b", {"gpuadm.io/h100": "0.5"})]),
            "class h100 (kai): KAI gives a share of a GPU to one container of a pod, and then to "
            'no other, but container "main", container "b" all ask for GPUs',
            id="two-shares",
        ),
        pytest.param(
            pod({"gpuadm.io/h100": "0.5"}, extra=[container("b", {"gpuadm.io/h100": "1"})]),
            "KAI gives a share of a GPU to one container of a pod, and then to no other",
            id="a-share-beside-a-whole-gpu",
        ),
        pytest.param(
            pod({"gpuadm.io/h100": "0.5"}, annotations={"gpu-fraction": "0.5"}),
            'container "main" asks for GPUs through annotation gpu-fraction and through its '
            "resources too; ask through gpuadm.io/h100 alone",
            id="class-key-and-kais-annotation",
        ),
        pytest.param(
            pod({GPU: "1"}, annotations={"gpu-fraction": "0.5", "gpuadm.io/class": "h100"}),
            "asks for GPUs through annotation gpu-fraction and through its resources too",
            id="whole-gpu-and-kais-annotation",
        ),
        pytest.param(
            pod({"cpu": "1"}, annotations={"gpu-fraction": "500m", "gpuadm.io/class": "h100"}),
            "annotation gpu-fraction: '500m' is not a share KAI reads: write a decimal between "
            "0 and 1, such as 0.5",
            id="fraction-with-a-suffix",
        ),
        pytest.param(
            pod({"cpu": "1"}, annotations={"gpu-fraction": "1", "gpuadm.io/class": "h100"}),
            "annotation gpu-fraction: '1' is not a share KAI reads",
            id="fraction-of-one",
        ),
        pytest.param(
            pod({"cpu": "1"}, annotations={"gpu-fraction": "1e99999", "gpuadm.io/class": "h100"}),
            "annotation gpu-fraction: '1e99999' is not a share KAI reads",
            id="fraction-beyond-any-quantity",
        ),
        pytest.param(
            pod({"cpu": "1"}, annotations={"gpu-memory": "2Gi", "gpuadm.io/class": "h100"}),
            "annotation gpu-memory: '2Gi' is not an amount KAI reads: write a whole number of "
            "MiB greater than 0, such as 10240",
            id="memory-with-a-suffix",
        ),
        pytest.param(
            pod({"cpu": "1"}, annotations={"gpu-memory": "0", "gpuadm.io/class": "h100"}),
            "annotation gpu-memory: '0' is not an amount KAI reads",
            id="memory-zero",
        ),
        pytest.param(
            pod(
                {"cpu": "1"},
                annotations={"gpu-memory": "100", "gpu-fraction": "0.5", "gpuadm.io/class": "h100"},
            ),
            "annotations gpu-fraction and gpu-memory both ask KAI for a share of a GPU, and KAI "
            "refuses a pod with both; keep one",
            id="fraction-and-memory",
        ),
        pytest.param(
            pod(
                {"cpu": "1"},
                annotations={
                    "gpu-fraction": "0.5",
                    "gpu-fraction-num-devices": "2",
                    "gpuadm.io/class": "h100",
                },
            ),
            "annotation gpu-fraction-num-devices asks KAI for a share of several GPUs, which "
            "gpuadm does not give",
            id="several-devices",
        ),
        pytest.param(
            pod(
                {"cpu": "1"},
                annotations={"gpu-fraction-container-name": "main", "gpuadm.io/class": "h100"},
            ),
            "annotation gpu-fraction-container-name names the container of a KAI GPU share, but "
            "the pod asks for no share (gpu-fraction or gpu-memory); remove it",
            id="container-name-alone",
        ),
        pytest.param(
            pod(
                {"cpu": "1"},
                annotations={
                    "gpu-fraction": "0.5",
                    "gpu-fraction-container-name": "nope",
                    "gpuadm.io/class": "h100",
                },
            ),
            "annotation gpu-fraction-container-name: 'nope' names no container of the pod",
            id="container-name-of-no-container",
        ),
        pytest.param(
            pod({"cpu": "1"}, annotations={"gpu-fraction": "0.5", "gpuadm.io/class": "a10"}),
            "annotation gpu-fraction asks a GPU stack for part of a GPU, but class a10 (backend "
            "hami) does not read it; remove it, and ask for gpuadm.io/a10 in the container instead",
            id="kais-annotation-in-another-stack-s-class",
        ),
        pytest.param(
            pod({"gpuadm.io/a10": "0.5"}, annotations={"gpu-memory": "100"}),
            "annotation gpu-memory asks a GPU stack for part of a GPU, but class a10",
            id="kais-annotation-beside-another-class-key",
        ),
        pytest.param(
            pod({"cpu": "1"}, annotations={"gpu-fraction": "0.5", "gpuadm.io/class": "whole"}),
            'container "main": class whole gives whole GPUs only (shareable: false), but '
            "annotation gpu-fraction asks for a share of 0.5",
            id="a-share-of-a-whole-gpus-class",
        ),
        pytest.param(
            pod({"gpuadm.io/h100-memory": "81Gi"}),
            "asks for 81Gi of GPU memory but one GPU of the class has 80Gi",
            id="more-memory-than-a-gpu",
        ),
    ],
)
def test_denials(kai: Policy, body: dict[str, Any], message: str) -> None:
    with pytest.raises(Denial) as denial:
        plan(body, kai)
    assert message in denial.value.message


def test_kais_annotations_name_no_class_in_a_policy_without_a_default() -> None:
    policy = load_policy("classes:\n  a:\n    backend: kai\n    memory: 16Gi\n")
    with pytest.raises(Denial, match=r"the pod asks for GPUs \(annotation gpu-fraction\) but"):
        plan(pod({"cpu": "1"}, annotations={"gpu-fraction": "0.5"}), policy)


# --- check-config ------------------------------------------------------------------------------

BASE = "classes:\n  a:\n    backend: kai\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            BASE,
            "policy.yaml:2: classes.a: backend kai needs `memory`",
            id="no-memory",
        ),
        pytest.param(
            BASE + "    memory: 64Mi\n",
            "policy.yaml:2: classes.a: memory 64Mi is less than 100Mi, the step KAI counts a "
            "GPU's memory in",
            id="memory-below-what-kai-counts",
        ),
        pytest.param(
            BASE + "    memory: 16Gi\n    queue: 'not a queue'\n",
            "policy.yaml:5: classes.a.queue: 'not a queue' cannot be a label value, so no pod "
            "can name it as its queue",
            id="queue-not-a-label-value",
        ),
        pytest.param(
            BASE + "    memory: 16Gi\n    queue: ''\n",
            "'' cannot be a label value",
            id="queue-empty",
        ),
        pytest.param(
            BASE + "    memory: 16Gi\n    queueLabel: 'kai queue'\n",
            "policy.yaml:5: classes.a.queueLabel: 'kai queue' is not a label key such as "
            "kai.scheduler/queue",
            id="queue-label-not-a-key",
        ),
        pytest.param(
            BASE + "    memory: 16Gi\n    queueLabel: Kai.Scheduler/queue\n",
            "'Kai.Scheduler/queue' is not a label key",
            id="queue-label-prefix-not-lowercase",
        ),
        pytest.param(
            BASE + "    memory: 16Gi\n    namespaces:\n      Team_A: {queue: a}\n",
            "'Team_A' is not a namespace name",
            id="namespace-not-a-name",
        ),
        pytest.param(
            BASE + "    memory: 16Gi\n    namespaces:\n      team-a: {}\n",
            "policy.yaml:6: classes.a.namespaces.team-a: sets neither `queue` nor "
            "`schedulerName`; set one, or remove it",
            id="namespace-sets-nothing",
        ),
        pytest.param(
            BASE + "    memory: 16Gi\n    namespaces:\n      team-a: {queue: 'a b'}\n",
            "classes.a.namespaces.team-a.queue: 'a b' cannot be a label value",
            id="namespace-queue-not-a-label-value",
        ),
        pytest.param(
            BASE + "    memory: 16Gi\n    namespaces:\n      team-a: {queu: a}\n",
            "classes.a.namespaces.team-a.queu: `queu` is not a key",
            id="namespace-key-misspelt",
        ),
        pytest.param(
            BASE + "    memory: 16Gi\n    queu: a\n",
            "policy.yaml:5: classes.a.queu: `queu` is not a key of a kai class; did you mean "
            "`queue`?",
            id="key-misspelt",
        ),
    ],
)
def test_config_errors_point_at_the_key(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_policy(text)
    assert any(expected in problem for problem in error.value.problems), error.value.problems


def test_a_class_for_whole_gpus_needs_no_memory() -> None:
    load_policy(BASE + "    shareable: false\n")


def test_the_shipped_webhooks_send_every_update_of_a_share(kai: Policy) -> None:
    """The validating webhook's update-concerns-gpuadm lists KAI's share annotations
    (tests/deploy/test_manifests.py renders it), so check-config has nothing to warn of."""
    assert [w for w in routing_warnings(kai) if w.startswith("class a100:")] == []


# --- the guard -------------------------------------------------------------------------------


def kai_mutated(kai: Policy, share: str = "0.5", **extra: Any) -> dict[str, Any]:
    """Return a share pod as gpuadm and then KAI's admission webhook leave it."""
    mutated, _ = apply(kai, pod({"gpuadm.io/h100": share}, **extra))
    mutated["metadata"]["annotations"]["runai/shared-gpu-configmap"] = "p-x7k2m9q-shared-gpu"
    main = mutated["spec"]["containers"][0]
    main["env"] = [
        {
            "name": "NVIDIA_VISIBLE_DEVICES",
            "valueFrom": {
                "configMapKeyRef": {
                    "name": "p-x7k2m9q-shared-gpu-0",
                    "key": "NVIDIA_VISIBLE_DEVICES",
                }
            },
        },
        {
            "name": "GPU_PORTION",
            "valueFrom": {
                "configMapKeyRef": {"name": "p-x7k2m9q-shared-gpu-0", "key": "GPU_PORTION"}
            },
        },
    ]
    main["envFrom"] = [{"configMapRef": {"name": "p-x7k2m9q-shared-gpu-0-evar", "optional": False}}]
    return mutated


def guarded(body: dict[str, Any], policy: Policy) -> None:
    """Check a pod as admission does: planned, then guarded with what the plan writes."""
    planned = plan(body, policy)
    check_guard(body, policy, planned.class_name, requests=planned.requests)


def test_kais_own_devices_variable_in_the_share_s_container_passes(kai: Policy) -> None:
    body = kai_mutated(kai)
    assert plan(body, kai).patch == []
    guarded(body, kai)


def test_kais_wiring_passes_whichever_webhook_ran_first(kai: Policy) -> None:
    """Were KAI's webhook to run before gpuadm's, the pod would bring KAI's wiring and ask
    for the share by the class key: what gpuadm writes decides, as it does once stored."""
    body = kai_mutated(kai)
    for key in ("gpu-fraction", "gpu-fraction-container-name"):
        body["metadata"]["annotations"].pop(key)
    body["spec"]["containers"][0]["resources"] = {"limits": {"gpuadm.io/h100": "0.5"}}
    guarded(body, kai)
    with pytest.raises(Denial, match="env NVIDIA_VISIBLE_DEVICES from valueFrom"):
        check_guard(body, kai, "h100")  # without the plan's share, the entry is anyone's


def test_kais_devices_variable_of_an_init_container_names_its_configmap_by_i(
    kai: Policy,
) -> None:
    mutated, _ = apply(
        kai, pod({"cpu": "1"}, init=[container("warmup", {"gpuadm.io/h100": "0.5"})])
    )
    mutated["metadata"]["annotations"]["runai/shared-gpu-configmap"] = "p-shared-gpu"
    entry = {
        "name": "NVIDIA_VISIBLE_DEVICES",
        "valueFrom": {
            "configMapKeyRef": {"name": "p-shared-gpu-i0", "key": "NVIDIA_VISIBLE_DEVICES"}
        },
    }
    mutated["spec"]["initContainers"][0]["env"] = [entry]
    guarded(mutated, kai)
    mutated["spec"]["initContainers"][0]["env"][0]["valueFrom"]["configMapKeyRef"]["name"] = (
        "p-shared-gpu-0"
    )
    with pytest.raises(Denial, match="NVIDIA_VISIBLE_DEVICES from valueFrom"):
        guarded(mutated, kai)


def _as_whole_gpu(body: dict[str, Any]) -> None:
    """Turn a share pod into one of a whole GPU, which KAI hands no GPU through a ConfigMap."""
    for key in ("gpu-fraction", "gpu-fraction-container-name", "gpuadm.io/demand"):
        body["metadata"]["annotations"].pop(key)
    body["spec"]["containers"][0]["resources"] = {"limits": {GPU: "1"}, "requests": {GPU: "1"}}


def _visible(body: dict[str, Any], index: int = 0) -> dict[str, Any]:
    entry: dict[str, Any] = body["spec"]["containers"][index]["env"][0]
    return entry


def _prefixed(body: dict[str, Any], prefix: str) -> None:
    """Give the pod a ConfigMap prefix of its own, as KAI's webhook keeps one a pod brings,
    and the share's container the wiring KAI's webhook would give it with that prefix."""
    body["metadata"]["annotations"]["runai/shared-gpu-configmap"] = prefix
    _visible(body)["valueFrom"]["configMapKeyRef"]["name"] = f"{prefix}-0"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda b: _visible(b).update(valueFrom=None, value="all"), id="a-value"),
        pytest.param(
            lambda b: _visible(b)["valueFrom"]["configMapKeyRef"].update(name="mine"),
            id="another-configmap",
        ),
        pytest.param(
            lambda b: _visible(b)["valueFrom"]["configMapKeyRef"].update(key="ALL"),
            id="another-key",
        ),
        pytest.param(
            lambda b: b["metadata"]["annotations"].pop("runai/shared-gpu-configmap"),
            id="no-configmap-named",
        ),
        pytest.param(lambda b: _prefixed(b, "mine"), id="a-prefix-outside-kais-form"),
        pytest.param(lambda b: _prefixed(b, "p-shared-gpu-x"), id="a-prefix-near-kais-form"),
        pytest.param(
            lambda b: b["spec"]["containers"].append(
                {**copy.deepcopy(b["spec"]["containers"][0]), "name": "second"}
            ),
            id="in-another-container",
        ),
        pytest.param(lambda b: _as_whole_gpu(b), id="a-whole-gpu-pod"),
    ],
)
def test_any_other_devices_variable_is_denied(kai: Policy, change: Any) -> None:
    body = kai_mutated(kai)
    change(body)
    with pytest.raises(Denial, match="env NVIDIA_VISIBLE_DEVICES"):
        guarded(body, kai)


def test_kais_exemption_is_for_kai_classes_only(kai: Policy) -> None:
    body = kai_mutated(kai)
    check_guard(body, kai, "h100")
    with pytest.raises(Denial, match="env NVIDIA_VISIBLE_DEVICES from valueFrom"):
        check_guard(body, kai, "a10")
    with pytest.raises(Denial, match="env NVIDIA_VISIBLE_DEVICES from valueFrom"):
        check_guard(body, kai, None)


@pytest.mark.parametrize(
    ("where", "key"),
    [
        pytest.param("labels", "runai-gpu-group", id="gpu-group"),
        pytest.param("labels", "runai-gpu-group/5b2a", id="gpu-group-of-several"),
        pytest.param("annotations", "received-resource-type", id="received-type"),
    ],
)
def test_a_pod_may_not_bring_what_kais_binder_writes(kai: Policy, where: str, key: str) -> None:
    body = pod({"gpuadm.io/h100": "0.5"})
    body["metadata"][where] = {key: "5b2a"}
    with pytest.raises(Denial) as denial:
        guarded(body, kai)
    kind = where[:-1]
    assert (
        f"the pod: {kind} {key} is written by KAI's binder when it binds a GPU share, to record "
        "which GPU the share is on: KAI counts a GPU's sharers by it; a pod may not bring it"
    ) in denial.value.message


BINDER = "system:serviceaccount:kai-scheduler:binder"


@pytest.mark.parametrize(
    ("where", "key", "before", "after"),
    [
        pytest.param("labels", "runai-gpu-group", None, "5b2a", id="group-added"),
        pytest.param("labels", "runai-gpu-group", "5b2a", "77c1", id="group-changed"),
        pytest.param("labels", "runai-gpu-group", "5b2a", None, id="group-removed"),
        pytest.param("labels", "runai-gpu-group/77c1", None, "77c1", id="one-of-several"),
        pytest.param("annotations", "received-resource-type", None, "Fraction", id="received-type"),
    ],
)
def test_only_kais_binder_changes_what_it_writes(
    kai: Policy, where: str, key: str, before: str | None, after: str | None
) -> None:
    old, _ = apply(kai, pod({"gpuadm.io/h100": "0.5"}))
    new = copy.deepcopy(old)
    for body, value in ((old, before), (new, after)):
        if value is not None:
            body["metadata"][where][key] = value
    with pytest.raises(Denial) as denial:
        check_allocation_update(old, new, kai, "alice")
    assert denial.value.message.startswith(f"{where[:-1]} {key} may be changed only by")
    assert BINDER in DEFAULT_GPU_STACK_USERS
    check_allocation_update(old, new, kai, BINDER)


def test_the_devices_variable_is_let_be_only_from_a_configmap_only_the_stack_writes(
    kai: Policy,
) -> None:
    """KAI keeps a prefix the pod brings; one in KAI's form names ConfigMaps only KAI's
    binder may write, so the entry that reads them is KAI's wiring, and is let be."""
    body = kai_mutated(kai)
    _prefixed(body, "mine-shared-gpu")
    guarded(body, kai)
    name = body["spec"]["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"]["name"]
    with pytest.raises(Denial, match="ConfigMap mine-shared-gpu-0 in namespace team-a"):
        check_devices_config_map(name, kai, user="alice", namespace="team-a")


# --- KAI's share ConfigMaps ------------------------------------------------------------------

TENANT = "alice"
KAI_NAMES = [
    pytest.param("train-x7k2m9q-shared-gpu-0", id="app-container"),
    pytest.param("train-x7k2m9q-shared-gpu-10", id="app-container-10"),
    pytest.param("train-x7k2m9q-shared-gpu-i0", id="init-container"),
    pytest.param("train-x7k2m9q-shared-gpu-0-evar", id="evar"),
    pytest.param("train-x7k2m9q-shared-gpu-i2-evar", id="init-container-evar"),
]
OTHER_NAMES = [
    pytest.param("settings", id="ordinary"),
    pytest.param("train-x7k2m9q-shared-gpu", id="the-prefix-alone"),
    pytest.param("train-x7k2m9q-shared-gpu-0-evar-old", id="after-evar"),
    pytest.param("train-x7k2m9q-shared-gpu-0x", id="after-the-index"),
    pytest.param("train-x7k2m9q-shared-gpus-0", id="near-miss"),
    pytest.param("shared-gpu-0", id="no-dash-before"),
    pytest.param("", id="no-name"),
]


@pytest.mark.parametrize("name", KAI_NAMES)
def test_a_tenant_may_not_write_a_configmap_named_as_kais_binder_names_them(
    kai: Policy, name: str
) -> None:
    with pytest.raises(Denial) as denial:
        check_devices_config_map(name, kai, user=TENANT, namespace="team-a")
    assert denial.value.message == (
        f"ConfigMap {name} in namespace team-a is named as KAI's binder names the ConfigMap "
        "that hands a GPU share its GPUs (its container reads NVIDIA_VISIBLE_DEVICES from "
        "it), so only the GPU stack (the policy's gpuStackUsers) may create or change it, "
        "not alice: a pod charged for a share would see every GPU it names. If alice is the "
        "GPU stack's own, an admin adds it to the policy's gpuStackUsers"
    )


@pytest.mark.parametrize("name", KAI_NAMES)
def test_kais_binder_writes_its_configmaps(kai: Policy, name: str) -> None:
    assert BINDER in DEFAULT_GPU_STACK_USERS
    check_devices_config_map(name, kai, user=BINDER, namespace="team-a")


@pytest.mark.parametrize("name", OTHER_NAMES)
def test_a_tenant_writes_any_other_configmap(kai: Policy, name: str) -> None:
    check_devices_config_map(name, kai, user=TENANT, namespace="team-a")


@pytest.mark.parametrize(
    ("policy_yaml", "namespace"),
    [
        pytest.param(POLICY_YAML, "team-a", id="no-kai-class"),
        pytest.param(KAI_POLICY_YAML + "exemptNamespaces: [lab]\n", "lab", id="exempt-namespace"),
        pytest.param(
            KAI_POLICY_YAML + "guard: {allocationAnnotations: false}\n",
            "team-a",
            id="guard-switched-off",
        ),
        pytest.param(
            KAI_POLICY_YAML + "gpuStackUsers: [alice]\n", "team-a", id="tenant-named-the-stack"
        ),
    ],
)
def test_where_kais_configmaps_are_not_guarded(policy_yaml: str, namespace: str) -> None:
    policy = load_policy(policy_yaml)
    check_devices_config_map("train-x7k2m9q-shared-gpu-0", policy, user=TENANT, namespace=namespace)


def test_the_stack_is_whoever_the_policy_names() -> None:
    """A policy that names its own stack users trusts those, and KAI's binder no more."""
    own = load_policy(KAI_POLICY_YAML + "gpuStackUsers: [system:serviceaccount:kai:binder]\n")
    check_devices_config_map(
        "x-shared-gpu-0", own, user="system:serviceaccount:kai:binder", namespace="t"
    )
    with pytest.raises(Denial, match=f"not {BINDER}: a pod charged"):
        check_devices_config_map("x-shared-gpu-0", own, user=BINDER, namespace="t")


# KAI's webhook makes a prefix of the pod's (or its owner's) name, cut and trimmed of '.' and
# '-', then 7 characters of k8s.io/apimachinery's utilrand alphabet, then `shared-gpu`.
_BASE = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,40}[a-z0-9])?", fullmatch=True)
_RANDOM = st.text(alphabet="bcdfghjklmnpqrstvwxz2456789", min_size=7, max_size=7)


@given(
    base=_BASE,
    random=_RANDOM,
    index=st.integers(min_value=0, max_value=99),
    init=st.booleans(),
    evar=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_every_name_kais_binder_gives_is_guarded(
    base: str, random: str, index: int, init: bool, evar: bool
) -> None:
    name = f"{base}-{random}-shared-gpu-{'i' if init else ''}{index}{'-evar' if evar else ''}"
    assert SHARE_CONFIG_MAPS.names.search(name)
    policy = load_policy(KAI_POLICY_YAML)
    with pytest.raises(Denial):
        check_devices_config_map(name, policy, user=TENANT, namespace="team-a")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("gpu-fraction", "0.9"),
        ("gpu-memory", "81000"),
        ("gpu-fraction-num-devices", "8"),
        ("gpu-fraction-container-name", "sidecar"),
    ],
)
def test_an_update_cannot_change_a_pending_pods_share(kai: Policy, key: str, value: str) -> None:
    old, _ = apply(kai, pod({"gpuadm.io/h100": "0.1"}))
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][key] = value
    with pytest.raises(Denial, match=f"annotation {key} may be set by gpuadm only"):
        check_update(old, new, kai)
    removed = copy.deepcopy(old)
    removed["metadata"]["annotations"].pop("gpu-fraction")
    with pytest.raises(Denial, match="annotation gpu-fraction may be set by gpuadm only"):
        check_update(old, removed, kai)


def test_a_privileged_debug_container_in_a_share_pod_is_a_gpu_pods(kai: Policy) -> None:
    old, _ = apply(kai, pod({"gpuadm.io/h100": "0.5"}))
    new = copy.deepcopy(old)
    debug = {"name": "debug", "image": "busybox", "securityContext": {"privileged": True}}
    new["spec"]["ephemeralContainers"] = [debug]
    with pytest.raises(Denial, match="in a GPU pod sees every GPU of the node"):
        check_added_containers(old, new, kai)


# --- properties --------------------------------------------------------------------------------


@given(thousandths=st.integers(min_value=1, max_value=999))
@settings(max_examples=200, deadline=None)
def test_a_share_is_written_in_hundredths_kai_keeps_never_above_the_ask(thousandths: int) -> None:
    policy = load_policy(KAI_POLICY_YAML)
    asked = Fraction(thousandths, 1000)
    mutated, result = apply(policy, pod({"gpuadm.io/h100": f"{thousandths}m"}))
    written = annotations_of(mutated)["gpu-fraction"]
    portion = Fraction(written)
    assert (portion * 100).denominator == 1
    # Rounded down, never to nothing: as many as add up to one GPU fit on one.
    assert max(asked - Fraction(1, 100), Fraction(0)) < portion <= max(asked, Fraction(1, 100))
    assert 0 < float(written) < 1  # as KAI's validator reads it
    # KAI rounds to the nearest hundredth, and keeps this one as it is.
    assert math.floor(float(written) * 100 + 0.5) == portion * 100
    assert result.charge == portion


@given(mib=st.integers(min_value=1, max_value=81920))
@settings(max_examples=200, deadline=None)
def test_a_memory_share_is_written_in_hundredths_of_kais_gpu_and_charged_them(mib: int) -> None:
    policy = load_policy(KAI_POLICY_YAML)
    mutated, result = apply(policy, pod({"gpuadm.io/h100-memory": f"{mib}Mi"}))
    if "gpu-memory" not in annotations_of(mutated):
        assert limits(mutated) == {GPU: "1"}
        assert result.charge == 1
        assert mib >= 81900
        return
    written = int(annotations_of(mutated)["gpu-memory"])
    assert written <= max(mib, 818)
    # KAI's own count of it (`getGpuMemoryFractionalOnNode`, in Go's float64): the charge.
    assert math.ceil(written / 81900 * 100) == result.charge * 100
    assert (result.charge * 100).denominator == 1
    assert Fraction(mib, 81900) - Fraction(1, 100) < result.charge


def test_check_config_would_say_which_share_updates_went_unrouted(
    kai: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should a webhook configuration stop listing them, check-config names what it misses."""
    monkeypatch.setattr("policies.policy.ROUTED_REQUEST_ANNOTATIONS", frozenset({"gpu-memory"}))
    (warning,) = [w for w in routing_warnings(kai) if w.startswith("class a100:")]
    assert "(gpu-fraction, gpu-fraction-num-devices, gpu-fraction-container-name)" in warning
    assert "update-concerns-gpuadm" in warning


def test_check_config_would_say_that_kais_configmaps_went_unrouted(
    kai: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should the shipped webhook stop routing KAI's ConfigMaps, check-config says so."""
    monkeypatch.setattr("policies.policy.ROUTED_DEVICES_CONFIG_MAPS", frozenset())
    warnings = [w for w in routing_warnings(kai) if "ConfigMaps" in w]
    assert [w.split(":", 1)[0] for w in warnings] == ["class a100", "class h100", "class whole"]
    assert "KAI's binder hands a share its GPUs" in warnings[0]
    assert "validate-configmaps.gpuadm.io" in warnings[0]
