"""What `make dev-cluster` shows a user: the README's pod, under the example policy, on an A100."""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client
import pytest
import yaml

from tests.builders import POLICY_YAML
from tests.e2e.fixtures import Deployment
from tests.e2e.nodes import EXAMPLE_POOLS, nodes_of, pools_created
from tests.e2e.scheduling import Scheduler
from tests.support import ROOT

EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def example_cluster(
    gpuadm: Deployment, core_v1: kubernetes.client.CoreV1Api, scheduler: Scheduler
) -> Iterator[None]:
    """Serve the example policy on its nodes, as `make dev-cluster` does; then the test policy."""
    gpuadm.set_policy((EXAMPLES / "policy.yaml").read_text())
    try:
        with pools_created(core_v1, EXAMPLE_POOLS) as names:
            scheduler.wait_until_seen(names[-1])
            yield
    finally:
        gpuadm.set_policy(POLICY_YAML)


@pytest.mark.usefixtures("example_cluster")
def test_the_readme_pod_is_bound_to_an_a100(
    gpuadm: Deployment, scheduler: Scheduler, namespace: str
) -> None:
    manifest = yaml.safe_load((EXAMPLES / "pods" / "a100-half.yaml").read_text())
    manifest["metadata"]["namespace"] = namespace
    gpuadm.core.create_namespaced_pod(namespace, manifest)
    node = scheduler.node_of(namespace, manifest["metadata"]["name"])
    assert node in nodes_of(EXAMPLE_POOLS, "a100")
