"""The real kube-scheduler beside the test control plane, and what it decides for a pod."""

from __future__ import annotations

from typing import Any

import kubernetes.client

from tests.e2e.cluster import ControlPlane
from tests.e2e.gpuadm import wait_until
from tests.e2e.nodes import hostname_affinity

PROBE_IMAGE = "registry.invalid/pause:1"  # never pulled: there is no kubelet
# Made by the apiserver itself, so it is there before any test makes namespaces.
PROBE_NAMESPACE = "default"


class Scheduler:
    """kube-scheduler running in a control plane: the node it binds a pod to, or why none."""

    def __init__(self, plane: ControlPlane, core: kubernetes.client.CoreV1Api) -> None:
        self._plane = plane
        self._core = core

    def node_of(self, namespace: str, name: str) -> str:
        """Wait for the scheduler's decision on a pod; return the node it was bound to."""
        node, reason = self._decision(namespace, name)
        assert node is not None, f"pod {namespace}/{name} is unschedulable: {reason}"
        return node

    def bound(self, namespace: str, name: str) -> str:
        """Wait until a pod is bound, through any retries; return its node.

        For pods whose decision may first be "unschedulable" and then change without any
        change of the cluster's: with consumable capacity (1.34, alpha), a share whose
        neighbour on the device is still being allocated is at times found unschedulable,
        and placed on the scheduler's retry once that allocation is written.
        """
        found: list[str] = []

        def placed() -> bool:
            node = self._read(namespace, name).spec.node_name
            found.extend([node] if node else [])
            return bool(found)

        what = f"pod {namespace}/{name} to be bound"
        wait_until(placed, what, lambda: self._describe(namespace, name))
        return found[0]

    def unschedulable(self, namespace: str, name: str) -> str:
        """Wait for the scheduler's decision on a pod; return why no node can take it."""
        node, reason = self._decision(namespace, name)
        assert node is None, f"pod {namespace}/{name} was bound to {node}"
        return reason

    def wait_until_seen(self, node: str) -> None:
        """Wait until the scheduler knows ``node`` as last written, and every node before it.

        A pod may be found unschedulable only because the scheduler has not yet seen a node's
        latest status, and then it waits for a retry. Node events reach the scheduler in the
        order they were written, so once a probe pod that fits ``node``'s final status alone
        is bound, every node written before is known too, and each later decision is final.
        """
        probe = self._core.create_namespaced_pod(PROBE_NAMESPACE, _probe(node)).metadata.name
        try:
            wait_until(
                lambda: self._read(PROBE_NAMESPACE, probe).spec.node_name == node,
                f"the scheduler to see node {node}",
                lambda: self._describe(PROBE_NAMESPACE, probe),
            )
        finally:
            self._core.delete_namespaced_pod(probe, PROBE_NAMESPACE)

    def _decision(self, namespace: str, name: str) -> tuple[str | None, str]:
        """Wait until a pod is bound or found unschedulable; return (node, reason)."""
        found: list[tuple[str | None, str]] = []

        def decided() -> bool:
            pod = self._read(namespace, name)
            condition = _scheduled_condition(pod)
            if pod.spec.node_name:
                found.append((pod.spec.node_name, ""))
            elif condition is not None and condition.reason == "Unschedulable":
                found.append((None, condition.message or ""))
            return bool(found)

        what = f"the scheduler's decision on pod {namespace}/{name}"
        wait_until(decided, what, lambda: self._describe(namespace, name))
        return found[0]

    def _read(self, namespace: str, name: str) -> Any:
        # A scheduler that died would leave every wait to time out; say so at once instead.
        self._plane.raise_if_exited()
        return self._core.read_namespaced_pod(name, namespace)

    def _describe(self, namespace: str, name: str) -> str:
        """Say what the scheduler made of a pod so far, for a wait that timed out."""
        condition = _scheduled_condition(self._core.read_namespaced_pod(name, namespace))
        said = f"{condition.reason}: {condition.message}" if condition else "not looked at yet"
        return f"pod {namespace}/{name}: {said}\n{self._plane.log_tail('kube-scheduler')}"


def _scheduled_condition(pod: Any) -> Any:
    """Return the pod's PodScheduled condition, which says why a pod is not bound, or None."""
    conditions = (pod.status.conditions if pod.status else None) or []
    return next((c for c in conditions if c.type == "PodScheduled"), None)


def _probe(node: str) -> dict[str, Any]:
    """Return a pod that only ``node`` can take, and only once its capacity is known."""
    container = {"name": "probe", "image": PROBE_IMAGE, "resources": {"requests": {"cpu": "1m"}}}
    return {
        "metadata": {"generateName": "scheduler-probe-"},
        "spec": {
            "containers": [container],
            # Tolerating every taint, it waits on the node's capacity alone: what
            # tests.e2e.nodes writes last.
            "tolerations": [{"operator": "Exists"}],
            **hostname_affinity(node),
        },
    }
