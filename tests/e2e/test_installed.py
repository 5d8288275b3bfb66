"""gpuadm installed as a user installs it, and operated as an admin operates it.

Its image, built from the Dockerfile, runs on a real node (containerd, runc, a kubelet), put
there by `helm install` of deploy/helm/gpuadm. The apiserver calls the webhooks through the
Service. Then the admin's days: a replica killed in a burst, a `helm upgrade` to a new image
and config under a steady stream of creates, a CA rotation, the queue's leader killed, and
`helm uninstall`; and after it, deploy/base applied as an admin without Helm would. The
scenarios share one installation and run in file order.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from tests.e2e.installed import (
    LEASE_SECONDS,
    NAMESPACE,
    RELEASE,
    Image,
    Installation,
    Stream,
    on_a_real_node,
    wait_for,
)
from tests.e2e.kubelet import NODE_LABEL
from tests.support import ROOT

BURST = 200
ROOM = 50
TENANTS: dict[str, dict[str, object]] = {
    "burst": {"h100": ROOM},
    "stream": {"h100": 10_000},
    "line": {"mode": "queue", "h100": 1},
    "upgraded": {"h100": 10_000},
}
QUOTAS = {"mode": "enforce", "namespaces": TENANTS}
GATE = "gpuadm.io/quota"


@pytest.fixture(scope="module")
def installation(image: Image) -> Iterator[Installation]:
    with on_a_real_node(image) as installed:
        for namespace in TENANTS:
            installed.make_namespace(namespace)
        installed.install(installed.values(image, QUOTAS))
        yield installed


def _stored_limits(pod: dict[str, object]) -> dict[str, str]:
    spec = pod["spec"]
    assert isinstance(spec, dict)
    limits: dict[str, str] = spec["containers"][0]["resources"]["limits"]
    return limits


def test_the_chart_runs_three_replicas_of_the_image_on_the_node(
    installation: Installation,
) -> None:
    wait_for(lambda: len(installation.ready_pods()) == 3, "3 gpuadm pods Ready")
    pods = installation.ready_pods()
    assert {p.spec.node_name for p in pods} == {installation.node.name}
    for pod in pods:
        assert pod.spec.containers[0].image == installation.image.name
        assert pod.spec.security_context.run_as_user == 65532
        assert pod.spec.containers[0].security_context.read_only_root_filesystem is True
    assert installation.node.images().count(installation.image.name) == 1


def test_a_gpu_pod_is_rewritten_and_charged_through_the_service(
    installation: Installation,
) -> None:
    stored = installation.create_gpu_pod("upgraded")
    # The h100 class is on the NVIDIA device plugin: a whole GPU as nvidia.com/gpu.
    assert _stored_limits(stored) == {"nvidia.com/gpu": "1"}
    with pytest.raises(ApiException) as refused:
        installation.create_gpu_pod("upgraded", gpus="10001")
    assert "h100 quota exceeded: requested 10001, in use 1 of 10000" in refused.value.body


def test_a_replica_killed_in_a_burst_admits_exactly_what_fits(installation: Installation) -> None:
    wait_for(lambda: len(installation.ready_pods()) == 3, "3 gpuadm pods Ready")
    victim = installation.ready_pods()[0].metadata.name

    outcomes = installation.create_many("burst", BURST, midway=lambda: installation.kill(victim))

    # What failurePolicy allows while a replica dies (a call that fails, a pod that skipped
    # mutation), and a record busy with the other replicas' writes, was retried and then
    # answered; nothing else went wrong, and nothing for good.
    assert outcomes.other == []
    assert outcomes.unreachable == [], "a create failed for good: gpuadm could not be reached"
    assert outcomes.retry == [], "a create was refused for good with a retry asked"
    assert all(
        "failed calling webhook" in m
        or "not processed by gpuadm's mutating webhook" in m
        or 'the quota record of namespace "burst" is busy' in m
        for m in outcomes.retried
    ), outcomes.retried
    record = installation.core.list_namespaced_config_map(
        NAMESPACE, label_selector="gpuadm.io/usage-for=burst"
    ).items
    stored_names = {p.metadata.name for p in installation.core.list_namespaced_pod("burst").items}
    assert len(outcomes.created) == ROOM, (
        f"stored {len(stored_names)}; created answers {len(outcomes.created)}; record "
        f"{[c.data for c in record]}; not stored but created: "
        f"{set(outcomes.created) - stored_names}; logs: {installation.describe_all()}"
    )
    assert len(outcomes.refused) == BURST - ROOM
    assert [m for m in outcomes.refused if "h100 quota exceeded" not in m] == []
    stored = installation.core.list_namespaced_pod("burst").items
    assert len(stored) == ROOM
    wait_for(lambda: len(installation.ready_pods()) == 3, "the killed replica replaced")
    assert victim not in {p.metadata.name for p in installation.ready_pods()}


def test_an_upgrade_to_a_new_image_and_config_fails_no_create(
    installation: Installation, image: Image
) -> None:
    wait_for(lambda: len(installation.ready_pods()) == 3, "3 gpuadm pods Ready")
    new = Image(image.archive, f"{image.repository}:{image.tag}-next")
    installation.node.tag(image.name, new.name)
    quotas = {**QUOTAS, "namespaces": {**TENANTS, "upgraded": {"h100": 0}}}

    with Stream(installation, "stream") as stream:
        time.sleep(2)
        installation.upgrade(installation.values(new, quotas))
        # helm --wait returns once the new replicas are Ready; the old ones drain and stop
        # after it, and the stream goes on through that too.
        wait_for(lambda: installation.all_pods_are(new.name), "the old replicas gone", seconds=120)
        time.sleep(2)

    assert stream.failures == []
    assert stream.created > 20
    pods = installation.ready_pods()
    assert len(pods) == 3
    assert {p.spec.containers[0].image for p in pods} == {new.name}
    with pytest.raises(ApiException) as refused:
        installation.create_gpu_pod("upgraded")
    message = json.loads(refused.value.body)["message"]
    assert 'namespace "upgraded": h100 quota exceeded: requested 1, in use' in message
    assert message.endswith(" of 0")


def _served_certificate(pod_ip: str) -> x509.Certificate:
    """The certificate a replica serves, read from its pod's address as the apiserver dials it."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection((pod_ip, 8443), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _signed_by(certificate: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _newest_ca(installation: Installation) -> x509.Certificate:
    secret = installation.core.read_namespaced_secret("gpuadm-tls", NAMESPACE)
    pem = base64.b64decode(secret.data["ca.crt"])
    return max(x509.load_pem_x509_certificates(pem), key=lambda c: c.not_valid_before_utc)


def test_a_ca_rotation_in_the_cluster_fails_no_request(installation: Installation) -> None:
    wait_for(lambda: len(installation.ready_pods()) == 3, "3 gpuadm pods Ready")
    before = _newest_ca(installation)
    with Stream(installation, "stream") as stream:
        subprocess.run(
            [
                str(ROOT / ".venv" / "bin" / "gpuadm"),
                "certs",
                "rotate",
                "--kubeconfig",
                str(installation.plane.kubeconfig_path),
                "--gpuadm-namespace",
                NAMESPACE,
            ],
            check=True,
            capture_output=True,
        )
        after = _newest_ca(installation)
        assert after.fingerprint(hashes.SHA256()) != before.fingerprint(hashes.SHA256())

        def all_serve_the_new_ca() -> bool:
            ips = [p.status.pod_ip for p in installation.ready_pods()]
            return len(ips) == 3 and all(_signed_by(_served_certificate(ip), after) for ip in ips)

        # Each replica re-reads the Secret every minute.
        wait_for(all_serve_the_new_ca, "every replica serving a certificate of the new CA", 150)
        time.sleep(2)

    assert stream.failures == []
    assert stream.created > 20


def _answers(pod_ip: str) -> bool:
    try:
        socket.create_connection((pod_ip, 8443), timeout=1).close()
    except OSError:
        return False
    return True


def _gated(installation: Installation, name: str) -> bool:
    pod = installation.core.read_namespaced_pod(name, "line")
    return any(g.name == GATE for g in pod.spec.scheduling_gates or [])


def test_the_queue_moves_on_when_its_leader_is_killed(installation: Installation) -> None:
    wait_for(lambda: len(installation.ready_pods()) == 3, "3 gpuadm pods Ready")
    first = installation.create_gpu_pod("line")["metadata"]["name"]
    wait_for(lambda: not _gated(installation, first), "the first pod released", 60)
    second = installation.create_gpu_pod("line")["metadata"]["name"]
    assert _gated(installation, second)

    leader = installation.leader()
    (leader_pod,) = [p for p in installation.ready_pods() if p.metadata.name == leader]
    installation.kill(leader)
    # The pod object goes at once; the kubelet stops its container a moment later, and only
    # then is the leader dead.
    wait_for(lambda: not _answers(leader_pod.status.pod_ip), "the killed leader gone", 30)
    installation.core.delete_namespaced_pod(first, "line")

    took = wait_for(lambda: not _gated(installation, second), "the second pod released", 60)
    # Another replica takes the Lease once it runs out unrenewed, then releases in its
    # first pass (docs/operations.md).
    assert took < 3 * LEASE_SECONDS + 5
    assert installation.leader() != leader


def test_uninstall_leaves_no_pod_behind_a_gate(installation: Installation) -> None:
    for pod in installation.core.list_namespaced_pod("line").items:
        installation.core.delete_namespaced_pod(pod.metadata.name, "line")
    running = installation.create_gpu_pod("line")["metadata"]["name"]
    wait_for(lambda: not _gated(installation, running), "the pod in line released", 60)
    waiting = installation.create_gpu_pod("line")["metadata"]["name"]
    assert _gated(installation, waiting)

    installation.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")

    assert not _gated(installation, waiting)
    admission = kubernetes.client.AdmissionregistrationV1Api(installation.api)
    assert admission.list_mutating_webhook_configuration().items == []
    assert admission.list_validating_webhook_configuration().items == []
    wait_for(lambda: installation.gpuadm_pods() == [], "gpuadm's pods gone")
    # With gpuadm gone, a GPU pod is created unjudged, as in a cluster without it.
    installation.create_gpu_pod("burst")
    # What stays, as docs/deploy.md says: the CRD, and with it the GPUQuota objects.
    extensions = kubernetes.client.ApiextensionsV1Api(installation.api)
    crds = {c.metadata.name for c in extensions.list_custom_resource_definition().items}
    assert "gpuquotas.gpuadm.io" in crds


def _kustomized_base(installation: Installation, directory: Path) -> list[dict[str, Any]]:
    """deploy/base, as an admin overlays it: this image, on the real node."""
    image = installation.image
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "deploy" / "base", directory)],
        "images": [
            {"name": "ghcr.io/gpuadm/gpuadm", "newName": image.repository, "newTag": image.tag}
        ],
        "patches": [
            {
                "target": {"kind": "Deployment", "name": "gpuadm"},
                "patch": yaml.safe_dump(
                    [
                        {
                            "op": "add",
                            "path": "/spec/template/spec/nodeSelector",
                            "value": {NODE_LABEL: "true"},
                        },
                        {
                            "op": "replace",
                            "path": "/spec/template/spec/containers/0/imagePullPolicy",
                            "value": "Never",
                        },
                    ]
                ),
            }
        ],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    # deploy/tools/install.sh puts each tool in a versioned directory of its own.
    tools = installation.helm_binary.parent.parent.parent
    found = [p for p in tools.glob("*/bin/kustomize") if p.is_file()]
    assert found, f"no kustomize beside {installation.helm_binary}"
    result = subprocess.run(
        [str(found[0]), "build", str(directory)], capture_output=True, text=True, check=True
    )
    return [o for o in yaml.safe_load_all(result.stdout) if o]


def test_the_kustomize_base_installs_and_serves_too(
    installation: Installation, tmp_path: Path
) -> None:
    """After the chart is gone: deploy/base with kubectl's apply, as an admin without Helm."""
    dynamic = DynamicClient(installation.api)
    for obj in _kustomized_base(installation, tmp_path):
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        resource.server_side_apply(
            body=obj,
            name=obj["metadata"]["name"],
            namespace=obj["metadata"].get("namespace"),
            field_manager="kubectl",
            force_conflicts=True,
        )
    wait_for(lambda: len(installation.ready_pods()) == 3, "3 gpuadm pods of deploy/base Ready")
    assert {p.spec.containers[0].image for p in installation.ready_pods()} == {
        installation.image.name
    }

    stored = installation.create_gpu_pod("upgraded")
    assert _stored_limits(stored) == {"nvidia.com/gpu": "1"}

    # The kustomize uninstall's first step (docs/deploy.md), before kubectl delete -k.
    subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "gpuadm"),
            "uninstall",
            "--kubeconfig",
            str(installation.plane.kubeconfig_path),
            "--gpuadm-namespace",
            NAMESPACE,
        ],
        check=True,
        capture_output=True,
    )
    admission = kubernetes.client.AdmissionregistrationV1Api(installation.api)
    assert admission.list_validating_webhook_configuration().items == []
