"""`gpuadm check-config --from-cluster`: a policy against the cluster's own GPU nodes, labelled
by GPU Feature Discovery and registered by HAMi as they are on a real cluster, read through
the apiserver."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from tests.e2e.cluster import ControlPlane
from tests.e2e.nodes import A100_SXM, MIG_LAYOUT, Gpu, Pool, pools_created
from tests.support import run_gpuadm

# Nodes of this module alone, told apart by a label its classes select.
POOL_LABEL = {"gpuadm.io/e2e-pool": "check-cluster"}
H200 = Gpu("NVIDIA H200", 143771)
# A model no other module's nodes have: its nodes are this module's alone.
UNCLAIMED = Gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887)
POOLS = (
    Pool("fit-h200", None, H200, "hami", size=2, labels=POOL_LABEL),
    Pool("fit-mig", None, A100_SXM, "mig", labels=POOL_LABEL),
    Pool("fit-rtx", None, UNCLAIMED, "nvidia", labels=POOL_LABEL),
)
POLICY = """\
classes:
  h200:
    backend: hami
    memory: 141Gi
    models: [NVIDIA H200]
    nodeSelector: {gpuadm.io/e2e-pool: [check-cluster]}
  b200:
    backend: hami
    models: [NVIDIA B200]
    nodeSelector: {gpuadm.io/e2e-pool: [check-cluster]}
  a100-mig:
    backend: mig
    memory: 80Gi
    models: [NVIDIA A100-SXM4-80GB]
    profiles: {1g.10gb: 9728Mi, 1g.5gb: 4864Mi}
    nodeSelector: {gpuadm.io/e2e-pool: [check-cluster], nvidia.com/mig.strategy: [mixed]}
"""


@pytest.fixture(scope="module")
def fit_nodes(core_v1: kubernetes.client.CoreV1Api) -> Any:
    with pools_created(core_v1, POOLS) as names:
        yield names


def check_cluster(plane: ControlPlane, policy: Path) -> tuple[int, dict[str, Any]]:
    result = run_gpuadm(
        "check-config",
        "--policy",
        str(policy),
        "--from-cluster",
        "--kubeconfig",
        str(plane.kubeconfig_path),
        "-o",
        "json",
    )
    return result.returncode, json.loads(result.stdout)


def test_the_nodes_say_what_the_policy_gets_wrong(
    control_plane: ControlPlane, fit_nodes: list[str], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    code, report = check_cluster(control_plane, policy)
    assert code == 0  # what the nodes say are warnings: the policy itself is valid
    (cluster,) = report["cluster"]
    assert cluster["byClass"] == {
        "a100-mig": ["fit-mig-0"],
        "b200": [],
        "h200": ["fit-h200-0", "fit-h200-1"],
    }
    h200 = cluster["byModel"]["NVIDIA-H200"]
    assert (h200["nodes"], h200["gpus"], h200["memoryMiB"]) == (
        ["fit-h200-0", "fit-h200-1"],
        8,
        143771,
    )
    unclaimed = cluster["byModel"][UNCLAIMED.product_label]
    assert (unclaimed["nodes"], unclaimed["classes"]) == (["fit-rtx-0"], [])
    said = [w.split(": nodes: ", 1)[1] for w in report["warnings"] if ": nodes: " in w]
    assert (
        "class h200: memory 141Gi is more than its nodes report (143771Mi per GPU on "
        "fit-h200-0, NVIDIA-H200): two halves never share one of those GPUs"
    ) in said
    assert any(s.startswith("class b200: no node has its GPUs") for s in said)
    offered = ", ".join(sorted(MIG_LAYOUT))
    assert (
        f"class a100-mig: no node of the class offers MIG profile 1g.5gb (they offer: {offered})"
    ) in said
    assert (
        f"1 node of {UNCLAIMED.product_label} (fit-rtx-0): no class reaches them, so their GPUs "
        "serve no pod gpuadm rewrites"
    ) in said


def test_a_policy_that_fits_its_nodes_gets_no_word_of_them(
    control_plane: ControlPlane, fit_nodes: list[str], tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "classes:\n  h200:\n    backend: hami\n    models: [NVIDIA H200]\n"
        "    nodeSelector: {gpuadm.io/e2e-pool: [check-cluster]}\n"
    )
    code, report = check_cluster(control_plane, policy)
    assert code == 0
    said = [w for w in report["warnings"] if ": nodes: class h200" in w]
    assert said == []
    # Its memory, left out, is what the H200 reports, as the nodes do.
    assert any("class h200: no `memory` given: it is 143771Mi" in note for note in report["notes"])
