"""The guard: GPU access outside a pod's resources is denied, rule by rule, container by kind."""

from __future__ import annotations

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
from policies.policy import Guard
from tests.builders import POLICY_YAML, container, pod

DOCS = Path(__file__).resolve().parents[2] / "docs"
CPU = {"cpu": "1"}
VISIBLE_ALL = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]


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
    assert "(allowed only with guard.visibleDevicesEnv: false)" in message


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
    with pytest.raises(Denial, match="visibleDevicesEnv") as denial:
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
    assert "(allowed only with guard.devHostPath: false)" in denial.value.message


def test_an_unmounted_device_volume_is_denied_too(policy: Policy) -> None:
    # An ephemeral container added later could mount it.
    body = pod(CPU, volumes=[{"name": "gpu", "hostPath": {"path": "/dev/nvidia0"}}])
    with pytest.raises(Denial, match=r'volume "gpu": volumes\[0\]\.hostPath\.path=/dev/nvidia0'):
        guarded(body, policy)


@pytest.mark.parametrize(
    "path", ["/dev", "/dev/null", "/dev/fuse", "/var/lib/nvidia", "/devices/nvidia0", "/"]
)
def test_other_host_paths_are_not_the_guards(policy: Policy, path: str) -> None:
    guarded(pod(CPU, volumes=[{"name": "v", "hostPath": {"path": path}}]), policy)


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
    assert "(allowed only with guard.privilegedGpuContainers: false)" in denial.value.message


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
    assert "(allowed only with guard.isolationSwitches: false)" in denial.value.message


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
    ],
)
def test_every_value_that_may_switch_isolation_off_is_denied(
    policy: Policy, entry: dict[str, Any]
) -> None:
    body = pod({"gpuadm.io/a100": "0.25"}, extra=[container("x", {}, env=[entry])])
    with pytest.raises(Denial, match="isolationSwitches") as denial:
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
    ],
)
def test_each_rule_can_be_switched_off_alone(
    policy: Policy, switch: str, body: dict[str, Any]
) -> None:
    with pytest.raises(Denial, match=f"guard.{switch}: false"):
        guarded(body, policy)
    guarded(body, with_guard(**{switch: False}))
    others = [
        key
        for key in (
            "visibleDevicesEnv",
            "devHostPath",
            "privilegedGpuContainers",
            "isolationSwitches",
        )
        if key != switch
    ]
    with pytest.raises(Denial, match=f"guard.{switch}: false"):
        guarded(body, with_guard(**dict.fromkeys(others, False)))


def test_every_rule_is_on_by_default(policy: Policy) -> None:
    assert policy.guard == Guard()
    assert all(Guard().model_dump().values())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "guard:\n  visibleDevicesEnvs: false\n",
            "guard.visibleDevicesEnvs: Extra inputs are not permitted",
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
    assert denial.value.message.endswith("; and 4995 more")
    assert len(denial.value.message) < 2000


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
