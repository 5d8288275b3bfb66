"""What the suites build from: a policy with one class per backend, quotas, and pod builders."""

from __future__ import annotations

from typing import Any

# One class per backend, so every table can name the backend by its class. GPU models are
# listed by the driver's name (`models`); the l4 class keeps the older nodeSelector form.
POLICY_YAML = """
domain: gpuadm.io
defaultClass: t4
exemptNamespaces: [kube-system]
classes:
  a100:
    backend: hami
    memory: 80Gi
    models: [NVIDIA A100-SXM4-80GB, NVIDIA A100 80GB PCIe]
  t4:
    backend: gpu-manager
    memory: 16Gi
    nodeSelector:
      gaia.tencent.com/gpu-model: [Tesla-T4]
  h100:
    backend: nvidia
    models: [NVIDIA H100 80GB HBM3]
  a100-mig:
    backend: mig
    memory: 80Gi
    profiles: {1g.10gb: 10Gi, 2g.20gb: 20Gi, 3g.40gb: 40Gi, 7g.80gb: 80Gi}
    nodeSelector:
      nvidia.com/mig.strategy: [mixed]
  v100:
    backend: gpushare
    memory: 16Gi
    nodeSelector:
      gpushare: ["true"]
  l4:
    backend: time-slicing
    # The form from before `models`: a nodeSelector on GPU Feature Discovery's label.
    nodeSelector:
      nvidia.com/gpu.product: [NVIDIA-L4]
    tolerations:
      - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
  a10:
    backend: volcano
    memory: 24Gi
    models: [NVIDIA A10]
"""

QUOTAS_YAML = """
mode: enforce
default: {t4: 1}
namespaces:
  team-a:
    defaultClass: a100
    a100: 4
    "*": 5
"""


# Config texts an unlucky or hostile edit makes, which every reader must refuse at once:
# an alias inside the block it names (a loop), and aliases under the count cap that stand
# for ten million nodes ("billion laughs").
ALIAS_CYCLE = "namespaces: &n\n  team-a:\n    sub: *n\n"
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{below}'] * 10)}]\n"
    for below, name in zip("abcdef", "bcdefg", strict=True)
)

# Containers in a large pod: its review is about 900 KiB, near the largest pod etcd keeps.
LARGE_POD_CONTAINERS = 3000


def pod(
    limits: dict[str, Any] | None = None,
    *,
    annotations: dict[str, str] | None = None,
    init: list[dict[str, Any]] | None = None,
    extra: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """Build a pod as the apiserver sends it: requests defaulted from limits."""
    containers = [container("main", limits or {}), *(extra or [])]
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-x"},
        "spec": {"containers": containers, **spec},
    }
    if annotations:
        body["metadata"]["annotations"] = dict(annotations)
    if init:
        body["spec"]["initContainers"] = init
    return body


def container(name: str, limits: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """Build a container whose requests equal its limits, as the apiserver defaults them."""
    resources = {"limits": dict(limits), "requests": dict(limits)} if limits else {}
    return {"name": name, "image": "registry.invalid/app:1", "resources": resources, **fields}


def review(
    obj: dict[str, Any] | None,
    *,
    operation: str = "CREATE",
    namespace: str = "team-x",
    old: dict[str, Any] | None = None,
    user: str = "alice",
    uid: str = "0f1e2d3c",
) -> dict[str, Any]:
    """Build an AdmissionReview of a pod as the apiserver sends it."""
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": operation,
        "namespace": namespace,
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def large_pod(tag: str) -> dict[str, Any]:
    """Return a pod of `LARGE_POD_CONTAINERS` containers that each ask for half an A100."""
    body = pod({})
    body["spec"]["containers"] = [
        container(
            f"c{index}-{tag}",
            {"gpuadm.io/a100": "0.5"},
            env=[{"name": f"VAR_{n}", "value": "x" * 20} for n in range(3)],
        )
        for index in range(LARGE_POD_CONTAINERS)
    ]
    return body
