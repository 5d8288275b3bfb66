"""The GPU stacks' own pods, as the stacks ship them.

Each file of tests/fixtures/gpu_stacks/ is a DaemonSet written down from a stack's published
chart or manifest, and names its source and version. A device plugin, the GPU Operator's
container toolkit and the NVIDIA DRA driver's kubelet plugin reach GPUs outside any pod's
resources on purpose, so gpuadm must leave their namespaces alone by default.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpu_stacks"
# Who creates a DaemonSet's pods: kube-controller-manager's controller, under its own account.
DAEMON_SET_CONTROLLER = "system:serviceaccount:kube-system:daemon-set-controller"


@dataclass(frozen=True)
class StackPod:
    """One stack's DaemonSet, and what gpuadm's guard finds in its pod elsewhere."""

    fixture: str
    # A part of the guard's denial in a namespace gpuadm governs: what the pod does.
    refused_for: str

    @property
    def daemonset(self) -> dict[str, Any]:
        loaded: dict[str, Any] = yaml.safe_load((FIXTURES / self.fixture).read_text())
        return loaded

    @property
    def namespace(self) -> str:
        """The namespace the stack's documented install puts it in."""
        namespace: str = self.daemonset["metadata"]["namespace"]
        return namespace

    def pod(self, namespace: str | None = None, *, node: str = "gpu-node-1") -> dict[str, Any]:
        """The pod the DaemonSet controller creates for `node`, in `namespace` (default: the
        stack's own)."""
        return daemon_pod(self.daemonset, namespace or self.namespace, node)


def daemon_pod(daemonset: dict[str, Any], namespace: str, node: str) -> dict[str, Any]:
    """Return the pod the DaemonSet controller creates from `daemonset` for `node`.

    The controller copies the template, names the pod after the DaemonSet, owns it, pins it
    to the node by a required node affinity on the node's name, and adds the tolerations that
    keep a daemon running through node conditions.
    """
    template = copy.deepcopy(daemonset["spec"]["template"])
    spec = template["spec"]
    name = daemonset["metadata"]["name"]
    affinity = spec.setdefault("affinity", {})
    affinity["nodeAffinity"] = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [node]},
                    ]
                }
            ]
        }
    }
    spec["tolerations"] = [
        *spec.get("tolerations", []),
        *(
            {"key": f"node.kubernetes.io/{condition}", "operator": "Exists", "effect": effect}
            for condition, effect in (
                ("not-ready", "NoExecute"),
                ("unreachable", "NoExecute"),
                ("disk-pressure", "NoSchedule"),
                ("memory-pressure", "NoSchedule"),
                ("pid-pressure", "NoSchedule"),
                ("unschedulable", "NoSchedule"),
            )
        ),
    ]
    metadata = {
        **template.get("metadata", {}),
        "generateName": f"{name}-",
        "namespace": namespace,
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": name,
                "uid": "5c1d2e3f-0000-4000-8000-000000000001",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


STACK_PODS = [
    StackPod(
        "gpu-operator-device-plugin.yaml",
        'container "nvidia-device-plugin": env NVIDIA_VISIBLE_DEVICES=all may give it GPUs',
    ),
    StackPod(
        "gpu-operator-container-toolkit.yaml",
        'volume "host-root" (mounted by init container "driver-validation", container '
        '"nvidia-container-toolkit-ctr"): volumes[4].hostPath.path=/ holds the node\'s GPU '
        "device files",
    ),
    StackPod(
        "nvidia-dra-driver-gpu-kubelet-plugin.yaml",
        'volume "driver-root" (mounted by container "compute-domains", container "gpus"): '
        "volumes[4].hostPath.path=/ holds the node's GPU device files",
    ),
    StackPod(
        "nvidia-device-plugin.yaml",
        'container "nvidia-device-plugin-ctr": env NVIDIA_VISIBLE_DEVICES=all may give it GPUs',
    ),
]
