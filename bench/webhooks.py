"""Who answers the apiserver's webhook calls in the benchmark.

- gpuadm: `REPLICAS` `gpuadm serve` processes in cluster mode behind a balancer, registered
  with the webhook configurations deploy/ ships, as the suite does. The balancer forwards
  in the kernel as a Service does (`bench.kernel`) where the machine lets it, else it is
  the end-to-end suite's relay in a process of its own (`bench.relay`). They run with the
  suite's arguments alone (its TLS, its kubeconfig, a Lease of 3 s rather than 15, which
  no create waits on): the quota record is written as the chart's defaults write it.
- Two webhooks that do nothing: the bench's bare handler, registered for the namespaces that
  carry `NOOP_LABEL`. A create through them pays the two round trips that any admission
  webhook costs the apiserver, and nothing else, which splits gpuadm's overhead into what
  being a webhook costs and what gpuadm does. Both are called over HTTP/1.1, like with
  like: it is the only protocol either serves.
- The same two, served by `REPLICAS` processes behind a balancer of their own, of the same
  kind as gpuadm's, for the namespaces that carry `NOOP_BALANCED_LABEL`: the anchor of a
  burst through gpuadm's `REPLICAS` replicas, so that both pay for the same balancer.

gpuadm's replicas run with the chart's defaults: no `--client-ca-file` (the chart's
`clientAuth.caConfigMap` is empty by default), so the TLS handshake is the no-op's too.
"""

from __future__ import annotations

import base64
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client

from bench.kernel import KernelBalancer, remove_stale_chains
from bench.relay import RelayProcess
from bench.server import Served
from tests.e2e.cluster import ControlPlane
from tests.e2e.fixtures import Deployment, pod_body
from tests.e2e.gpuadm import (
    GpuadmProcess,
    make_tls,
    put_configmap,
    register_webhooks,
    wait_for_quotas,
    wait_until,
)

REPLICAS = 3
NOOP_LABEL = "bench.gpuadm.io/noop-webhooks"
NOOP_NAMES = {
    "Mutating": "mutate.noop.bench.gpuadm.io",
    "Validating": "validate.noop.bench.gpuadm.io",
}
NOOP_BALANCED_LABEL = "bench.gpuadm.io/noop-webhooks-balanced"
NOOP_BALANCED_NAMES = {
    "Mutating": "mutate.noop-balanced.bench.gpuadm.io",
    "Validating": "validate.noop-balanced.bench.gpuadm.io",
}
RELAYS_ENDING_SECONDS = 0.5
# The apiserver's own count of the calls it made to each admission webhook.
WEBHOOK_CALLS = "apiserver_admission_webhook_admission_duration_seconds_count{"


@contextlib.contextmanager
def gpuadm_replicas(
    plane: ControlPlane,
    api: kubernetes.client.ApiClient,
    workdir: Path,
    *,
    quotas: str,
    probe_namespace: str,
    probe_resource: str,
) -> Iterator[Deployment]:
    """Run gpuadm's replicas with `quotas`, registered as shipped, routed to one replica.

    Yields once a create in `probe_namespace` asking for `probe_resource` reaches gpuadm.
    """
    core = kubernetes.client.CoreV1Api(api)
    tls = make_tls(workdir / "tls")
    put_configmap(core, "gpuadm-quotas", "quotas.yaml", quotas)
    processes = [
        GpuadmProcess(plane, tls, workdir, index, client_ca=False) for index in range(REPLICAS)
    ]
    balancer = start_balancer()
    try:
        for process in processes:
            process.start()
        deployment = Deployment(processes, balancer, core, api, tls.ca_file)
        for process in processes:
            wait_until(process.ready, f"gpuadm on port {process.port} ready", process.log_tail)
        wait_for_quotas(processes, quotas)
        deployment.route(1)
        register_webhooks(
            api,
            tls.ca_file,
            mutate_url=f"{deployment.url}/mutate",
            validate_url=f"{deployment.url}/validate",
        )

        def in_force() -> bool:
            before = deployment.reviews()
            deployment.create_pod(probe_namespace, {probe_resource: "1"}, dry_run=True)
            return deployment.reviews() > before

        wait_until(in_force, "gpuadm's webhooks in force")
        yield deployment
    except Exception:
        # The logs go with the temporary folder: show how each replica's ended first.
        for process in processes:
            print(f"--- gpuadm on port {process.port} ---\n{process.log_tail()}", file=sys.stderr)
        raise
    finally:
        # Cut every connection, and give the relays a moment to end on their own: Python
        # 3.11 logs a traceback for each connection handler that stop() has to cancel.
        try:
            balancer.route_to([])
            time.sleep(RELAYS_ENDING_SECONDS)
        finally:
            balancer.stop()
            for process in processes:
                process.stop()


def start_balancer() -> KernelBalancer | RelayProcess:
    """Start the balancer in the kernel where the machine allows it, else the relay."""
    if KernelBalancer.available():
        remove_stale_chains()
        kernel = KernelBalancer()
        try:
            kernel.start()
        except RuntimeError as error:
            print(f"the balancer in the kernel failed ({error}): relaying", file=sys.stderr)
        else:
            return kernel
    relay = RelayProcess()
    relay.start()
    return relay


def point_gpuadm_webhooks(
    api: kubernetes.client.ApiClient,
    deployment: Deployment,
    *,
    direct: bool,
    probe_namespace: str,
    probe_resource: str,
) -> None:
    """Point gpuadm's webhooks straight at its first replica, or back at the balancer.

    Sequential creates go straight to one replica, as the no-op webhooks are called, so that
    they measure the same whichever balancer the machine allows (the relay costs about
    0.5 ms a call). Bursts need the balancer, to spread over replicas. With the balancer
    routing nowhere, a create reaches gpuadm only through the configuration pointing past
    it, which tells when the apiserver has taken up the new one.
    """
    first = deployment.processes[0]
    base = f"https://127.0.0.1:{first.port}" if direct else deployment.url
    deployment.route(0)
    register_webhooks(
        api, deployment.ca_file, mutate_url=f"{base}/mutate", validate_url=f"{base}/validate"
    )

    def in_force() -> bool:
        try:
            deployment.create_pod(probe_namespace, {probe_resource: "1"}, dry_run=True)
        except kubernetes.client.exceptions.ApiException as error:
            # The balancer routes nowhere: the call failed on its way through it. Any other
            # failure is the benchmark's to report.
            if "failed calling webhook" not in str(error.body):
                raise
            return not direct
        return direct

    wait_until(
        in_force, "gpuadm's webhooks pointed " + ("at one replica" if direct else "at the balancer")
    )
    deployment.route(1)


def register_noop_webhooks(
    api: kubernetes.client.ApiClient,
    served: Served,
    *,
    probe_namespace: str,
    url: str = "",
    label: str = NOOP_LABEL,
    names: dict[str, str] = NOOP_NAMES,
) -> None:
    """Send every pod create in a namespace labelled `label` to `served` (at `url`, else its
    own), both ways, through the webhook configurations `names`.

    Returns once a create in `probe_namespace` (which must carry the label) reaches both.
    """
    admission = kubernetes.client.AdmissionregistrationV1Api(api)
    for kind, name in names.items():
        configuration = {
            "metadata": {"name": name},
            "webhooks": [noop_webhook(kind, name, served, url=url or served.url, label=label)],
        }
        if kind == "Mutating":
            admission.create_mutating_webhook_configuration(configuration)
        else:
            admission.create_validating_webhook_configuration(configuration)
    core = kubernetes.client.CoreV1Api(api)

    def in_force() -> bool:
        before = {name: webhook_calls(api, name) for name in names.values()}
        body = pod_body({"example.com/probe": "1"})
        core.create_namespaced_pod(probe_namespace, body, dry_run="All")
        return all(webhook_calls(api, name) > before[name] for name in names.values())

    wait_until(in_force, f"the no-op webhooks {', '.join(names.values())} in force")


def noop_webhook(kind: str, name: str, served: Served, *, url: str, label: str) -> dict[str, Any]:
    """Return one webhook of a configuration: every pod create, in labelled namespaces."""
    path = "/mutate" if kind == "Mutating" else "/validate"
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {
            "url": url + path,
            "caBundle": base64.b64encode(served.ca_file.read_bytes()).decode(),
        },
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "operations": ["CREATE"],
                "scope": "Namespaced",
            }
        ],
        "namespaceSelector": {"matchLabels": {label: "true"}},
        "sideEffects": "None",
        "timeoutSeconds": 5,
        "failurePolicy": "Fail",
    }


def webhook_calls(api: kubernetes.client.ApiClient, name: str) -> float:
    """Return how many calls the apiserver has made to the admission webhook `name`."""
    configuration = api.configuration
    response = api.call_api(
        "GET",
        f"{configuration.host}/metrics",
        header_params={"Authorization": configuration.get_api_key_with_prefix("authorization")},
    )
    total = 0.0
    for line in response.read().decode().splitlines():
        if line.startswith(WEBHOOK_CALLS) and f'name="{name}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
