"""Run the test control plane and gpuadm by hand until Ctrl-C.

Usage::

    python -m tests.e2e.dev_cluster [--kubeconfig PATH]

Starts the same etcd, kube-apiserver and kube-scheduler the end-to-end tests
use, fake GPU nodes for the classes of the example policy, and one gpuadm
registered with the webhook configurations from deploy/base and the example
policy and quotas; prints how to reach them, and stops everything cleanly on
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from types import FrameType

import kubernetes.client

from tests.e2e.cluster import ControlPlane, ControlPlaneError
from tests.e2e.gpuadm import (
    NAMESPACE,
    SCHEDULER_NAMES,
    GpuadmProcess,
    install_quota_view,
    make_tls,
    put_configmap,
    register_webhooks,
    wait_until,
)
from tests.e2e.nodes import EXAMPLE_POOLS, create_pools
from tests.support import ROOT

HEALTH_CHECK_SECONDS = 1.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.e2e.dev_cluster",
        description="Run the end-to-end test control plane until Ctrl-C.",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="also copy the admin kubeconfig here (removed again on exit), "
        "so a fixed KUBECONFIG keeps working across restarts",
    )
    return parser.parse_args(argv)


def usage_hint(plane: ControlPlane, kubeconfig: Path, nodes: list[str]) -> str:
    """Describe how to reach the running control plane, with and without kubectl."""
    quoted = shlex.quote(str(kubeconfig))
    curl = (
        f"curl --cacert {shlex.quote(str(plane.ca_file))}"
        f" -H 'Authorization: Bearer {plane.token}' {plane.url}/api/v1/namespaces"
    )
    python = (
        "python -c 'import kubernetes as k; k.config.load_kube_config();"
        " print([n.metadata.name for n in k.client.CoreV1Api().list_namespace().items])'"
    )
    return "\n".join(
        [
            "Control plane is ready. There is no controller-manager or kubelet: the scheduler",
            "binds pods to the fake nodes, and there they stay Pending.",
            f"  API server:  {plane.url}",
            f"  kubeconfig:  {kubeconfig}",
            f"  nodes:       {' '.join(nodes)}",
            f"  logs:        {plane.log_path('kube-apiserver')}",
            f"               {plane.log_path('kube-scheduler')}",
            f"               {plane.log_path('etcd')}",
            "",
            f"  export KUBECONFIG={quoted}",
            "",
            "Without kubectl:",
            f"  {curl}",
            f"  {python}",
            "",
            "gpuadm serves the example policy and quotas (ConfigMaps gpuadm-policy and",
            f"gpuadm-quotas in namespace {NAMESPACE}); try, with kubectl:",
            "  kubectl get nodes -L nvidia.com/gpu.product",
            "  kubectl create namespace team-a",
            "  kubectl create -f examples/pods/a100-half.yaml",
            "  kubectl get pod notebook -n team-a -o wide",
            "  kubectl get pod notebook -n team-a -o yaml",
            "  kubectl create namespace team-c",
            "  kubectl create -f examples/pods/h100-job.yaml",
            "  kubectl get pods -n team-c",
            "  kubectl get gpuquotas -n team-c",
            "",
            "Press Ctrl-C to stop.",
        ]
    )


def stop_on_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt so it takes the same clean exit as Ctrl-C."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def start_gpuadm(plane: ControlPlane) -> GpuadmProcess:
    """Start one gpuadm on the example config, registered as deploy/base ships it."""
    with plane.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        install_quota_view(api)
        for name, key in (("gpuadm-policy", "policy.yaml"), ("gpuadm-quotas", "quotas.yaml")):
            put_configmap(core, name, key, (ROOT / "examples" / key).read_text())
        tls = make_tls(plane.workdir / "gpuadm-tls")
        gpuadm = GpuadmProcess(plane, tls, plane.workdir, 0)
        gpuadm.start()
        wait_until(gpuadm.ready, "gpuadm ready", gpuadm.log_tail)
        url = f"https://127.0.0.1:{gpuadm.port}"
        register_webhooks(
            api, tls.ca_file, mutate_url=f"{url}/mutate", validate_url=f"{url}/validate"
        )
    print(f"gpuadm is serving on {url} (log: {gpuadm.log_path})", flush=True)
    return gpuadm


def start_scheduling(plane: ControlPlane) -> list[str]:
    """Start kube-scheduler, the controllers (Jobs, role aggregation) and the example policy's
    nodes; return the nodes' names."""
    plane.start_scheduler(SCHEDULER_NAMES)
    plane.start_controller_manager()
    with plane.api_client() as api:
        return create_pools(kubernetes.client.CoreV1Api(api), EXAMPLE_POOLS)


def serve(plane: ControlPlane, kubeconfig: Path, gpuadm: GpuadmProcess, nodes: list[str]) -> None:
    """Print the usage hint, then block until interrupted or a process dies."""
    print(usage_hint(plane, kubeconfig, nodes), flush=True)
    try:
        while True:
            plane.raise_if_exited()
            if gpuadm.process is not None and gpuadm.process.poll() is not None:
                raise ControlPlaneError(f"gpuadm exited:\n{gpuadm.log_tail()}")
            time.sleep(HEALTH_CHECK_SECONDS)
    except KeyboardInterrupt:
        print("\nStopping the control plane.", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the control plane until Ctrl-C; return the process exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    stop_on_sigterm()
    try:
        with ControlPlane() as plane:
            kubeconfig = plane.kubeconfig_path
            if args.kubeconfig is not None:
                # copy() keeps the owner-only mode: the file holds the admin token.
                kubeconfig = Path(shutil.copy(plane.kubeconfig_path, args.kubeconfig))
            gpuadm = start_gpuadm(plane)
            try:
                serve(plane, kubeconfig, gpuadm, start_scheduling(plane))
            finally:
                gpuadm.stop()
                if args.kubeconfig is not None:
                    kubeconfig.unlink(missing_ok=True)
    except ControlPlaneError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Interrupted while building or starting; start() already cleaned up.
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
