"""GPU-hour budgets on a real node: pods that really run, counted by gpuadm as installed.

gpuadm's image runs on a real node, installed by its chart, with checkpoints every
`CHECKPOINT` seconds in buckets of `BUCKET` seconds so that a window of seconds can be
spent and freed within a test. The node advertises H100s (its status patched, as a device
plugin would), and the tenant pods run the node's pause image until their
`activeDeadlineSeconds` ends them: their own container times are the truth that gpuadm's
record, `gpuadm usage` and the metric are held to. The leader is killed while a pod runs.
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from fractions import Fraction
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e.installed import (
    GPU_CLASS,
    NAMESPACE,
    Image,
    Installation,
    on_a_real_node,
    wait_for,
)
from tests.e2e.kubelet import PAUSE_IMAGE
from tests.support import ROOT
from webhook.kube.objects import HOURS_RECORD_LABEL, hours_record_name

CHECKPOINT = 2
BUCKET = 10
# 12 GPU-seconds in any 30 seconds: one H100 spends it in 12 s.
BUDGET = "12s/30s"
WINDOW = 30
RUN_SECONDS = 16
PRODUCT = "NVIDIA-H100-80GB-HBM3"
ENFORCED = "hours"
QUEUED = "hours-line"
UNLABELLED = "hours-unlabelled"
QUOTAS = {
    "mode": "enforce",
    "namespaces": {
        ENFORCED: {"budget": {"h100": BUDGET}},
        QUEUED: {"mode": "queue", "budget": {"h100": BUDGET}},
        UNLABELLED: {"budget": {"h100": BUDGET}},
    },
}
GATE = "gpuadm.io/quota"
FREES_AT = re.compile(r"enough frees at (\S+Z)")


@pytest.fixture(scope="module")
def installation(image: Image) -> Iterator[Installation]:
    with on_a_real_node(image) as installed:
        _advertise_h100s(installed)
        for namespace in (ENFORCED, QUEUED, UNLABELLED):
            installed.make_namespace(namespace)
        values = installed.values(image, QUOTAS)
        values["extraArgs"] = [
            *values["extraArgs"],
            f"--gpu-hours-checkpoint-seconds={CHECKPOINT}",
            f"--gpu-hours-bucket-seconds={BUCKET}",
        ]
        installed.install(values)
        yield installed


def _advertise_h100s(installed: Installation) -> None:
    """Make the real node an H100 node, as GPU Feature Discovery and the device plugin would."""
    name = installed.node.name
    installed.core.patch_node(name, {"metadata": {"labels": {"nvidia.com/gpu.product": PRODUCT}}})
    installed.core.patch_node_status(name, {"status": {"capacity": {"nvidia.com/gpu": "4"}}})

    def advertised() -> bool:
        node = installed.core.read_node(name)
        return (node.status.allocatable or {}).get("nvidia.com/gpu") == "4"

    wait_for(advertised, "the node's four H100s in its allocatable")


def _running_pod(seconds: int | None = RUN_SECONDS) -> dict[str, Any]:
    """A pod of one H100 that runs the pause image for `seconds` (None: until deleted)."""
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": PAUSE_IMAGE,
                "imagePullPolicy": "Never",
                "resources": {"limits": {GPU_CLASS: "1"}},
            }
        ],
        "terminationGracePeriodSeconds": 1,
    }
    if seconds is not None:
        spec["activeDeadlineSeconds"] = seconds
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "train-"}, "spec": spec}


def _create(installation: Installation, namespace: str, seconds: int | None) -> str:
    pod = installation.core.create_namespaced_pod(namespace, _running_pod(seconds))
    name: str = pod.metadata.name
    return name


def _refusal(installation: Installation, namespace: str) -> str:
    with pytest.raises(ApiException) as refused:
        _create(installation, namespace, None)
    message: str = json.loads(refused.value.body)["message"]
    return message


def _try_create(installation: Installation, namespace: str) -> str | None:
    """Create a pod that runs until deleted; return None, or the refusal's message."""
    try:
        _create(installation, namespace, None)
    except ApiException as error:
        message: str = json.loads(error.body)["message"]
        return message
    return None


def _phase(installation: Installation, namespace: str, name: str) -> str:
    phase: str = installation.core.read_namespaced_pod(name, namespace).status.phase
    return phase


def _ran_seconds(installation: Installation, namespace: str, name: str) -> int:
    """How long the pod's container ran, by its own status."""
    status = installation.core.read_namespaced_pod(name, namespace).status
    terminated = status.container_statuses[0].state.terminated
    return int((terminated.finished_at - terminated.started_at).total_seconds())


def _usage(installation: Installation, namespace: str) -> dict[str, Any]:
    """`gpuadm usage -n NAMESPACE -o json`, as an admin runs it."""
    result = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "gpuadm"),
            "usage",
            "-n",
            namespace,
            "-o",
            "json",
            "--kubeconfig",
            str(installation.plane.kubeconfig_path),
            "--gpuadm-namespace",
            NAMESPACE,
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    items: list[dict[str, Any]] = json.loads(result.stdout)["items"]
    return next(item for item in items if item["class"] == "h100")


def _metric_seconds(installation: Installation, namespace: str) -> float:
    """`gpuadm_gpu_seconds_total` of the namespace's h100, scraped from a ready replica."""
    pod_ip = installation.ready_pods()[0].status.pod_ip
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = b"GET /metrics HTTP/1.1\r\nHost: gpuadm\r\nConnection: close\r\n\r\n"
    with (
        socket.create_connection((pod_ip, 8443), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        tls.sendall(request)
        body = b""
        while chunk := tls.recv(65536):
            body += chunk
    for line in body.decode(errors="replace").splitlines():
        name, _, rest = line.partition("{")
        labels, _, value = rest.partition("} ")
        if name == "gpuadm_gpu_seconds_total" and set(labels.split(",")) == {
            'gpu_class="h100"',
            f'namespace="{namespace}"',
        }:
            return float(value)
    raise AssertionError(f"no gpuadm_gpu_seconds_total series for namespace {namespace}")


def test_a_spent_budget_refuses_new_pods_and_the_count_survives_the_leaders_death(
    installation: Installation,
) -> None:
    wait_for(lambda: len(installation.ready_pods()) == 3, "3 gpuadm pods Ready")
    first = _create(installation, ENFORCED, RUN_SECONDS)
    wait_for(lambda: _phase(installation, ENFORCED, first) == "Running", "the first pod running")

    # Mid-run, the replica that checkpoints dies outright.
    time.sleep(RUN_SECONDS / 3)
    installation.kill(installation.leader())

    wait_for(lambda: _phase(installation, ENFORCED, first) == "Failed", "the pod's deadline", 60)
    ran = _ran_seconds(installation, ENFORCED, first)
    assert ran >= 12, f"the pod ran {ran} s, too short to spend the budget"

    # Once a checkpoint has counted the whole run, the record, `gpuadm usage` and every
    # replica's metric agree with the pod's own times: the leader's death lost nothing.
    # Whole-second timestamps at each end, and a checkpoint that may count a run as running
    # until the kubelet's status says it ended (docs/quota.md#what-is-counted).
    tolerance = CHECKPOINT + 1
    wait_for(
        lambda: abs(Fraction(_usage(installation, ENFORCED)["totalGpuSeconds"]) - ran) <= tolerance,
        "gpuadm usage to count the pod's run",
        30,
    )
    wait_for(
        lambda: abs(_metric_seconds(installation, ENFORCED) - ran) <= tolerance,
        "a replica's gpuadm_gpu_seconds_total to count the pod's run",
        30,
    )

    message = _refusal(installation, ENFORCED)
    assert f'namespace "{ENFORCED}": h100 GPU-hour budget spent: used ' in message
    assert "in the last 30s; enough frees at " in message
    assert "running pods are not stopped" in message
    frees = FREES_AT.search(message)
    assert frees is not None
    frees_at = datetime.fromisoformat(frees.group(1).replace("Z", "+00:00")).timestamp()

    # The window frees as the run's buckets leave it: admitted then, not before.
    assert frees_at - time.time() <= WINDOW + BUCKET
    while (outcome := _try_create(installation, ENFORCED)) is not None:
        assert "GPU-hour budget spent" in outcome
        assert time.time() < frees_at + 5, "still refused after the window freed"
        time.sleep(0.5)
    admitted_at = time.time()
    assert admitted_at >= frees_at - 1, "admitted before the window freed"


def test_in_a_queue_namespace_the_next_pod_waits_for_the_budget_and_then_runs(
    installation: Installation,
) -> None:
    wait_for(lambda: len(installation.ready_pods()) == 3, "3 gpuadm pods Ready")
    first = _create(installation, QUEUED, RUN_SECONDS)
    wait_for(
        lambda: _phase(installation, QUEUED, first) == "Failed", "the first pod's deadline", 60
    )
    wait_for(
        lambda: Fraction(_usage(installation, QUEUED)["totalGpuSeconds"]) >= 12,
        "gpuadm usage to count the first pod's run",
        30,
    )

    second = _create(installation, QUEUED, None)
    pod = installation.core.read_namespaced_pod(second, QUEUED)
    assert [gate.name for gate in pod.spec.scheduling_gates or []] == [GATE]
    waited = wait_for(
        lambda: not installation.core.read_namespaced_pod(second, QUEUED).spec.scheduling_gates,
        "the waiting pod's release once the budget frees",
        WINDOW + BUCKET + 20,
    )
    assert waited > 1, "released at once, while the budget was spent"

    events = installation.core.list_namespaced_event(
        QUEUED, field_selector=f"involvedObject.name={second}"
    ).items
    assert any("GPU-hour budget spent" in (event.message or "") for event in events), [
        event.message for event in events
    ]
    wait_for(lambda: _phase(installation, QUEUED, second) == "Running", "the released pod running")


def test_tenants_see_their_budget_on_their_gpuquota(installation: Installation) -> None:
    custom = kubernetes.client.CustomObjectsApi(installation.api)

    def shown() -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = custom.get_namespaced_custom_object(
                "gpuadm.io", "v1alpha1", ENFORCED, "gpuquotas", "h100"
            )
        except ApiException:
            return None
        return found

    wait_for(lambda: (shown() or {}).get("status", {}).get("budget") == BUDGET, "the budget")
    status = (shown() or {})["status"]
    assert status["budgetUsed"].endswith("s")  # in the unit the budget is written in


def _record_labels(installation: Installation, namespace: str) -> dict[str, str]:
    """The labels of a namespace's GPU-hour record; none if it has no record yet."""
    try:
        record = installation.core.read_namespaced_config_map(
            hours_record_name(namespace), NAMESPACE
        )
    except ApiException:
        return {}
    labels: dict[str, str] = record.metadata.labels or {}
    return labels


def test_a_record_that_lost_its_label_still_counts_and_is_labelled_again(
    installation: Installation,
) -> None:
    # A pod spends the budget twice over; once its run is counted, an admin takes the label
    # off its namespace's record. The record is still found, by its name: the next pod is
    # refused, not admitted as if nothing had run, and the leader writes the label back.
    wait_for(lambda: len(installation.ready_pods()) == 3, "3 gpuadm pods Ready")
    seconds = 24
    first = _create(installation, UNLABELLED, seconds)
    wait_for(lambda: _phase(installation, UNLABELLED, first) == "Failed", "the pod's deadline", 60)
    wait_for(
        lambda: Fraction(_usage(installation, UNLABELLED)["totalGpuSeconds"]) >= 12,
        "gpuadm usage to count the pod's run",
        30,
    )
    assert _record_labels(installation, UNLABELLED)[HOURS_RECORD_LABEL] == UNLABELLED
    installation.core.patch_namespaced_config_map(
        hours_record_name(UNLABELLED),
        NAMESPACE,
        {"metadata": {"labels": {HOURS_RECORD_LABEL: None}}},
    )
    assert HOURS_RECORD_LABEL not in _record_labels(installation, UNLABELLED)
    # Every replica has read the records again since.
    time.sleep(2 * CHECKPOINT + 1)
    message = _refusal(installation, UNLABELLED)
    assert f'namespace "{UNLABELLED}": h100 GPU-hour budget spent: used ' in message
    wait_for(
        lambda: _record_labels(installation, UNLABELLED).get(HOURS_RECORD_LABEL) == UNLABELLED,
        "the leader to write the record's label back",
        30,
    )
