"""The guard: GPU access outside a pod's resources is denied, rule by rule, container by kind."""

from __future__ import annotations

import contextlib
import copy
import re
from pathlib import Path
from typing import Any

import pytest

from policies import (
    ConfigError,
    Denial,
    Policy,
    check_added_containers,
    check_guard,
    load_policy,
    plan,
)
from policies.access.guard import ALLOCATION_ANNOTATIONS, check_allocation_update
from policies.policy import DEFAULT_GPU_STACK_USERS, Guard
from tests.builders import POLICY_YAML, container, pod

DOCS = Path(__file__).resolve().parents[2] / "docs"
CPU = {"cpu": "1"}
VISIBLE_ALL = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
# How every guard denial ends: a GPU stack's own pod gets through by its namespace's
# exemption, never by a rule switched off for every tenant of the cluster.
EXEMPT_ITS_NAMESPACE = (
    "If this is a GPU stack's own pod (a device plugin, the container toolkit, a driver), "
    "its namespace must be exempt: an admin adds it to the policy's exemptNamespaces "
    "(the Helm value policy.exemptNamespaces)"
)


def assert_the_way_out_is_an_exemption(message: str) -> None:
    assert message.endswith(". " + EXEMPT_ITS_NAMESPACE)
    assert "guard." not in message


def guarded(body: dict[str, Any], policy: Policy) -> None:
    """Check a pod as admission does: the class as the plan finds it, then the guard."""
    check_guard(body, policy, plan(body, policy).class_name)


def with_guard(**switches: bool) -> Policy:
    """Return the test policy with some guard rules switched off (by their camelCase keys)."""
    lines = "".join(f"  {key}: {str(value).lower()}\n" for key, value in switches.items())
    return load_policy(POLICY_YAML + "guard:\n" + lines)


def in_kind(kind: str, limits: dict[str, str], **fields: Any) -> dict[str, Any]:
    """Build a pod with `limits` on its main container and one more container of `kind`."""
    extra = container("extra", {}, **fields)
    if kind == "containers":
        return pod(limits, extra=[extra])
    if kind == "sidecar":
        return pod(limits, init=[{**extra, "restartPolicy": "Always"}])
    if kind == "initContainers":
        return pod(limits, init=[extra])
    return pod(limits, ephemeralContainers=[extra])


KINDS = [
    pytest.param("containers", 'container "extra"', id="container"),
    pytest.param("initContainers", 'init container "extra"', id="init-container"),
    pytest.param("sidecar", 'sidecar "extra"', id="sidecar"),
    pytest.param("ephemeralContainers", 'ephemeral container "extra"', id="ephemeral-container"),
]


# --- NVIDIA_VISIBLE_DEVICES -------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "where"), KINDS)
@pytest.mark.parametrize("limits", [CPU, {"gpuadm.io/a100": "1"}], ids=["no-gpus", "gpu-pod"])
def test_visible_devices_in_any_container_is_denied(
    policy: Policy, kind: str, where: str, limits: dict[str, str]
) -> None:
    with pytest.raises(Denial) as denial:
        guarded(in_kind(kind, limits, env=VISIBLE_ALL), policy)
    message = denial.value.message
    assert message.startswith("GPU access outside the pod's resources: ")
    assert f"{where}: env NVIDIA_VISIBLE_DEVICES=all may give it GPUs" in message
    assert_the_way_out_is_an_exemption(message)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        pytest.param({"value": "0,1"}, "env NVIDIA_VISIBLE_DEVICES=0,1", id="indexes"),
        pytest.param(
            {"value": "GPU-8e3f0b6a-1c2d-4e5f-a6b7-c8d9e0f1a2b3"},
            "env NVIDIA_VISIBLE_DEVICES=GPU-8e3f0b6a",
            id="uuid",
        ),
        pytest.param({"value": "VOID"}, "NVIDIA_VISIBLE_DEVICES=VOID", id="void-is-lowercase"),
        pytest.param({"value": ""}, "NVIDIA_VISIBLE_DEVICES=(empty)", id="empty"),
        pytest.param({}, "NVIDIA_VISIBLE_DEVICES=(empty)", id="no-value"),
        pytest.param(
            {"valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "devices"}}},
            "env NVIDIA_VISIBLE_DEVICES from valueFrom (a value gpuadm cannot check)",
            id="from-a-configmap",
        ),
        pytest.param(
            {"value": "void", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            "from valueFrom",
            id="value-and-value-from",
        ),
    ],
)
def test_visible_devices_values_that_may_name_gpus(
    policy: Policy, entry: dict[str, Any], field: str
) -> None:
    body = pod(CPU, extra=[container("x", {}, env=[{"name": "NVIDIA_VISIBLE_DEVICES", **entry}])])
    with pytest.raises(Denial, match="may give it GPUs") as denial:
        guarded(body, policy)
    assert field in denial.value.message


@pytest.mark.parametrize("value", ["void", "none"])
@pytest.mark.parametrize(("kind", "where"), KINDS)
def test_void_and_none_are_allowed(policy: Policy, value: str, kind: str, where: str) -> None:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]
    guarded(in_kind(kind, {"gpuadm.io/a100": "1"}, env=env), policy)
    guarded(in_kind(kind, CPU, env=env), policy)


def test_every_entry_counts_not_only_the_first(policy: Policy) -> None:
    env = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
    ]
    with pytest.raises(Denial, match="NVIDIA_VISIBLE_DEVICES=all"):
        guarded(pod(CPU, extra=[container("x", {}, env=env)]), policy)


def test_similar_names_are_not_the_variable(policy: Policy) -> None:
    env = [
        {"name": "nvidia_visible_devices", "value": "all"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"},
    ]
    guarded(pod(CPU, extra=[container("x", {}, env=env)]), policy)


# --- hostPath under /dev/nvidia ----------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/dev/nvidia0", id="a-gpu"),
        pytest.param("/dev/nvidiactl", id="the-control-device"),
        pytest.param("/dev/nvidia-uvm", id="uvm"),
        pytest.param("/dev/nvidia-caps/nvidia-cap1", id="mig-capability"),
        pytest.param("//dev//nvidia0", id="doubled-slashes"),
        pytest.param("/dev/./nvidia0/", id="dot-and-trailing-slash"),
        pytest.param("/./dev/nvidia0", id="leading-dot"),
        pytest.param("/dev/../dev/nvidia0", id="backstep"),
        pytest.param("dev/nvidia0", id="relative"),
    ],
)
def test_a_host_path_under_dev_nvidia_is_denied(policy: Policy, path: str) -> None:
    volumes = [
        {"name": "data", "emptyDir": {}},
        {"name": "gpu", "hostPath": {"path": path, "type": "CharDevice"}},
    ]
    mount = [{"name": "gpu", "mountPath": "/dev/nvidia0"}]
    body = pod(CPU, volumes=volumes, extra=[container("x", {}, volumeMounts=mount)])
    with pytest.raises(Denial) as denial:
        guarded(body, policy)
    assert (
        f'volume "gpu" (mounted by container "x"): volumes[1].hostPath.path={path} exposes '
        "the node's GPU devices" in denial.value.message
    )
    assert_the_way_out_is_an_exemption(denial.value.message)


def test_an_unmounted_device_volume_is_denied_too(policy: Policy) -> None:
    # An ephemeral container added later could mount it.
    body = pod(CPU, volumes=[{"name": "gpu", "hostPath": {"path": "/dev/nvidia0"}}])
    with pytest.raises(Denial, match=r'volume "gpu": volumes\[0\]\.hostPath\.path=/dev/nvidia0'):
        guarded(body, policy)


@pytest.mark.parametrize(
    "path",
    [
        "/dev/null",
        "/dev/fuse",
        "/dev/charlie",
        "/var/lib/nvidia",
        "/devices/nvidia0",
        "/var",
        "/var/log",
        "/run/containerd/containerd.sock",
        "/var/run/docker.sock",
        "/run/nvidia/driver/usr/lib",
        "/run/nvidia/driverx",
        "/run/nvidia-persistenced",
        "/home/dev/char",
    ],
)
def test_other_host_paths_are_not_the_guards(policy: Policy, path: str) -> None:
    guarded(pod(CPU, volumes=[{"name": "v", "hostPath": {"path": path}}]), policy)


# --- hostPath of a directory that holds the GPU device files ----------------------------------

DEVICE_DIR_PATHS = [
    pytest.param("/dev/char", id="char-device-links"),
    pytest.param("/dev/char/195:0", id="one-char-device-link"),
    pytest.param("/run/nvidia/driver/dev", id="driver-root-devices"),
    pytest.param("/run/nvidia/driver/dev/nvidia0", id="driver-root-gpu"),
    pytest.param("/var/run/nvidia/driver/dev", id="var-run-is-run"),
    pytest.param("/dev", id="dev"),
    pytest.param("/", id="root"),
    pytest.param("/run", id="run"),
    pytest.param("/var/run", id="var-run"),
    pytest.param("/run/nvidia", id="run-nvidia"),
    pytest.param("/run/nvidia/driver", id="driver-root"),
    pytest.param("//dev/./char/", id="doubled-slash-dot-trailing-slash"),
    pytest.param("/dev/", id="dev-trailing-slash"),
    pytest.param("/.", id="root-dot"),
    pytest.param("//", id="root-doubled"),
    pytest.param("/dev/../dev/char", id="backstep"),
    pytest.param("/run/nvidia/../nvidia/driver/./dev", id="backstep-and-dot"),
    pytest.param("dev/char", id="relative"),
]


@pytest.mark.parametrize("path", DEVICE_DIR_PATHS)
def test_a_host_path_holding_gpu_device_files_is_denied(policy: Policy, path: str) -> None:
    mount = [{"name": "host", "mountPath": "/host"}]
    body = pod(
        CPU,
        volumes=[{"name": "host", "hostPath": {"path": path}}],
        extra=[container("x", {}, volumeMounts=mount)],
    )
    with pytest.raises(Denial) as denial:
        guarded(body, policy)
    message = denial.value.message
    assert (
        f'volume "host" (mounted by container "x"): volumes[0].hostPath.path={path} holds the '
        "node's GPU device files" in message
    )
    assert_the_way_out_is_an_exemption(message)
    guarded(body, with_guard(deviceDirHostPath=False))


def test_dev_nvidia_stays_the_dev_host_path_rule(policy: Policy) -> None:
    body = pod(CPU, volumes=[{"name": "gpu", "hostPath": {"path": "/dev/nvidia0"}}])
    with pytest.raises(Denial, match="exposes the node's GPU devices"):
        guarded(body, with_guard(deviceDirHostPath=False))


# --- mounts under /var/run/nvidia-container-devices -------------------------------------------

DEVICE_LIST_MOUNTS = [
    pytest.param("/var/run/nvidia-container-devices/all", id="all"),
    pytest.param("/var/run/nvidia-container-devices/0", id="an-index"),
    pytest.param("/var/run/nvidia-container-devices/GPU-8e3f0b6a-1c2d", id="uuid"),
    pytest.param("/var/run/nvidia-container-devices/cdi/nvidia.com/gpu=all", id="cdi-name"),
    pytest.param("/var/run/nvidia-container-devices", id="the-root-itself"),
    pytest.param("/var/run/nvidia-container-devices/", id="trailing-slash"),
    pytest.param("//var/run//nvidia-container-devices/0", id="doubled-slashes"),
    pytest.param("/var/run/./nvidia-container-devices/all", id="dot"),
    pytest.param("/var/lib/../run/nvidia-container-devices/all", id="backstep"),
    pytest.param("/var/run/nvidia-container-devicesall", id="no-separator"),
    pytest.param("var/run/nvidia-container-devices/all", id="relative"),
]


@pytest.mark.parametrize("path", DEVICE_LIST_MOUNTS)
@pytest.mark.parametrize(("kind", "where"), KINDS)
@pytest.mark.parametrize(
    "volume",
    [
        pytest.param({"hostPath": {"path": "/dev/null"}}, id="host-dev-null"),
        pytest.param({"emptyDir": {}}, id="empty-dir"),
    ],
)
def test_a_mount_naming_a_device_list_is_denied(
    policy: Policy, path: str, kind: str, where: str, volume: dict[str, Any]
) -> None:
    body = in_kind(kind, CPU, volumeMounts=[{"name": "list", "mountPath": path}])
    body["spec"]["volumes"] = [{"name": "list", **volume}]
    with pytest.raises(Denial) as denial:
        guarded(body, policy)
    message = denial.value.message
    assert (
        f"{where}: volumeMounts[0].mountPath={path} names GPUs to the NVIDIA Container "
        "Toolkit's volume-mounts device list" in message
    )
    assert_the_way_out_is_an_exemption(message)
    guarded(body, with_guard(deviceListMounts=False))


@pytest.mark.parametrize(
    "path",
    [
        "/run/nvidia-container-devices/all",
        "/data/var/run/nvidia-container-devices/all",
        "/var/run/secrets/kubernetes.io/serviceaccount",
        "/var/run/nvidia-container",
        "/var/run/nvidia-container-devices/../../x",
    ],
)
def test_other_mounts_are_not_a_device_list(policy: Policy, path: str) -> None:
    mounts = [{"name": "v", "mountPath": path}]
    body = pod(CPU, extra=[container("x", {}, volumeMounts=mounts)])
    body["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    guarded(body, policy)


# --- privileged containers in GPU pods --------------------------------------------------------


@pytest.mark.parametrize(("kind", "where"), KINDS)
@pytest.mark.parametrize("gpus", [{"gpuadm.io/h100": "1"}, {"nvidia.com/gpu": "1"}])
def test_a_privileged_container_in_a_gpu_pod_is_denied(
    policy: Policy, kind: str, where: str, gpus: dict[str, str]
) -> None:
    body = in_kind(kind, gpus, securityContext={"privileged": True})
    with pytest.raises(Denial) as denial:
        guarded(body, policy)
    assert (
        f"{where}: securityContext.privileged=true in a GPU pod sees every GPU of the node"
        in denial.value.message
    )
    assert_the_way_out_is_an_exemption(denial.value.message)


@pytest.mark.parametrize(("kind", "where"), KINDS)
def test_privilege_outside_gpu_pods_is_left_to_pod_security(
    policy: Policy, kind: str, where: str
) -> None:
    guarded(in_kind(kind, CPU, securityContext={"privileged": True}), policy)
    guarded(in_kind(kind, {"gpuadm.io/h100": "1"}, securityContext={"privileged": False}), policy)


# --- HAMi and Volcano isolation switches ------------------------------------------------------

ISOLATED = [
    pytest.param({"gpuadm.io/a100": "0.5"}, "HAMi", id="hami"),
    pytest.param({"gpuadm.io/a10": "0.5"}, "Volcano", id="volcano"),
]


@pytest.mark.parametrize(("limits", "stack"), ISOLATED)
@pytest.mark.parametrize(("kind", "where"), KINDS)
@pytest.mark.parametrize(
    ("entry", "field"),
    [
        pytest.param(
            {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
            "env CUDA_DISABLE_CONTROL=true can switch {stack}'s in-container limiter",
            id="disable-control",
        ),
        pytest.param(
            {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"},
            "env GPU_CORE_UTILIZATION_POLICY=disable may lift {stack}'s core limit",
            id="core-policy-disable",
        ),
    ],
)
def test_isolation_switches_in_hami_and_volcano_pods_are_denied(
    policy: Policy,
    limits: dict[str, str],
    stack: str,
    kind: str,
    where: str,
    entry: dict[str, str],
    field: str,
) -> None:
    with pytest.raises(Denial) as denial:
        guarded(in_kind(kind, limits, env=[entry]), policy)
    assert f"{where}: {field.format(stack=stack)}" in denial.value.message
    assert_the_way_out_is_an_exemption(denial.value.message)


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param(
            {"name": "CUDA_DISABLE_CONTROL", "value": "false"}, id="disable-control-false"
        ),
        pytest.param({"name": "CUDA_DISABLE_CONTROL", "value": "1"}, id="disable-control-1"),
        pytest.param({"name": "GPU_CORE_UTILIZATION_POLICY", "value": "DISABLE"}, id="uppercase"),
        pytest.param({"name": "GPU_CORE_UTILIZATION_POLICY", "value": "off"}, id="unknown-policy"),
        pytest.param(
            {"name": "GPU_CORE_UTILIZATION_POLICY", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
            id="core-policy-from-elsewhere",
        ),
        pytest.param({"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"}, id="memory-limit"),
        pytest.param({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80g"}, id="memory-fallback"),
        pytest.param({"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"}, id="core-limit"),
        pytest.param(
            {"name": "CUDA_DEVICE_MEMORY_SHARED_CACHE", "value": "/tmp/mine.cache"},
            id="shared-region-file",
        ),
        pytest.param({"name": "CUDA_REDIRECT", "value": "/lib/libcuda.so.1"}, id="redirect"),
        pytest.param(
            {"name": "CUDA_DISABLE_CONTROL", "valueFrom": {"configMapKeyRef": {"name": "c"}}},
            id="disable-control-from-a-configmap",
        ),
        pytest.param(
            {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "valueFrom": {"secretKeyRef": {"name": "s"}}},
            id="memory-limit-from-a-secret",
        ),
        pytest.param(
            {"name": "CUDA_DEVICE_MEMORY_SHARED_CACHE", "valueFrom": {"fieldRef": {}}},
            id="shared-region-file-from-elsewhere",
        ),
        pytest.param(
            {"name": "CUDA_REDIRECT", "valueFrom": {"configMapKeyRef": {"name": "c"}}},
            id="redirect-from-a-configmap",
        ),
    ],
)
def test_every_value_that_may_switch_isolation_off_is_denied(
    policy: Policy, entry: dict[str, Any]
) -> None:
    body = pod({"gpuadm.io/a100": "0.25"}, extra=[container("x", {}, env=[entry])])
    with pytest.raises(Denial) as denial:
        guarded(body, policy)
    assert f'container "x": env {entry["name"]}' in denial.value.message


@pytest.mark.parametrize("value", ["default", "force", "FORCE"])
def test_core_policies_that_keep_the_limit_are_allowed(policy: Policy, value: str) -> None:
    env = [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": value}]
    guarded(pod({"gpuadm.io/a100": "0.25"}, extra=[container("x", {}, env=env)]), policy)


@pytest.mark.parametrize(
    "limits",
    [
        pytest.param(CPU, id="no-gpus"),
        pytest.param({"gpuadm.io/h100": "1"}, id="nvidia"),
        pytest.param({"gpuadm.io/t4": "0.5"}, id="gpu-manager"),
    ],
)
def test_isolation_switches_are_for_hami_and_volcano_only(
    policy: Policy, limits: dict[str, str]
) -> None:
    env = [
        {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
        {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"},
    ]
    guarded(pod(limits, extra=[container("x", {}, env=env)]), policy)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "at a region file of the pod's own"),
        ("CUDA_REDIRECT", "take CUDA calls from another library"),
    ],
)
@pytest.mark.parametrize(("limits", "stack"), ISOLATED)
def test_the_limiter_cannot_be_pointed_elsewhere(
    policy: Policy, name: str, reason: str, limits: dict[str, str], stack: str
) -> None:
    body = pod(limits, extra=[container("x", {}, env=[{"name": name, "value": "/x"}])])
    with pytest.raises(Denial) as denial:
        guarded(body, policy)
    assert f'container "x": env {name}=/x ' in denial.value.message
    assert f"{stack}'s limiter (HAMi-core)" in denial.value.message
    assert reason in denial.value.message


# --- envFrom in hami and volcano pods ---------------------------------------------------------


def with_env_from(kind: str, limits: dict[str, str], *sources: dict[str, Any]) -> dict[str, Any]:
    """Build a pod whose container of `kind`, asking for `limits`, takes `envFrom` sources."""
    gpu = container("gpu", limits, envFrom=list(sources))
    if kind == "containers":
        return pod(CPU, extra=[gpu])
    if kind == "sidecar":
        return pod(CPU, init=[{**gpu, "restartPolicy": "Always"}])
    return pod(CPU, init=[gpu])


CONFIG_MAP = {"configMapRef": {"name": "settings"}}
GPU_KINDS = [
    pytest.param("containers", 'container "gpu"', id="container"),
    pytest.param("initContainers", 'init container "gpu"', id="init-container"),
    pytest.param("sidecar", 'sidecar "gpu"', id="sidecar"),
]


@pytest.mark.parametrize(("limits", "stack"), ISOLATED)
@pytest.mark.parametrize(("kind", "where"), GPU_KINDS)
def test_env_from_in_a_hami_or_volcano_gpu_container_is_denied(
    policy: Policy, limits: dict[str, str], stack: str, kind: str, where: str
) -> None:
    with pytest.raises(Denial) as denial:
        guarded(with_env_from(kind, limits, CONFIG_MAP), policy)
    message = denial.value.message
    assert (
        f"{where}: envFrom[0] (ConfigMap settings) may set {stack}'s limiter variables" in message
    )
    assert "give it a prefix no such variable starts with (e.g. APP_)" in message
    assert "as plain env" in message
    assert_the_way_out_is_an_exemption(message)
    guarded(with_env_from(kind, limits, CONFIG_MAP), with_guard(isolationSwitches=False))


@pytest.mark.parametrize(
    ("source", "named"),
    [
        pytest.param({"secretRef": {"name": "keys"}}, "envFrom[0] (Secret keys)", id="secret"),
        pytest.param({**CONFIG_MAP, "prefix": ""}, "envFrom[0]", id="empty-prefix"),
        pytest.param({**CONFIG_MAP, "prefix": "CUDA_"}, "envFrom[0]", id="cuda"),
        pytest.param({**CONFIG_MAP, "prefix": "C"}, "envFrom[0]", id="one-letter"),
        pytest.param({**CONFIG_MAP, "prefix": "GPU_"}, "envFrom[0]", id="core-policy-start"),
        pytest.param(
            {**CONFIG_MAP, "prefix": "CUDA_DEVICE_SM_LIMIT"}, "envFrom[0]", id="a-limit-itself"
        ),
        pytest.param(
            {**CONFIG_MAP, "prefix": "CUDA_DEVICE_MEMORY_LIMIT_"},
            "envFrom[0]",
            id="per-device-limits",
        ),
        pytest.param({**CONFIG_MAP, "prefix": 7}, "envFrom[0]", id="odd-prefix"),
        pytest.param({}, "envFrom[0] (a source gpuadm cannot read)", id="no-source"),
    ],
)
def test_env_from_that_may_produce_a_limiter_variable(
    policy: Policy, source: dict[str, Any], named: str
) -> None:
    with pytest.raises(Denial, match="may set HAMi's limiter variables") as denial:
        guarded(with_env_from("containers", {"gpuadm.io/a100": "0.5"}, source), policy)
    assert named in denial.value.message


def test_every_env_from_source_is_named(policy: Policy) -> None:
    body = with_env_from(
        "containers",
        {"gpuadm.io/a100": "0.5"},
        {**CONFIG_MAP, "prefix": "APP_"},
        {"secretRef": {"name": "keys"}},
    )
    with pytest.raises(Denial) as denial:
        guarded(body, policy)
    assert "envFrom[1] (Secret keys)" in denial.value.message
    assert "envFrom[0]" not in denial.value.message


@pytest.mark.parametrize(
    "prefix", ["APP_", "NCCL_", "CUDA_X_", "GPU_X", "CUDA_DISABLE_CONTROL", "CUDA_REDIRECT"]
)
def test_env_from_with_a_prefix_no_limiter_variable_starts_with_is_allowed(
    policy: Policy, prefix: str
) -> None:
    # A ConfigMap's keys are never empty, so a prefix that is a whole name cannot produce it.
    source = {**CONFIG_MAP, "prefix": prefix}
    guarded(with_env_from("containers", {"gpuadm.io/a100": "0.5"}, source), policy)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(pod(CPU, extra=[container("x", {}, envFrom=[CONFIG_MAP])]), id="no-gpus"),
        pytest.param(with_env_from("containers", {"gpuadm.io/h100": "1"}, CONFIG_MAP), id="nvidia"),
        pytest.param(
            with_env_from("containers", {"gpuadm.io/t4": "0.5"}, CONFIG_MAP), id="gpu-manager"
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "0.5"}, extra=[container("app", CPU, envFrom=[CONFIG_MAP])]),
            id="hami-pod-container-without-a-gpu",
        ),
    ],
)
def test_env_from_is_judged_only_where_hami_core_limits_the_container(
    policy: Policy, body: dict[str, Any]
) -> None:
    guarded(body, policy)


# --- the allocation annotations of HAMi and Volcano -------------------------------------------


@pytest.mark.parametrize("key", ALLOCATION_ANNOTATIONS)
@pytest.mark.parametrize("limits", [{"gpuadm.io/a100": "0.5"}, {"gpuadm.io/a10": "1"}, CPU])
def test_a_pod_may_not_bring_an_allocation_annotation(
    policy: Policy, key: str, limits: dict[str, str]
) -> None:
    body = pod(limits, annotations={key: "GPU-8e3f0b6a,NVIDIA,81920,100:;"})
    with pytest.raises(Denial) as denial:
        guarded(body, policy)
    assert (
        f"the pod: annotation {key} is written by the GPU stack's scheduler to tell its device "
        "plugin which GPUs to give the pod" in denial.value.message
    )
    assert_the_way_out_is_an_exemption(denial.value.message)
    guarded(body, with_guard(allocationAnnotations=False))


def test_other_stack_annotations_are_the_users(policy: Policy) -> None:
    # Scheduling policies choose among the class's GPUs; they give none outside it.
    annotations = {
        "hami.io/gpu-scheduler-policy": "binpack",
        "hami.io/node-scheduler-policy": "spread",
        "volcano.sh/vgpu-ids": "x",
    }
    guarded(pod({"gpuadm.io/a100": "0.5"}, annotations=annotations), policy)


TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
SCHEDULED = pod(
    {"nvidia.com/gpu": "1"},
    annotations={TO_ALLOCATE: "GPU-1,NVIDIA,8192,10:;", "hami.io/bind-phase": "allocating"},
)


def updated(stored: dict[str, Any], **annotations: str | None) -> dict[str, Any]:
    """Return the pod with annotations set, or removed where the value is None."""
    changed = copy.deepcopy(stored)
    current = changed["metadata"].setdefault("annotations", {})
    for key, value in annotations.items():
        if value is None:
            current.pop(key, None)
        else:
            current[key] = value
    return changed


@pytest.mark.parametrize(
    ("change", "named"),
    [
        pytest.param({TO_ALLOCATE: "GPU-1,NVIDIA,81920,100:;"}, TO_ALLOCATE, id="more-memory"),
        pytest.param({TO_ALLOCATE: "GPU-2,NVIDIA,8192,10:;"}, TO_ALLOCATE, id="another-gpu"),
        pytest.param({TO_ALLOCATE: None}, TO_ALLOCATE, id="removed"),
        pytest.param({"hami.io/vgpu-node": "node-b"}, "hami.io/vgpu-node", id="added"),
        pytest.param(
            {"volcano.sh/devices-to-allocate": "x", "volcano.sh/vgpu-ids-new": "x"},
            "volcano.sh/devices-to-allocate, volcano.sh/vgpu-ids-new",
            id="volcano",
        ),
    ],
)
def test_only_the_gpu_stack_changes_allocation_annotations(
    policy: Policy, change: dict[str, str | None], named: str
) -> None:
    new = updated(SCHEDULED, **change)
    with pytest.raises(Denial) as denial:
        check_allocation_update(SCHEDULED, new, policy, "alice")
    message = denial.value.message
    assert message.startswith(f"annotation {named} may be changed only by the GPU stack's")
    assert "not by alice" in message
    assert message.endswith(
        "to give the pod. If alice is the GPU stack's own, an admin adds it to the policy's "
        "gpuStackUsers"
    )
    assert "guard." not in message
    for user in DEFAULT_GPU_STACK_USERS:
        check_allocation_update(SCHEDULED, new, policy, user)
    check_allocation_update(SCHEDULED, new, with_guard(allocationAnnotations=False), "alice")


def test_other_updates_of_a_scheduled_pod_pass(policy: Policy) -> None:
    check_allocation_update(SCHEDULED, updated(SCHEDULED, team="vision"), policy, "alice")
    check_allocation_update(pod(CPU), updated(pod(CPU), team="vision"), policy, "")


def test_the_policy_names_the_stacks_users() -> None:
    custom = load_policy(
        POLICY_YAML + "gpuStackUsers: [system:serviceaccount:gpu:hami-scheduler]\n"
    )
    new = updated(SCHEDULED, **{TO_ALLOCATE: "GPU-2,NVIDIA,8192,10:;"})
    check_allocation_update(SCHEDULED, new, custom, "system:serviceaccount:gpu:hami-scheduler")
    with pytest.raises(Denial, match="not by system:serviceaccount:kube-system:hami-scheduler"):
        check_allocation_update(SCHEDULED, new, custom, DEFAULT_GPU_STACK_USERS[0])


@pytest.mark.parametrize(
    ("old", "new"),
    [
        pytest.param({"metadata": {"annotations": [TO_ALLOCATE]}}, SCHEDULED, id="odd-old"),
        pytest.param(SCHEDULED, {"metadata": "x"}, id="odd-new"),
        pytest.param({}, {}, id="empty"),
    ],
)
def test_odd_updates_are_judged_without_a_crash(
    policy: Policy, old: dict[str, Any], new: dict[str, Any]
) -> None:
    with contextlib.suppress(Denial):
        check_allocation_update(old, new, policy, "alice")


# --- switching rules off ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("switch", "body"),
    [
        pytest.param(
            "visibleDevicesEnv",
            pod(CPU, extra=[container("x", {}, env=VISIBLE_ALL)]),
            id="visibleDevicesEnv",
        ),
        pytest.param(
            "devHostPath",
            pod(CPU, volumes=[{"name": "gpu", "hostPath": {"path": "/dev/nvidia0"}}]),
            id="devHostPath",
        ),
        pytest.param(
            "privilegedGpuContainers",
            pod(
                {"gpuadm.io/h100": "1"},
                extra=[container("x", {}, securityContext={"privileged": True})],
            ),
            id="privilegedGpuContainers",
        ),
        pytest.param(
            "isolationSwitches",
            pod(
                {"gpuadm.io/a100": "0.5"},
                extra=[container("x", {}, env=[{"name": "CUDA_DISABLE_CONTROL", "value": "true"}])],
            ),
            id="isolationSwitches",
        ),
        pytest.param(
            "deviceListMounts",
            pod(
                CPU,
                extra=[
                    container(
                        "x",
                        {},
                        volumeMounts=[
                            {"name": "v", "mountPath": "/var/run/nvidia-container-devices/all"}
                        ],
                    )
                ],
            ),
            id="deviceListMounts",
        ),
        pytest.param(
            "deviceDirHostPath",
            pod(CPU, volumes=[{"name": "dev", "hostPath": {"path": "/dev"}}]),
            id="deviceDirHostPath",
        ),
        pytest.param(
            "allocationAnnotations",
            pod(CPU, annotations={"hami.io/vgpu-devices-to-allocate": "GPU-1,NVIDIA,1,1:;"}),
            id="allocationAnnotations",
        ),
    ],
)
def test_each_rule_can_be_switched_off_alone(
    policy: Policy, switch: str, body: dict[str, Any]
) -> None:
    with pytest.raises(Denial):
        guarded(body, policy)
    guarded(body, with_guard(**{switch: False}))
    others = [
        key
        for key in (
            "visibleDevicesEnv",
            "devHostPath",
            "privilegedGpuContainers",
            "isolationSwitches",
            "deviceListMounts",
            "deviceDirHostPath",
            "allocationAnnotations",
        )
        if key != switch
    ]
    with pytest.raises(Denial):
        guarded(body, with_guard(**dict.fromkeys(others, False)))


def test_every_rule_is_on_by_default(policy: Policy) -> None:
    assert policy.guard == Guard()
    assert all(Guard().model_dump().values())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "guard:\n  visibleDevicesEnvs: false\n",
            "guard.visibleDevicesEnvs: `visibleDevicesEnvs` is not a key of guard; "
            "did you mean `visibleDevicesEnv`?",
            id="misspelt-key",
        ),
        pytest.param(
            "guard:\n  devHostPath: sometimes\n",
            "guard.devHostPath: Input should be a valid boolean",
            id="not-a-boolean",
        ),
    ],
)
def test_guard_errors_name_the_key(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_policy(POLICY_YAML + text)
    assert any(expected in problem for problem in error.value.problems), error.value.problems


def test_every_key_is_documented() -> None:
    reference = (DOCS / "configuration.md").read_text()
    for info in Guard.model_fields.values():
        assert f"`{info.alias}`" in reference


# --- the message --------------------------------------------------------------------------------


def test_one_denial_lists_every_rule_broken(policy: Policy) -> None:
    body = pod(
        {"gpuadm.io/a100": "1"},
        init=[container("setup", {}, env=VISIBLE_ALL)],
        extra=[container("debug", {}, securityContext={"privileged": True})],
        volumes=[{"name": "gpu", "hostPath": {"path": "/dev/nvidiactl"}}],
    )
    with pytest.raises(Denial) as denial:
        guarded(body, policy)
    message = denial.value.message
    for part in (
        'init container "setup": env NVIDIA_VISIBLE_DEVICES=all',
        'container "debug": securityContext.privileged=true',
        "volumes[0].hostPath.path=/dev/nvidiactl",
    ):
        assert part in message


def test_a_pod_with_thousands_of_violations_gets_a_short_message(policy: Policy) -> None:
    env = VISIBLE_ALL * 5000
    with pytest.raises(Denial) as denial:
        guarded(pod(CPU, extra=[container("x" * 10_000, {}, env=env)]), policy)
    assert denial.value.message.endswith("; and 4995 more. " + EXEMPT_ITS_NAMESPACE)
    assert len(denial.value.message) < 2000


@pytest.mark.parametrize(
    ("namespace", "named"),
    [
        pytest.param(
            "nvidia-gpu-stack", "its namespace nvidia-gpu-stack must be exempt", id="named"
        ),
        pytest.param(None, "its namespace must be exempt", id="unknown"),
    ],
)
def test_the_denial_names_the_namespace_to_exempt(
    policy: Policy, namespace: str | None, named: str
) -> None:
    body = pod(CPU, extra=[container("x", {}, env=VISIBLE_ALL)])
    with pytest.raises(Denial) as denial:
        check_guard(body, policy, None, namespace=namespace)
    assert named in denial.value.message
    debug = container("debug", {}, env=VISIBLE_ALL)
    with pytest.raises(Denial) as denial:
        check_added_containers(
            body, pod(CPU, ephemeralContainers=[debug]), policy, namespace=namespace
        )
    assert named in denial.value.message


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(
            {"containers": [{"name": "x", "env": "NVIDIA_VISIBLE_DEVICES=all"}]}, id="env-a-string"
        ),
        pytest.param({"containers": [{"name": "x", "env": [None, 3, ["a"]]}]}, id="odd-entries"),
        pytest.param(
            {"containers": [{"name": ["x"], "env": [{"name": {"a": 1}, "value": ["all"]}]}]},
            id="odd-names",
        ),
        pytest.param({"containers": "x", "volumes": {"a": 1}}, id="odd-lists"),
        pytest.param({"volumes": [{"name": 1, "hostPath": {"path": 7}}]}, id="odd-path"),
        pytest.param({"containers": [{"securityContext": "privileged"}]}, id="odd-context"),
    ],
)
def test_odd_shapes_are_judged_without_a_crash(policy: Policy, spec: dict[str, Any]) -> None:
    check_guard({"spec": spec}, policy, "a100")


def test_an_odd_value_is_named_by_its_type(policy: Policy) -> None:
    spec = {
        "containers": [
            {"name": ["x"], "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": ["all"]}]}
        ]
    }
    with pytest.raises(
        Denial, match=re.escape("""container "['x']": env NVIDIA_VISIBLE_DEVICES=['all']""")
    ):
        check_guard({"spec": spec}, policy, None)


# --- ephemeral containers added to a pod -------------------------------------------------------

# A pod as stored: backend resources, which is what an ephemeral-container update carries.
STORED_GPU_POD = pod({"nvidia.com/gpu": "1"})


def debugged(stored: dict[str, Any], *added: dict[str, Any]) -> dict[str, Any]:
    """Return the pod after `kubectl debug` added ephemeral containers to it."""
    updated = copy.deepcopy(stored)
    updated["spec"].setdefault("ephemeralContainers", []).extend(added)
    return updated


@pytest.mark.parametrize(
    ("stored", "added", "expected"),
    [
        pytest.param(
            pod(CPU),
            container("debugger", {}, env=VISIBLE_ALL),
            'ephemeral container "debugger": env NVIDIA_VISIBLE_DEVICES=all',
            id="visible-devices-in-a-pod-without-gpus",
        ),
        pytest.param(
            STORED_GPU_POD,
            container("debugger", {}, securityContext={"privileged": True}),
            'ephemeral container "debugger": securityContext.privileged=true in a GPU pod',
            id="privileged-in-a-gpu-pod",
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "1"}),
            container("debugger", {}, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {}}]),
            "from valueFrom",
            id="visible-devices-from-elsewhere",
        ),
        pytest.param(
            pod(CPU, volumes=[{"name": "null", "hostPath": {"path": "/dev/null"}}]),
            container(
                "debugger",
                {},
                volumeMounts=[
                    {"name": "null", "mountPath": "/var/run/nvidia-container-devices/all"}
                ],
            ),
            'ephemeral container "debugger": volumeMounts[0].mountPath='
            "/var/run/nvidia-container-devices/all names GPUs",
            id="device-list-mount",
        ),
    ],
)
def test_an_added_ephemeral_container_is_judged(
    policy: Policy, stored: dict[str, Any], added: dict[str, Any], expected: str
) -> None:
    with pytest.raises(Denial) as denial:
        check_added_containers(stored, debugged(stored, added), policy)
    assert expected in denial.value.message


@pytest.mark.parametrize(
    ("stored", "added"),
    [
        pytest.param(
            pod(CPU),
            container("d", {}, securityContext={"privileged": True}),
            id="privileged-no-gpus",
        ),
        pytest.param(
            STORED_GPU_POD,
            container("d", {}, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]),
            id="void",
        ),
        pytest.param(
            pod({"gpuadm.io/a100": "1"}),
            container("d", {}, env=[{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]),
            id="isolation-switch-without-a-device",
        ),
    ],
)
def test_harmless_ephemeral_containers_are_admitted(
    policy: Policy, stored: dict[str, Any], added: dict[str, Any]
) -> None:
    check_added_containers(stored, debugged(stored, added), policy)


def test_ephemeral_containers_already_there_are_not_judged_again(policy: Policy) -> None:
    # Added while the rule was off, or before gpuadm: later updates of the pod still pass.
    stored = debugged(pod(CPU), container("old", {}, env=VISIBLE_ALL))
    check_added_containers(stored, copy.deepcopy(stored), policy)
    with pytest.raises(Denial, match='ephemeral container "new"'):
        check_added_containers(
            stored, debugged(stored, container("new", {}, env=VISIBLE_ALL)), policy
        )


def test_ephemeral_rules_can_be_switched_off(policy: Policy) -> None:
    stored = STORED_GPU_POD
    updated = debugged(
        stored,
        container("a", {}, env=VISIBLE_ALL),
        container("b", {}, securityContext={"privileged": True}),
    )
    with pytest.raises(Denial):
        check_added_containers(stored, updated, policy)
    off = with_guard(visibleDevicesEnv=False, privilegedGpuContainers=False)
    check_added_containers(stored, updated, off)
    mount = [{"name": "v", "mountPath": "/var/run/nvidia-container-devices/0"}]
    listing = debugged(stored, container("c", {}, volumeMounts=mount))
    with pytest.raises(Denial, match="names GPUs to the NVIDIA Container Toolkit"):
        check_added_containers(stored, listing, off)
    check_added_containers(stored, listing, with_guard(deviceListMounts=False))
