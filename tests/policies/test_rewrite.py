"""The rewrite, one case per backend and request form, and every denial."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import jsonpatch
import pytest

from policies import ConfigError, Denial, Policy, load_policy, plan
from tests.apiserver_rules import violations
from tests.builders import container, pod

A100_TYPES = "NVIDIA A100-SXM4-80GB,NVIDIA A100 80GB PCIe"
ZONE = {"key": "zone", "operator": "In", "values": ["a"]}
HOST = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
T4_MODEL = {"key": "gaia.tencent.com/gpu-model", "operator": "In", "values": ["Tesla-T4"]}


def apply(policy: Policy, body: dict[str, Any], **kwargs: Any) -> tuple[dict[str, Any], Any]:
    """Plan, apply the patch, and check what the apiserver would check afterwards."""
    result = plan(body, policy, **kwargs)
    mutated = jsonpatch.apply_patch(body, result.patch)
    assert violations(mutated, policy.domain) == []
    assert plan(mutated, policy, **kwargs).patch == [], "the rewrite is not idempotent"
    return mutated, result


def limits_of(mutated: dict[str, Any], index: int = 0) -> dict[str, str]:
    resources = mutated["spec"]["containers"][index]["resources"]
    assert resources["limits"] == resources["requests"]
    return dict(resources["limits"])


@pytest.mark.parametrize(
    ("limits", "annotations", "expected", "charge", "rounded"),
    [
        pytest.param(
            {"gpuadm.io/a100": "2"}, {}, {"nvidia.com/gpu": "2"}, 2, False, id="hami-whole"
        ),
        pytest.param(
            {"gpuadm.io/a100": "0.25"},
            {},
            {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "25", "nvidia.com/gpumem": "20480"},
            Fraction(1, 4),
            False,
            id="hami-share",
        ),
        pytest.param(
            {"gpuadm.io/a100-memory": "10Gi"},
            {},
            {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "12", "nvidia.com/gpumem": "10240"},
            Fraction(1, 8),
            False,
            id="hami-memory-rounds-cores-down-and-is-charged-its-memory",
        ),
        pytest.param(
            {"gpuadm.io/a100": "1", "gpuadm.io/a100-memory": "40Gi"},
            {},
            # 100 cores: HAMi gives such a pod its GPU alone, as it is charged a whole one.
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40960", "nvidia.com/gpucores": "100"},
            1,
            False,
            id="hami-whole-with-memory-cap",
        ),
        pytest.param(
            {"gpuadm.io/a10": "2", "gpuadm.io/a10-memory": "8Gi"},
            {},
            {
                "volcano.sh/vgpu-number": "2",
                "volcano.sh/vgpu-memory": "8192",
                "volcano.sh/vgpu-cores": "100",
            },
            2,
            False,
            id="volcano-whole-with-memory-cap",
        ),
        pytest.param(
            {"nvidia.com/gpu": "2"},
            {"gpuadm.io/class": "a100"},
            {"nvidia.com/gpu": "2"},
            2,
            False,
            id="hami-untyped-gpu-count",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "30"},
            {"gpuadm.io/class": "a100"},
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8192", "nvidia.com/gpucores": "30"},
            Fraction(3, 10),
            False,
            id="hami-native-resources-pass-through",
        ),
        pytest.param(
            {"gpuadm.io/t4": "2"},
            {},
            {"tencent.com/vcuda-core": "200"},
            2,
            False,
            id="gpu-manager-whole",
        ),
        pytest.param(
            {"gpuadm.io/t4": "500m"},
            {},
            {"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "32"},
            Fraction(1, 2),
            False,
            id="gpu-manager-share",
        ),
        pytest.param(
            {"gpuadm.io/t4": "0.1"},
            {},
            {"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "6"},
            Fraction(1, 10),
            False,
            id="gpu-manager-share-rounds-memory-down-to-256Mi",
        ),
        pytest.param(
            {"gpuadm.io/t4-memory": "4Gi"},
            {},
            {"tencent.com/vcuda-core": "25", "tencent.com/vcuda-memory": "16"},
            Fraction(1, 4),
            False,
            id="gpu-manager-memory",
        ),
        pytest.param(
            {"gpuadm.io/t4": "0.995"},
            {},
            {"tencent.com/vcuda-core": "99", "tencent.com/vcuda-memory": "63"},
            Fraction(99, 100),
            True,
            id="gpu-manager-share-rounds-down-to-99-cores",
        ),
        pytest.param(
            {"gpuadm.io/t4-memory": "16Gi"},
            {},
            {"tencent.com/vcuda-core": "100"},
            1,
            False,
            id="gpu-manager-all-the-memory-is-a-whole-gpu",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {},
            {"tencent.com/vcuda-core": "100"},
            1,
            False,
            id="gpu-manager-untyped-via-default-class",
        ),
        pytest.param(
            {"gpuadm.io/h100": "4"}, {}, {"nvidia.com/gpu": "4"}, 4, False, id="nvidia-whole"
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"gpuadm.io/class": "h100"},
            {"nvidia.com/gpu": "1"},
            1,
            False,
            id="nvidia-untyped",
        ),
        pytest.param(
            {"gpuadm.io/a100-mig": "0.5"},
            {},
            {"nvidia.com/mig-3g.40gb": "1"},
            Fraction(1, 2),
            False,
            id="mig-share-half-is-3g.40gb",
        ),
        pytest.param(
            {"gpuadm.io/a100-mig": "0.1"},
            {},
            {"nvidia.com/mig-1g.10gb": "1"},
            Fraction(1, 7),
            True,
            id="mig-share-charged-by-compute-slices",
        ),
        pytest.param(
            {"gpuadm.io/a100-mig-memory": "15Gi"},
            {},
            {"nvidia.com/mig-2g.20gb": "1"},
            Fraction(2, 7),
            True,
            id="mig-memory-smallest-profile-that-fits",
        ),
        pytest.param(
            {"nvidia.com/mig-1g.10gb": "2"},
            {"gpuadm.io/class": "a100-mig"},
            {"nvidia.com/mig-1g.10gb": "2"},
            Fraction(2, 7),
            False,
            id="mig-untyped-profile",
        ),
        pytest.param(
            {"gpuadm.io/v100": "1"},
            {},
            {"aliyun.com/gpu-mem": "16"},
            1,
            False,
            id="gpushare-whole-is-all-memory",
        ),
        pytest.param(
            {"gpuadm.io/v100": "0.5"},
            {},
            {"aliyun.com/gpu-mem": "8"},
            Fraction(1, 2),
            False,
            id="gpushare-share",
        ),
        pytest.param(
            {"gpuadm.io/v100-memory": "1500Mi"},
            {},
            {"aliyun.com/gpu-mem": "1"},
            Fraction(1, 16),
            True,
            id="gpushare-memory-rounds-down-to-GiB",
        ),
        pytest.param(
            {"gpuadm.io/l4": "1"},
            {},
            {"nvidia.com/gpu.shared": "1"},
            1,
            False,
            id="time-slicing-whole",
        ),
        pytest.param(
            {"gpuadm.io/l4": "0.5"},
            {},
            {"nvidia.com/gpu.shared": "1"},
            1,
            True,
            id="time-slicing-share-is-a-whole-replica",
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"},
            {"gpuadm.io/class": "l4"},
            {"nvidia.com/gpu.shared": "1"},
            1,
            False,
            id="time-slicing-untyped",
        ),
        pytest.param(
            {"gpuadm.io/a10": "3"},
            {},
            {"volcano.sh/vgpu-number": "3"},
            3,
            False,
            id="volcano-whole",
        ),
        pytest.param(
            {"gpuadm.io/a10": "0.5"},
            {},
            {
                "volcano.sh/vgpu-number": "1",
                "volcano.sh/vgpu-cores": "50",
                "volcano.sh/vgpu-memory": "12288",
            },
            Fraction(1, 2),
            False,
            id="volcano-share",
        ),
        pytest.param(
            {"gpuadm.io/a10-memory": "6Gi"},
            {},
            {
                "volcano.sh/vgpu-number": "1",
                "volcano.sh/vgpu-cores": "25",
                "volcano.sh/vgpu-memory": "6144",
            },
            Fraction(1, 4),
            False,
            id="volcano-memory",
        ),
    ],
)
def test_rewrite_per_backend_and_form(
    policy: Policy,
    limits: dict[str, str],
    annotations: dict[str, str],
    expected: dict[str, str],
    charge: Fraction | int,
    rounded: bool,
) -> None:
    mutated, result = apply(policy, pod(limits, annotations=annotations))
    assert limits_of(mutated) == expected
    assert result.charge == charge
    class_name = result.class_name
    assert mutated["metadata"]["labels"]["gpuadm.io/class"] == class_name
    assert mutated["metadata"]["annotations"]["gpuadm.io/class"] == class_name
    assert mutated["metadata"]["annotations"]["gpuadm.io/demand"] == result.demand
    assert any(" rounded " in w for w in result.warnings) == rounded


@pytest.mark.parametrize(
    ("class_name", "scheduler"),
    [
        pytest.param("a100", "hami-scheduler", id="hami-uses-hami-scheduler"),
        pytest.param("a10", "volcano", id="volcano-uses-volcano"),
        pytest.param("t4", None, id="gpu-manager-keeps-scheduler"),
        pytest.param("h100", None, id="nvidia-keeps-scheduler"),
    ],
)
def test_scheduler_name(policy: Policy, class_name: str, scheduler: str | None) -> None:
    mutated, _ = apply(policy, pod({f"gpuadm.io/{class_name}": "1"}))
    assert mutated["spec"].get("schedulerName") == scheduler


def test_hami_pods_name_the_exact_gpu_types(policy: Policy) -> None:
    mutated, _ = apply(policy, pod({"gpuadm.io/a100": "1"}))
    assert mutated["metadata"]["annotations"]["nvidia.com/use-gputype"] == A100_TYPES


GPU_POLICY = "hami.io/gpu-scheduler-policy"


def hami_policy(gpu_scheduler_policy: str | None) -> Policy:
    line = f"    gpuSchedulerPolicy: {gpu_scheduler_policy}\n" if gpu_scheduler_policy else ""
    return load_policy(
        "classes:\n  a100:\n    backend: hami\n    memory: 80Gi\n"
        f"    models: [NVIDIA A100-SXM4-80GB]\n{line}"
    )


@pytest.mark.parametrize("amount", ["0.5", "0.333", "1", "2"])
def test_hami_pods_are_binpacked_unless_the_class_says_otherwise(amount: str) -> None:
    # Shares fill a GPU before they start another, so whole GPUs stay free for whole pods:
    # hami-scheduler spreads them over a node's GPUs unless told.
    mutated, _ = apply(hami_policy(None), pod({"gpuadm.io/a100": amount}))
    assert mutated["metadata"]["annotations"][GPU_POLICY] == "binpack"
    mutated, _ = apply(hami_policy("spread"), pod({"gpuadm.io/a100": amount}))
    assert mutated["metadata"]["annotations"][GPU_POLICY] == "spread"


def test_a_class_that_leaves_it_to_the_scheduler_writes_none_and_keeps_the_pods() -> None:
    policy = hami_policy("scheduler")
    mutated, result = apply(policy, pod({"gpuadm.io/a100": "0.5"}))
    assert GPU_POLICY not in mutated["metadata"]["annotations"]
    mutated, result = apply(policy, pod({"gpuadm.io/a100": "0.5"}, annotations={GPU_POLICY: "x"}))
    assert mutated["metadata"]["annotations"][GPU_POLICY] == "x"
    assert result.warnings == ()


def test_the_classs_gpu_policy_replaces_the_pods_and_says_so() -> None:
    body = pod({"gpuadm.io/a100": "0.5"}, annotations={GPU_POLICY: "spread"})
    mutated, result = apply(hami_policy(None), body)
    assert mutated["metadata"]["annotations"][GPU_POLICY] == "binpack"
    assert result.warnings == (
        f"annotation {GPU_POLICY}: 'spread' replaced by 'binpack', the value of class a100; "
        "the class chooses how its GPUs are shared",
    )
    _, result = apply(
        hami_policy(None), pod({"gpuadm.io/a100": "0.5"}, annotations={GPU_POLICY: "binpack"})
    )
    assert result.warnings == ()


def test_only_hami_classes_write_a_gpu_policy(policy: Policy) -> None:
    for class_name in ("a10", "t4", "h100"):
        mutated, _ = apply(policy, pod({f"gpuadm.io/{class_name}": "1"}))
        assert GPU_POLICY not in mutated["metadata"].get("annotations", {}), class_name


@pytest.mark.parametrize("value", ["topology-aware", "Binpack", "1"])
def test_an_unknown_gpu_policy_is_refused_by_name(value: str) -> None:
    with pytest.raises(ConfigError) as error:
        hami_policy(value)
    assert "gpuSchedulerPolicy" in str(error.value), error.value
    assert "binpack" in str(error.value), error.value


def test_default_scheduler_name_is_replaced(policy: Policy) -> None:
    mutated, _ = apply(policy, pod({"gpuadm.io/a100": "1"}, schedulerName="default-scheduler"))
    assert mutated["spec"]["schedulerName"] == "hami-scheduler"


def test_node_affinity_is_anded_into_every_existing_term(policy: Policy) -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    host = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchFields": [host]}]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [zone]}}
            ],
        }
    }
    mutated, _ = apply(policy, pod({"gpuadm.io/h100": "1"}, affinity=affinity))
    node_affinity = mutated["spec"]["affinity"]["nodeAffinity"]
    terms = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    h100 = {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
    assert terms == [
        {"matchExpressions": [zone, h100]},
        {"matchFields": [host], "matchExpressions": [h100]},
    ]
    assert (
        node_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
        == (affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"])
    )


@pytest.mark.parametrize(
    ("terms", "expected"),
    [
        pytest.param([{}], [{}], id="one-empty-term"),
        pytest.param([{"matchExpressions": []}], [{"matchExpressions": []}], id="no-expressions"),
        pytest.param(
            [{}, {"matchExpressions": [ZONE]}],
            [{}, {"matchExpressions": [ZONE, T4_MODEL]}],
            id="empty-term-beside-one-that-matches",
        ),
        pytest.param(
            [{"matchFields": [], "matchExpressions": None}, {"matchFields": [HOST]}],
            [
                {"matchFields": [], "matchExpressions": None},
                {"matchFields": [HOST], "matchExpressions": [T4_MODEL]},
            ],
            id="empty-fields-and-null-expressions",
        ),
    ],
)
def test_an_empty_term_matches_nothing_and_stays_empty(
    policy: Policy, terms: list[dict[str, Any]], expected: list[dict[str, Any]]
) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }
    body = pod({"gpuadm.io/t4": "1"}, affinity=affinity)
    result = plan(body, policy)
    mutated = jsonpatch.apply_patch(body, result.patch)
    required = mutated["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required["nodeSelectorTerms"] == expected
    assert plan(mutated, policy).patch == [], "the rewrite is not idempotent"


def test_pod_without_affinity_gets_one_term(policy: Policy) -> None:
    mutated, _ = apply(policy, pod({"gpuadm.io/t4": "1"}))
    required = mutated["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "gaia.tencent.com/gpu-model", "operator": "In", "values": ["Tesla-T4"]}
            ]
        }
    ]


def test_class_tolerations_are_added_once_beside_the_pods_own(policy: Policy) -> None:
    own = {"key": "team", "operator": "Equal", "value": "a", "effect": "NoSchedule"}
    mutated, _ = apply(policy, pod({"gpuadm.io/l4": "1"}, tolerations=[own]))
    assert mutated["spec"]["tolerations"] == [
        own,
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]


def test_existing_labels_and_annotations_are_kept(policy: Policy) -> None:
    body = pod({"gpuadm.io/t4": "1"}, annotations={"owner": "ann"})
    body["metadata"]["labels"] = {"app": "train"}
    mutated, _ = apply(policy, body)
    assert mutated["metadata"]["labels"] == {"app": "train", "gpuadm.io/class": "t4"}
    assert mutated["metadata"]["annotations"]["owner"] == "ann"


def test_other_resources_are_kept(policy: Policy) -> None:
    body = pod({"gpuadm.io/t4": "1", "cpu": "2", "memory": "4Gi"})
    mutated, _ = apply(policy, body)
    assert limits_of(mutated) == {"cpu": "2", "memory": "4Gi", "tencent.com/vcuda-core": "100"}


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(pod({"cpu": "1"}), id="cpu-only"),
        pytest.param(pod({}), id="no-resources"),
        pytest.param(pod({"nvidia.com/gpu": "0"}), id="zero-gpus"),
        pytest.param({"metadata": {}, "spec": {}}, id="no-containers"),
    ],
)
def test_pod_without_gpu_demand_gets_no_patch(policy: Policy, body: dict[str, Any]) -> None:
    result = plan(body, policy)
    assert result.patch == []
    assert result.class_name is None


def test_namespace_default_class_wins_over_policy_default(policy: Policy) -> None:
    mutated, result = apply(policy, pod({"nvidia.com/gpu": "1"}), namespace_default_class="h100")
    assert result.class_name == "h100"
    assert limits_of(mutated) == {"nvidia.com/gpu": "1"}


def test_annotation_wins_over_namespace_default(policy: Policy) -> None:
    body = pod({"nvidia.com/gpu": "1"}, annotations={"gpuadm.io/class": "l4"})
    _, result = apply(policy, body, namespace_default_class="h100")
    assert result.class_name == "l4"


def test_init_containers_and_sidecars_follow_the_effective_request_rule(policy: Policy) -> None:
    sidecar = container("proxy", {"gpuadm.io/a100": "0.25"}, restartPolicy="Always")
    setup = container("setup", {"gpuadm.io/a100": "0.5"})
    body = pod({"gpuadm.io/a100": "0.25"}, init=[sidecar, setup])
    mutated, result = apply(policy, body)
    # The init step is setup (0.5) beside the sidecar started before it (0.25) = 0.75;
    # running, the app (0.25) and the sidecar (0.25) = 0.5. The pod needs the larger.
    assert result.charge == Fraction(3, 4)
    assert (
        mutated["spec"]["initContainers"][1]["resources"]["limits"]["nvidia.com/gpucores"] == "50"
    )


def test_app_containers_add_up(policy: Policy) -> None:
    body = pod({"gpuadm.io/a100": "0.5"}, extra=[container("b", {"gpuadm.io/a100": "2"})])
    _, result = apply(policy, body)
    assert result.charge == Fraction(5, 2)
    assert result.demand == "a100=2.5"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            pod({"gpuadm.io/a100": "1.5"}),
            "container \"main\": gpuadm.io/a100: '1.5' is neither a whole number",
            id="one-and-a-half-gpus",
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "0"}),
            "gpuadm.io/a100: '0' is neither",
            id="zero-gpus-of-a-class",
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "-1"}), "gpuadm.io/a100: '-1' is neither", id="negative"
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "lots"}),
            "gpuadm.io/a100: 'lots' is not a quantity",
            id="not-a-quantity",
        ),
        pytest.param(
            pod({"gpuadm.io/a1000": "1"}), "gpuadm.io/a1000 names no GPU class", id="unknown-class"
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "1"}, extra=[container("b", {"gpuadm.io/t4": "1"})]),
            'two GPU classes (a100 in container "main", t4 in container "b")',
            id="two-classes-in-one-pod",
        ),
        pytest.param(
            pod({"gpuadm.io/h100": "0.5"}),
            "asks for a share of 0.5, but backend nvidia gives whole GPUs only",
            id="share-on-whole-gpu-backend",
        ),
        pytest.param(
            pod({"gpuadm.io/v100": "2"}),
            "gpushare gives a container at most one GPU",
            id="gpushare-two-gpus",
        ),
        pytest.param(
            pod({"gpuadm.io/v100": "0.5"}, extra=[container("b", {"gpuadm.io/v100": "0.5"})]),
            "gpushare cannot share a GPU between containers",
            id="gpushare-two-containers",
        ),
        pytest.param(
            pod({"gpuadm.io/l4": "2"}),
            "a time-sliced replica is one GPU at most",
            id="time-slicing-two",
        ),
        pytest.param(
            pod({"gpuadm.io/a100-mig": "1"}),
            "this MIG class gives slices only",
            id="mig-whole-without-whole-profile",
        ),
        pytest.param(
            pod({"nvidia.com/mig-4g.40gb": "1"}, annotations={"gpuadm.io/class": "a100-mig"}),
            "nvidia.com/mig-4g.40gb, which is not a MIG profile",
            id="mig-unknown-profile",
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "0.5", "gpuadm.io/a100-memory": "10Gi"}),
            "is a share and gpuadm.io/a100-memory is a memory amount",
            id="share-and-memory-together",
        ),
        pytest.param(
            pod({"gpuadm.io/t4-memory": "20Gi"}),
            "asks for 20Gi of GPU memory but one GPU of the class has 16Gi",
            id="memory-larger-than-a-gpu",
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "1", "gpuadm.io/a100-memory": "100Gi"}),
            "caps GPU memory at 100Gi, more than the 80Gi",
            id="memory-cap-too-large",
        ),
        pytest.param(
            pod({"nvidia.com/gpumem": "4000"}, annotations={"gpuadm.io/class": "t4"}),
            "nvidia.com/gpumem does not belong to class t4, whose backend gpu-manager",
            id="raw-resource-of-another-backend",
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "1", "nvidia.com/gpumem": "4000"}),
            "mixes gpuadm.io/a100 with raw GPU resources (nvidia.com/gpumem)",
            id="class-and-raw-in-one-container",
        ),
        pytest.param(
            pod({"nvidia.com/gpu": "500m"}),
            "nvidia.com/gpu: 0.5 is not a whole number",
            id="fractional-raw-gpu",
        ),
        pytest.param(
            pod({"nvidia.com/gpu": "1"}, annotations={"gpuadm.io/class": "b200"}),
            "annotation gpuadm.io/class: 'b200' is not a GPU class",
            id="unknown-annotation",
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "1"}, annotations={"gpuadm.io/class": "t4"}),
            "annotation gpuadm.io/class: 't4' contradicts gpuadm.io/a100",
            id="annotation-contradicts-key",
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "1"}, schedulerName="my-scheduler"),
            "scheduled by 'hami-scheduler', but the pod names schedulerName 'my-scheduler'",
            id="foreign-scheduler-where-class-needs-its-own",
        ),
        pytest.param(
            pod({"gpuadm.io/a10": "1"}, nodeName="node-1"),
            "sets nodeName 'node-1', which bypasses it",
            id="node-name-bypasses-scheduler",
        ),
    ],
)
def test_denials_name_container_key_and_value(
    policy: Policy, body: dict[str, Any], message: str
) -> None:
    with pytest.raises(Denial) as denial:
        plan(body, policy)
    assert message in denial.value.message


def test_requests_that_differ_from_limits_are_denied(policy: Policy) -> None:
    body = pod({"gpuadm.io/a100": "1"})
    body["spec"]["containers"][0]["resources"]["requests"] = {"gpuadm.io/a100": "2"}
    with pytest.raises(Denial, match="requests '2' but limits '1'"):
        plan(body, policy)


def test_requests_alone_are_enough(policy: Policy) -> None:
    body = pod({})
    body["spec"]["containers"][0]["resources"] = {"requests": {"gpuadm.io/h100": "1"}}
    mutated, _ = apply(policy, body)
    assert limits_of(mutated) == {"nvidia.com/gpu": "1"}


def test_unshareable_class_refuses_shares() -> None:
    from policies import load_policy

    strict = load_policy("classes:\n  a100:\n    backend: hami\n    shareable: false\n")
    with pytest.raises(Denial, match=r"whole GPUs only \(shareable: false\)"):
        plan(pod({"gpuadm.io/a100": "0.5"}), strict)


def test_untyped_pod_without_any_class_is_denied() -> None:
    from policies import load_policy

    no_default = load_policy("classes:\n  h100:\n    backend: nvidia\n")
    with pytest.raises(Denial, match=r"names no class: set the annotation gpuadm\.io/class"):
        plan(pod({"nvidia.com/gpu": "1"}), no_default)


NO_CLASSES = "exemptNamespaces: [kube-system]\nclasses: {}\n"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(pod({"nvidia.com/gpu": "1"}), id="a-whole-gpu"),
        pytest.param(pod({"nvidia.com/gpumem": "4096"}), id="a-stacks-own-share"),
        pytest.param(pod({}, annotations={"gpu-fraction": "0.5"}), id="a-share-by-annotation"),
    ],
)
def test_a_policy_without_classes_leaves_gpu_stacks_requests_alone(body: dict[str, Any]) -> None:
    """The Helm chart's default policy: nothing is rewritten and nothing is charged."""
    from policies import load_policy

    result = plan(body, load_policy(NO_CLASSES))
    assert result.patch == []
    assert result.class_name is None
    assert result.charge == 0
    assert result.demand is None


def test_a_policy_without_classes_still_refuses_a_class_key() -> None:
    from policies import load_policy

    with pytest.raises(Denial, match=r"gpuadm\.io/a100 names no GPU class \(classes: none\)"):
        plan(pod({"gpuadm.io/a100": "1"}), load_policy(NO_CLASSES))


def test_mig_whole_gpus_with_a_whole_profile() -> None:
    from policies import load_policy

    mig = load_policy(
        "classes:\n  a100:\n    backend: mig\n    memory: 80Gi\n    wholeProfile: 7g.80gb\n"
        "    profiles: {1g.10gb: 10Gi, 7g.80gb: 80Gi}\n"
    )
    mutated, result = apply(mig, pod({"gpuadm.io/a100": "2"}))
    assert limits_of(mutated) == {"nvidia.com/mig-7g.80gb": "2"}
    assert result.charge == 2


def test_custom_domain_and_resource_names() -> None:
    from policies import load_policy

    custom = load_policy(
        "domain: gpus.example.com\nclasses:\n  t4:\n    backend: gpu-manager\n    memory: 16Gi\n"
        "    resources: {cores: example.com/core, memory: example.com/mem}\n"
        "    memoryBlock: 1Gi\n"
    )
    mutated, _ = apply(custom, pod({"gpus.example.com/t4": "0.5"}))
    assert limits_of(mutated) == {"example.com/core": "50", "example.com/mem": "8"}
    assert mutated["metadata"]["labels"] == {"gpus.example.com/class": "t4"}
