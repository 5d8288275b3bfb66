"""Run the test control plane and gpuadm by hand until Ctrl-C.

Usage::

    python -m tests.e2e.dev_cluster [--kubeconfig PATH]

Starts the same etcd, kube-apiserver, kube-scheduler and controller manager the
end-to-end tests use, fake GPU nodes for the classes of the example policy, and a
real node (containerd and a kubelet) on which gpuadm's image runs, installed by its
Helm chart with the example policy and quotas, as a user installs it. Prints how to
reach them, and stops everything cleanly on Ctrl-C or SIGTERM.

The real node needs root and the packages of ``make node``. Without them, gpuadm
runs as one process on this machine instead, registered by URL, and the reason is
printed.
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
import yaml

from tests.e2e.cluster import CONTROLLERS, ControlPlane, ControlPlaneError
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
from tests.e2e.installed import Installation, build_image, helm_binary
from tests.e2e.kubelet import REAL_NODE_CONTROLLERS, KubeletNode, NodeError, node_prerequisites
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


def usage_hint(plane: ControlPlane, kubeconfig: Path, nodes: list[str], real_node: str) -> str:
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
    if real_node:
        where = [
            f"gpuadm runs on the real node {real_node}, installed by its Helm chart, as in a",
            "cluster; the scheduler binds GPU pods to the fake nodes, where they stay Pending.",
        ]
        watch = [
            f"  kubectl get pods -n {NAMESPACE} -o wide",
            f"  kubectl logs -n {NAMESPACE} deploy/gpuadm",
        ]
    else:
        where = [
            "gpuadm runs as a process on this machine (no real node here); the scheduler binds",
            "pods to the fake nodes, where they stay Pending.",
        ]
        watch = []
    return "\n".join(
        [
            "Control plane is ready.",
            *where,
            f"  API server:  {plane.url}",
            f"  kubeconfig:  {kubeconfig}",
            f"  nodes:       {' '.join(nodes + ([real_node] if real_node else []))}",
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
            *watch,
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


def install_on_real_node(plane: ControlPlane, node: KubeletNode) -> Installation:
    """Build gpuadm's image, load it into the node, and install the chart with the examples."""
    print("Building gpuadm's image (cached after the first time)...", flush=True)
    image = build_image()
    node.load_image(image.archive)
    installation = Installation(plane, node, helm_binary(), image)
    examples = ROOT / "examples"
    values = installation.values(
        image,
        yaml.safe_load((examples / "quotas.yaml").read_text()),
        policy=yaml.safe_load((examples / "policy.yaml").read_text()),
    )
    print("Installing the chart deploy/helm/gpuadm on the real node...", flush=True)
    installation.install(values)
    return installation


def start_scheduling(plane: ControlPlane, controllers: tuple[str, ...]) -> list[str]:
    """Start kube-scheduler, the controllers and the example policy's nodes; return the nodes'
    names."""
    plane.start_scheduler(SCHEDULER_NAMES)
    plane.start_controller_manager(controllers)
    with plane.api_client() as api:
        return create_pools(kubernetes.client.CoreV1Api(api), EXAMPLE_POOLS)


def serve(
    plane: ControlPlane,
    kubeconfig: Path,
    nodes: list[str],
    gpuadm: GpuadmProcess | None,
    node: KubeletNode | None,
) -> None:
    """Print the usage hint, then block until interrupted or a process dies."""
    print(usage_hint(plane, kubeconfig, nodes, node.name if node else ""), flush=True)
    try:
        while True:
            plane.raise_if_exited()
            if node is not None:
                node.raise_if_exited()
            if (
                gpuadm is not None
                and gpuadm.process is not None
                and gpuadm.process.poll() is not None
            ):
                raise ControlPlaneError(f"gpuadm exited:\n{gpuadm.log_tail()}")
            time.sleep(HEALTH_CHECK_SECONDS)
    except KeyboardInterrupt:
        print("\nStopping the control plane.", flush=True)


def run(args: argparse.Namespace) -> None:
    """Start everything, serve until interrupted, stop everything."""
    problem = node_prerequisites()
    if problem:
        print(f"No real node: {problem}. gpuadm runs as a process instead.", flush=True)
    with ControlPlane() if problem else ControlPlane.for_real_node() as plane:
        kubeconfig = plane.kubeconfig_path
        if args.kubeconfig is not None:
            # copy() keeps the owner-only mode: the file holds the admin token.
            kubeconfig = Path(shutil.copy(plane.kubeconfig_path, args.kubeconfig))
        try:
            if problem:
                nodes = start_scheduling(plane, CONTROLLERS)
                gpuadm = start_gpuadm(plane)
                try:
                    serve(plane, kubeconfig, nodes, gpuadm, None)
                finally:
                    gpuadm.stop()
            else:
                nodes = start_scheduling(plane, REAL_NODE_CONTROLLERS)
                with KubeletNode(plane) as node:
                    install_on_real_node(plane, node)
                    serve(plane, kubeconfig, nodes, None, node)
        finally:
            if args.kubeconfig is not None:
                kubeconfig.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """Run the control plane until Ctrl-C; return the process exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    stop_on_sigterm()
    try:
        run(args)
    except (ControlPlaneError, NodeError, AssertionError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Interrupted while building or starting; start() already cleaned up.
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
