"""What `make dev-cluster` shows a user: the README's pod, under the example policy, on an A100."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import kubernetes.config
import pytest
import yaml

from tests.e2e.fixtures import Deployment, serving_on_pools
from tests.e2e.nodes import EXAMPLE_POOLS, nodes_of
from tests.e2e.scheduling import Scheduler
from tests.support import ROOT

EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def example_cluster(
    gpuadm: Deployment, core_v1: kubernetes.client.CoreV1Api, scheduler: Scheduler
) -> Iterator[None]:
    """Serve the example policy on its nodes, as `make dev-cluster` does; then the test policy."""
    with serving_on_pools(
        gpuadm, core_v1, scheduler, (EXAMPLES / "policy.yaml").read_text(), EXAMPLE_POOLS
    ):
        yield


@pytest.mark.usefixtures("example_cluster")
def test_the_readme_pod_is_bound_to_an_a100(
    gpuadm: Deployment, scheduler: Scheduler, namespace: str
) -> None:
    manifest = yaml.safe_load((EXAMPLES / "pods" / "a100-half.yaml").read_text())
    manifest["metadata"]["namespace"] = namespace
    gpuadm.core.create_namespaced_pod(namespace, manifest)
    node = scheduler.node_of(namespace, manifest["metadata"]["name"])
    assert node in nodes_of(EXAMPLE_POOLS, "a100")


def test_make_dev_cluster_runs_gpuadms_own_pods_on_a_real_node(tmp_path: Path) -> None:
    """`make dev-cluster` as a user runs it: the chart's pods Running on the real node."""
    kubeconfig = tmp_path / "kubeconfig"
    log = (tmp_path / "dev-cluster.log").open("w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.dev_cluster", "--kubeconfig", str(kubeconfig)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 600
        while "Press Ctrl-C to stop." not in Path(log.name).read_text():
            assert process.poll() is None, Path(log.name).read_text()
            assert time.monotonic() < deadline, Path(log.name).read_text()
            time.sleep(0.5)
        output = Path(log.name).read_text()
        assert "gpuadm runs on the real node gpuadm-node" in output
        with kubernetes.config.new_client_from_config(str(kubeconfig)) as api:
            pods = kubernetes.client.CoreV1Api(api).list_namespaced_pod(
                "gpuadm-system", label_selector="app.kubernetes.io/name=gpuadm"
            )
        running = [p for p in pods.items if p.status.phase == "Running"]
        assert len(running) == 3
        assert {p.spec.node_name for p in running} == {"gpuadm-node"}
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=120)
        log.close()
    assert code == 0, Path(log.name).read_text()
    assert not kubeconfig.exists()
