"""Pod-create latency through a real kube-apiserver, without and with gpuadm's webhooks."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import kubernetes.client

from tests.builders import POLICY_YAML
from tests.e2e.cluster import ControlPlane
from tests.e2e.fixtures import pod_body
from tests.e2e.gpuadm import (
    NAMESPACE,
    GpuadmProcess,
    make_tls,
    put_configmap,
    register_webhooks,
    wait_for_quotas,
    wait_until,
)


def create_latencies(
    core: kubernetes.client.CoreV1Api, namespace: str, count: int, prefix: str
) -> list[float]:
    """Create `count` one-GPU pods one after another; return each create's latency."""
    latencies = []
    for index in range(count):
        body = pod_body({"gpuadm.io/h100": "1"}, name=f"{prefix}-{index}")
        started = time.perf_counter()
        core.create_namespaced_pod(namespace, body, _preload_content=False)
        latencies.append(time.perf_counter() - started)
    return latencies


def measure(count: int = 200) -> dict[str, float]:
    """Return median create latencies without gpuadm, with it in a namespace without quota,
    and with it in a namespace under quota (where each admission also writes a reservation)."""
    with (
        ControlPlane() as plane,
        tempfile.TemporaryDirectory() as workdir,
        plane.api_client() as api,
    ):
        core = kubernetes.client.CoreV1Api(api)
        for name in ("bare", "open", "gated", NAMESPACE):
            core.create_namespace({"metadata": {"name": name}})
        create_latencies(core, "bare", 20, "warm")  # warm the apiserver's caches
        without = create_latencies(core, "bare", count, "p")

        tls = make_tls(Path(workdir) / "tls")
        put_configmap(core, "gpuadm-policy", "policy.yaml", POLICY_YAML)
        quotas = "namespaces:\n  gated: {h100: 100000}\n"
        put_configmap(core, "gpuadm-quotas", "quotas.yaml", quotas)
        gpuadm = GpuadmProcess(plane, tls, Path(workdir), 0)
        gpuadm.start()
        try:
            wait_until(gpuadm.ready, "gpuadm ready", gpuadm.log_tail)
            wait_for_quotas([gpuadm], quotas)
            url = f"https://127.0.0.1:{gpuadm.port}"
            register_webhooks(
                api, tls.ca_file, mutate_url=f"{url}/mutate", validate_url=f"{url}/validate"
            )
            create_latencies(core, "open", 20, "warm")
            without_quota = create_latencies(core, "open", count, "p")
            create_latencies(core, "gated", 20, "warm")
            with_gpuadm = create_latencies(core, "gated", count, "p")
        finally:
            gpuadm.stop()
    return {
        "without_ms": statistics.median(without) * 1000,
        "with_no_quota_ms": statistics.median(without_quota) * 1000,
        "with_ms": statistics.median(with_gpuadm) * 1000,
        "count": count,
    }
