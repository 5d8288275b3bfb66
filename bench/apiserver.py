"""Pod creates through a real kube-apiserver: gpuadm's quota beside the native ResourceQuota.

Every namespace is made before gpuadm starts, each for one kind of create:

| kind     | pods ask for      | what admits them                                              |
|----------|-------------------|---------------------------------------------------------------|
| `plain`  | `example.com/gpu` | the apiserver alone: gpuadm's webhooks never see this resource |
| `native` | `example.com/gpu` | the apiserver's ResourceQuota admission                       |
| `noop`   | `example.com/gpu` | two webhooks that do nothing, then the ResourceQuota          |
| `noop-3` | `example.com/gpu` | as `noop`, served by three processes behind a balancer (bursts) |
| `open`   | `gpuadm.io/h100`  | gpuadm's two webhooks, no quota                               |
| `gated`  | `gpuadm.io/h100`  | gpuadm's two webhooks and its quota (a record write)          |
| `dra-open`  | `gpuadm.io/h100-dra` | as `open`, for a `dra` class: a claim and its template |
| `dra-gated` | `gpuadm.io/h100-dra` | as `gated`, for the `dra` class                     |

A `dra` create also pays for its ResourceClaimTemplate: made by the first pod of a
namespace, and asked for again (a 409) once a minute by each replica.

Sequential creates go to one namespace of each kind, whose quota is never reached; bursts
go to fresh namespaces, one per burst, whose quota 150 of the burst's 200 pods fit. Last,
pods churn in a namespace of their own under gpuadm's quota, to measure the bytes each
admission makes the apiserver and etcd take (bench.churn); last, so that what it leaves in
etcd and in the apiserver's caches weighs on no other figure.
Because gpuadm's webhooks never see `example.com/gpu`, every kind is measured with gpuadm
registered, taking turns, so that the machine's changing load falls on all of them alike.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import kubernetes.client

from bench.churn import CHURN_NAMESPACE, measure_churn
from bench.creates import Burst, PodCreator, interleaved_latencies, one_gpu_pods
from bench.kernel import KernelBalancer
from bench.relay import RelayProcess
from bench.server import serving_bare
from bench.webhooks import (
    NOOP_BALANCED_LABEL,
    NOOP_BALANCED_NAMES,
    NOOP_LABEL,
    RELAYS_ENDING_SECONDS,
    REPLICAS,
    gpuadm_replicas,
    point_gpuadm_webhooks,
    register_noop_webhooks,
    start_balancer,
)
from tests.builders import POLICY_YAML
from tests.e2e.cluster import ControlPlane
from tests.e2e.fixtures import Deployment
from tests.e2e.gpuadm import NAMESPACE, put_configmap

NATIVE_RESOURCE = "example.com/gpu"
GPUADM_RESOURCE = "gpuadm.io/h100"
DRA_RESOURCE = "gpuadm.io/h100-dra"
# The test policy, and the same H100s on the DRA path.
BENCH_POLICY_YAML = (
    POLICY_YAML
    + """  h100-dra:
    backend: dra
    models: [NVIDIA H100 80GB HBM3]
"""
)
BURST = 200
FIT = 150
# The sequential namespaces' quotas: never reached, so that every create pays the check.
ROOMY = 1_000_000
# Where each kind of sequential create goes, and what its pods ask for.
SEQUENTIAL = {
    "plain": ("plain", NATIVE_RESOURCE),
    "native": ("native", NATIVE_RESOURCE),
    "noop": ("noop", NATIVE_RESOURCE),
    "open": ("open", GPUADM_RESOURCE),
    "gated": ("gated", GPUADM_RESOURCE),
    "dra-open": ("dra-open", DRA_RESOURCE),
    "dra-gated": ("dra-gated", DRA_RESOURCE),
}
# Each kind of burst: what its pods ask for, and how many gpuadm replicas answer (0: none).
BURSTS = {
    "native": (NATIVE_RESOURCE, 0),
    "noop": (NATIVE_RESOURCE, 0),
    # The anchor of a burst through gpuadm's replicas: as many no-op processes, behind a
    # balancer of the same kind.
    f"noop-{REPLICAS}": (NATIVE_RESOURCE, 0),
    "gpuadm-1": (GPUADM_RESOURCE, 1),
    # Every pod of the burst admitted and stored, in a namespace without quota and in one
    # whose quota they all fit: the difference is what the quota costs a burst.
    "unlimited-1": (GPUADM_RESOURCE, 1),
    "roomy-1": (GPUADM_RESOURCE, 1),
    f"gpuadm-{REPLICAS}": (GPUADM_RESOURCE, REPLICAS),
}
# The label that sends a no-op kind's namespace to its webhooks.
NOOP_LABELS = {"noop": NOOP_LABEL, f"noop-{REPLICAS}": NOOP_BALANCED_LABEL}
# What each kind's namespace allows, if not `FIT`; None: no quota at all.
BURST_LIMITS: dict[str, int | None] = {"unlimited-1": None, "roomy-1": ROOMY}
WARMUP_CREATES = 10


def measure(*, count: int, rounds: int, churn_seconds: float) -> dict[str, Any]:
    """Return median sequential create latencies by kind, `rounds` bursts of each kind, and
    the bytes written per admission in `churn_seconds` of churn."""
    bursts = {kind: [f"burst-{kind}-{n}" for n in range(rounds)] for kind in BURSTS}
    with (
        ControlPlane() as plane,
        tempfile.TemporaryDirectory() as workdir,
        plane.api_client() as api,
        serving_bare(Path(workdir) / "noop", processes=REPLICAS) as noop,
    ):
        quotas = prepare_namespaces(kubernetes.client.CoreV1Api(api), bursts)
        register_noop_webhooks(api, noop, probe_namespace="noop")
        noop_balancer = start_balancer()
        try:
            noop_balancer.route_to(list(noop.ports))
            register_noop_webhooks(
                api,
                noop,
                probe_namespace="noop-balanced",
                url=f"https://127.0.0.1:{noop_balancer.port}",
                label=NOOP_BALANCED_LABEL,
                names=NOOP_BALANCED_NAMES,
            )
            with gpuadm_replicas(
                plane,
                api,
                Path(workdir),
                quotas=quotas,
                probe_namespace="open",
                probe_resource=GPUADM_RESOURCE,
            ) as deployment:
                figures = asyncio.run(
                    _measure(
                        plane,
                        deployment,
                        bursts,
                        noop_balancer=(noop_balancer, list(noop.ports)),
                        count=count,
                        churn_seconds=churn_seconds,
                    )
                )
                return {**figures, "balancer": getattr(deployment.balancer, "name", "relay")}
        finally:
            # As gpuadm's balancer ends: routing nowhere first, and a moment for a relay's
            # connections to end on their own.
            try:
                noop_balancer.route_to([])
                time.sleep(RELAYS_ENDING_SECONDS)
            finally:
                noop_balancer.stop()


async def _measure(
    plane: ControlPlane,
    deployment: Deployment,
    bursts: dict[str, list[str]],
    *,
    noop_balancer: tuple[KernelBalancer | RelayProcess, list[int]],
    count: int,
    churn_seconds: float,
) -> dict[str, Any]:
    async with PodCreator(plane, connections=BURST) as creator:
        await creator.open_connections()
        await asyncio.to_thread(point, deployment, direct=True)
        await interleaved_latencies(creator, SEQUENTIAL, count=WARMUP_CREATES, prefix="warm")
        latencies = await interleaved_latencies(creator, SEQUENTIAL, count=count, prefix="seq")
        burst_figures: dict[str, list[dict[str, Any]]] = {kind: [] for kind in BURSTS}
        direct = True  # the sequential creates left gpuadm pointed at its first replica
        for round_ in range(len(bursts["native"])):
            for kind, (resource, replicas) in BURSTS.items():
                # One replica is called straight, as the no-op webhooks are; several need
                # the balancer (see `point`).
                if replicas and (replicas == 1) != direct:
                    direct = replicas == 1
                    await asyncio.to_thread(point, deployment, direct=direct)
                namespace = bursts[kind][round_]
                if kind == f"noop-{REPLICAS}":
                    # As gpuadm's balanced bursts: new connections, spread over the processes.
                    # Cutting the first process's connections cuts the straight no-op pair's
                    # too, which that process also serves; the next burst's dry run opens
                    # them again.
                    balancer, ports = noop_balancer
                    await asyncio.to_thread(balancer.route_to, [])
                    await asyncio.to_thread(balancer.route_to, ports)
                figures = await measured_burst(
                    creator, deployment, namespace, resource, replicas, balanced=not direct
                )
                burst_figures[kind].append(figures)
        churn = await measure_churn(plane, deployment, creator, seconds=churn_seconds)
    return {
        "sequential_ms": {
            kind: statistics.median(values) * 1000 for kind, values in latencies.items()
        },
        # Whether a kind slows down as its namespace fills: gpuadm's record grows by a
        # reservation per create, kept for the reservations' time to live.
        "sequential_ms_by_quarter": {
            kind: [statistics.median(part) * 1000 for part in _quarters(values)]
            for kind, values in latencies.items()
        },
        "sequential_count": count,
        "burst_size": BURST,
        "burst_fit": FIT,
        "bursts": burst_figures,
        "churn": churn,
    }


async def measured_burst(
    creator: PodCreator,
    deployment: Deployment,
    namespace: str,
    resource: str,
    replicas: int,
    *,
    balanced: bool,
) -> dict[str, Any]:
    """Send a burst of creates to a namespace that `FIT` of them fit; say what was stored.
    `balanced`: gpuadm's webhooks point at the balancer, not at its first replica."""
    if replicas and balanced:
        # Cut the apiserver's connections to gpuadm, so that new ones spread over the replicas.
        deployment.route(0)
        deployment.route(replicas)
    # A dry run of the same burst first: the apiserver opens its connections to the webhooks
    # and gpuadm learns the namespace, as in a cluster that has been running; nothing is
    # stored.
    warmup = await creator.burst(namespace, one_gpu_pods(resource, "dry", BURST), dry_run=True)
    conflicts_before = _conflicts(deployment)
    reviews_before = _reviews_by_replica(deployment)
    burst = await creator.burst(namespace, one_gpu_pods(resource, "pod", BURST), dry_run=False)
    reviews = [
        after - before
        for after, before in zip(_reviews_by_replica(deployment), reviews_before, strict=True)
    ]
    return {
        "seconds": burst.seconds,
        "admitted": burst.admitted,
        "stored": await creator.count_pods(namespace),
        "statuses": _by_status(burst),
        "dry_run_statuses": _by_status(warmup),
        "record_conflicts": _conflicts(deployment) - conflicts_before,
        # How the balancer spread the burst: the reviews each replica answered in it.
        "reviews_by_replica": reviews,
    }


def point(deployment: Deployment, *, direct: bool) -> None:
    """Point gpuadm's webhooks at its first replica (`direct`) or at the balancer."""
    point_gpuadm_webhooks(
        deployment.api,
        deployment,
        direct=direct,
        probe_namespace="open",
        probe_resource=GPUADM_RESOURCE,
    )


def _quarters(values: list[float]) -> list[list[float]]:
    size = max(1, len(values) // 4)
    return [values[start : start + size] for start in range(0, size * 4, size)]


def _by_status(burst: Burst) -> dict[str, int]:
    return {str(status): count for status, count in sorted(burst.statuses.items())}


def _reviews_by_replica(deployment: Deployment) -> list[float]:
    return [p.metric("gpuadm_admission_requests_total") for p in deployment.processes]


def _conflicts(deployment: Deployment) -> float:
    return sum(p.metric("gpuadm_quota_record_conflicts_total") for p in deployment.processes)


def prepare_namespaces(core: kubernetes.client.CoreV1Api, bursts: dict[str, list[str]]) -> str:
    """Make every namespace and native quota; return gpuadm's quota config for its own."""
    gpuadm_limits = {"gated": ROOMY, CHURN_NAMESPACE: ROOMY}
    for name in (NAMESPACE, "plain", "open", "gated", "dra-open", "dra-gated", CHURN_NAMESPACE):
        core.create_namespace({"metadata": {"name": name}})
    native_quota(core, "native", ROOMY)
    native_quota(core, "noop", ROOMY, labels={NOOP_LABEL: "true"})
    native_quota(core, "noop-balanced", ROOMY, labels={NOOP_BALANCED_LABEL: "true"})
    for kind, names in bursts.items():
        for name in names:
            if BURSTS[kind][1]:
                core.create_namespace({"metadata": {"name": name}})
                limit = BURST_LIMITS.get(kind, FIT)
                if limit is not None:
                    gpuadm_limits[name] = limit
            else:
                labels = {NOOP_LABELS[kind]: "true"} if kind in NOOP_LABELS else {}
                native_quota(core, name, FIT, labels=labels)
    put_configmap(core, "gpuadm-policy", "policy.yaml", BENCH_POLICY_YAML)
    return (
        "namespaces:\n"
        + "".join(f"  {name}: {{h100: {limit}}}\n" for name, limit in gpuadm_limits.items())
        + f"  dra-gated: {{h100-dra: {ROOMY}}}\n"
    )


def native_quota(
    core: kubernetes.client.CoreV1Api,
    namespace: str,
    limit: int,
    *,
    labels: dict[str, str] | None = None,
) -> None:
    """Make a namespace whose ResourceQuota allows `limit` of `NATIVE_RESOURCE`.

    There is no kube-controller-manager to fill in the quota's status, and the apiserver
    refuses every pod the quota covers until the status says what is hard and what is used,
    so the status is written here as the controller would first write it.
    """
    core.create_namespace({"metadata": {"name": namespace, "labels": labels or {}}})
    resource = f"requests.{NATIVE_RESOURCE}"
    core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "gpus"}, "spec": {"hard": {resource: str(limit)}}}
    )
    core.patch_namespaced_resource_quota_status(
        "gpus", namespace, {"status": {"hard": {resource: str(limit)}, "used": {resource: "0"}}}
    )
