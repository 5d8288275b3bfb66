"""gpuadm-specific fixtures of the end-to-end suite: three replicas behind one address, and
the scheduler that places what they admit.

Each session fixture wraps a context manager (`deployed`, `scheduler_running`,
`controller_manager_running`) that a module with a control plane of its own uses the same way.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.builders import POLICY_YAML
from tests.e2e.cluster import ControlPlane
from tests.e2e.gpuadm import (
    NAMESPACE,
    SCHEDULER_NAMES,
    Balancer,
    GpuadmProcess,
    Routing,
    install_quota_view,
    make_tls,
    put_configmap,
    register_webhooks,
    wait_for_policy,
    wait_for_quotas,
    wait_until,
)
from tests.e2e.nodes import Pool, pools_created
from tests.e2e.scheduling import Scheduler

# Quotas off, said explicitly: an empty document is a rejected edit, never "no quotas".
NO_QUOTAS = "namespaces: {}\n"

IMAGE = "registry.invalid/app:1"  # never pulled: there is no kubelet


@dataclass
class Deployment:
    """gpuadm as deployed for the suite: processes, the balancer in front, and the API."""

    processes: list[GpuadmProcess]
    balancer: Routing
    core: kubernetes.client.CoreV1Api
    api: kubernetes.client.ApiClient
    ca_file: Path

    @property
    def url(self) -> str:
        """Return the address the webhook configurations point at."""
        return f"https://127.0.0.1:{self.balancer.port}"

    def route(self, replicas: int) -> list[GpuadmProcess]:
        """Send admission traffic to the first `replicas` processes only."""
        chosen = self.processes[:replicas]
        self.balancer.route_to([p.port for p in chosen])
        return chosen

    def set_policy(self, text: str) -> None:
        """Replace the policy ConfigMap and wait until every replica has it in force."""
        put_configmap(self.core, "gpuadm-policy", "policy.yaml", text)
        wait_for_policy(self.processes, text)

    def set_quotas(self, text: str) -> None:
        """Replace the quota ConfigMap and wait until every replica has it in force."""
        put_configmap(self.core, "gpuadm-quotas", "quotas.yaml", text)
        wait_for_quotas(self.processes, text)

    def reviews(self) -> float:
        """Return how many admission reviews all replicas have answered."""
        return sum(p.metric("gpuadm_admission_requests_total") for p in self.processes)

    def create_pod(
        self,
        namespace: str,
        limits: dict[str, str],
        *,
        name: str | None = None,
        dry_run: bool = False,
        annotations: dict[str, str] | None = None,
        spec: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Create a pod; return the pod the apiserver stored (or would store)."""
        body = pod_body(limits, name=name, annotations=annotations, spec=spec)
        response = self.core.create_namespaced_pod(
            namespace, body, dry_run="All" if dry_run else None, _preload_content=False
        )
        stored: dict[str, Any] = json.loads(response.data)
        return stored

    def refusal(self, namespace: str, limits: dict[str, str], **kwargs: Any) -> str:
        """Create a pod that must be refused; return the apiserver's message."""
        with pytest.raises(ApiException) as refused:
            self.create_pod(namespace, limits, **kwargs)
        message: str = json.loads(refused.value.body)["message"]
        return message


@contextlib.contextmanager
def restarted_with(deployment: Deployment, args: Sequence[str], what: str) -> Iterator[Deployment]:
    """The suite's replicas, restarted with `args` (after the suite's own); as they were
    after. `what` names them in the wait's message."""
    for process in deployment.processes:
        process.restart(args)
    for process in deployment.processes:
        wait_until(process.ready, f"a replica {what} ready", process.log_tail)
    try:
        yield deployment
    finally:
        for process in deployment.processes:
            process.restart(())
        for process in deployment.processes:
            wait_until(process.ready, "a replica back as it was", process.log_tail)
        deployment.route(len(deployment.processes))


@contextlib.contextmanager
def serving_on_pools(
    gpuadm: Deployment,
    core: kubernetes.client.CoreV1Api,
    scheduler: Scheduler,
    policy_text: str,
    pools: Sequence[Pool],
) -> Iterator[list[str]]:
    """Serve `policy_text` on node pools made for it, seen by the scheduler; yield the nodes'
    names; then remove the pools and serve the test policy again."""
    gpuadm.set_policy(policy_text)
    try:
        with pools_created(core, pools) as names:
            scheduler.wait_until_seen(names[-1])
            yield names
    finally:
        gpuadm.set_policy(POLICY_YAML)


def pod_body(
    limits: dict[str, str],
    *,
    name: str | None = None,
    annotations: dict[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return a one-container pod asking for `limits`, with any other `spec` fields."""
    metadata: dict[str, Any] = {"name": name} if name else {"generateName": "gpu-"}
    if annotations:
        metadata["annotations"] = annotations
    container = {"name": "main", "image": IMAGE, "resources": {"limits": limits}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [container], **(spec or {})},
    }


@contextlib.contextmanager
def deployed(
    plane: ControlPlane,
    api: kubernetes.client.ApiClient,
    core: kubernetes.client.CoreV1Api,
    workdir: Path,
    replicas: int = 3,
    *,
    policy_text: str = POLICY_YAML,
) -> Iterator[Deployment]:
    """Run `replicas` gpuadm replicas against `plane` with `policy_text` and no quotas,
    registered as shipped, behind one balancer; stop them all after, even on failure.

    Their TLS files and logs go under `workdir`.
    """
    tls = make_tls(workdir / "tls")
    with contextlib.suppress(ApiException):
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    put_configmap(core, "gpuadm-policy", "policy.yaml", policy_text)
    put_configmap(core, "gpuadm-quotas", "quotas.yaml", NO_QUOTAS)
    install_quota_view(api)
    processes = [GpuadmProcess(plane, tls, workdir, index) for index in range(replicas)]
    balancer = Balancer()
    with contextlib.ExitStack() as running:
        for process in processes:
            running.callback(process.stop)
            process.start()
        balancer.start()
        running.callback(balancer.stop)
        deployment = Deployment(processes, balancer, core, api, tls.ca_file)
        deployment.route(len(processes))
        register_webhooks(
            api,
            tls.ca_file,
            mutate_url=f"{deployment.url}/mutate",
            validate_url=f"{deployment.url}/validate",
        )
        for process in processes:
            wait_until(process.ready, f"gpuadm on port {process.port} ready", process.log_tail)
        yield deployment


@contextlib.contextmanager
def scheduler_running(
    plane: ControlPlane, core: kubernetes.client.CoreV1Api
) -> Iterator[Scheduler]:
    """Run kube-scheduler on `plane`, serving every backend's scheduler name; stop it after."""
    plane.start_scheduler(SCHEDULER_NAMES)
    try:
        yield Scheduler(plane, core)
    finally:
        plane.stop_scheduler()


@contextlib.contextmanager
def controller_manager_running(plane: ControlPlane) -> Iterator[None]:
    """Run kube-controller-manager on `plane` with the suite's controllers; stop it after."""
    plane.start_controller_manager()
    try:
        yield
    finally:
        plane.stop_controller_manager()


@pytest.fixture(scope="session")
def gpuadm(
    control_plane: ControlPlane,
    api_client: kubernetes.client.ApiClient,
    core_v1: kubernetes.client.CoreV1Api,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Deployment]:
    """Run three gpuadm replicas against the control plane, registered as shipped."""
    with deployed(control_plane, api_client, core_v1, tmp_path_factory.mktemp("gpuadm")) as found:
        yield found


@pytest.fixture(scope="session")
def scheduler(
    control_plane: ControlPlane, core_v1: kubernetes.client.CoreV1Api
) -> Iterator[Scheduler]:
    """Run kube-scheduler for the rest of the session, serving every backend's scheduler name.

    Without nodes it places nothing; tests that need placements create their nodes.
    """
    with scheduler_running(control_plane, core_v1) as running:
        yield running


@pytest.fixture(scope="session")
def controller_manager(control_plane: ControlPlane) -> Iterator[None]:
    """Run kube-controller-manager for the rest of the session: its resourceclaim controller
    (the ResourceClaims of pods that name a ResourceClaimTemplate), its job controller and
    its clusterrole-aggregation controller (`ControlPlane.start_controller_manager`)."""
    with controller_manager_running(control_plane):
        yield
