"""gpuadm's own TLS in a real cluster: one shared Secret, caBundles kept in step, rotation."""

from __future__ import annotations

import asyncio
import base64
import copy
import ssl
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from certs import verify_chain
from tests.e2e.cluster import ControlPlane
from tests.e2e.gpuadm import shipped_webhook_configurations
from tests.support import ROOT, free_port, spawn_serve, wait_until_listening
from webhook.cli.cluster import call
from webhook.kube.client import connect
from webhook.kube.rest import AsyncApi
from webhook.tls.keeper import WEBHOOK_KINDS, TLSKeeper, TLSTarget


@pytest.fixture
def target(
    api_client: kubernetes.client.ApiClient, core_v1: kubernetes.client.CoreV1Api
) -> Iterator[TLSTarget]:
    """A namespace and a pair of webhook configurations of its own, that match no pod."""
    name = f"tls-{uuid.uuid4().hex[:8]}"
    core_v1.create_namespace({"metadata": {"name": name}})
    admission = kubernetes.client.AdmissionregistrationV1Api(api_client)
    for shipped in shipped_webhook_configurations():
        configuration = copy.deepcopy(shipped)
        configuration["metadata"]["name"] = name
        for webhook in configuration["webhooks"]:
            webhook["clientConfig"] = {"url": "https://127.0.0.1:9/none"}
            webhook["namespaceSelector"] = {"matchLabels": {"gpuadm.test/never": "true"}}
        if shipped["kind"].startswith("Mutating"):
            admission.create_mutating_webhook_configuration(configuration)
        else:
            admission.create_validating_webhook_configuration(configuration)
    yield TLSTarget(name, "gpuadm-tls", name, [f"gpuadm.{name}.svc"], ["127.0.0.1"])
    admission.delete_mutating_webhook_configuration(name)
    admission.delete_validating_webhook_configuration(name)


def api_of(plane: ControlPlane) -> AsyncApi:
    """A client of its own, as each replica has: the admin's kubeconfig, read as serve reads it."""
    return AsyncApi(connect(str(plane.kubeconfig_path)).endpoint())


def bundles(plane: ControlPlane, name: str) -> list[bytes]:
    api = api_of(plane)

    async def read() -> list[bytes]:
        found = []
        for kind in WEBHOOK_KINDS:
            configuration = await api.get_webhook_configuration(kind, name)
            assert configuration is not None
            for webhook in configuration["webhooks"]:
                found.append(base64.b64decode(webhook["clientConfig"]["caBundle"]))
        return found

    return call(api, read())


def keeper(
    plane: ControlPlane,
    target: TLSTarget,
    directory: Path,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> TLSKeeper:
    return TLSKeeper(api_of(plane), target, directory, clock=clock)


def sync(*keepers: TLSKeeper, rotate: bool = False) -> None:
    """Run one pass of every keeper at once, as replicas that start together do."""

    async def passes() -> None:
        try:
            await asyncio.gather(*(k.sync(rotate=rotate) for k in keepers))
        finally:
            for k in keepers:
                await k.api.close()

    asyncio.run(passes())


def test_two_replicas_starting_at_once_end_with_one_ca(
    control_plane: ControlPlane, target: TLSTarget, tmp_path: Path
) -> None:
    for attempt in range(5):  # each attempt is a fresh race on a fresh Secret
        name = f"gpuadm-tls-{attempt}"
        race_target = TLSTarget(
            target.namespace,
            name,
            target.webhook_configuration,
            target.dns_names,
            target.ip_addresses,
        )
        keepers = [
            keeper(control_plane, race_target, tmp_path / f"{attempt}-{i}") for i in range(2)
        ]
        sync(*keepers)
        first, second = (k.state for k in keepers)
        assert first is not None
        assert second is not None
        assert first.ca.cert_pem == second.ca.cert_pem
        assert (tmp_path / f"{attempt}-0" / "tls.crt").read_bytes() == (
            tmp_path / f"{attempt}-1" / "tls.crt"
        ).read_bytes()
    served = (tmp_path / "4-0" / "tls.crt").read_bytes()
    now = datetime.now(UTC)
    for bundle in bundles(control_plane, target.webhook_configuration):
        verify_chain(served, bundle, hostname_or_ip="127.0.0.1", now=now)
        verify_chain(served, bundle, hostname_or_ip=target.dns_names[0], now=now)


def test_rotation_keeps_trusting_the_old_ca_while_serving_from_the_new(
    control_plane: ControlPlane, target: TLSTarget, tmp_path: Path
) -> None:
    replica = keeper(control_plane, target, tmp_path / "a")
    sync(replica)
    before = (tmp_path / "a" / "tls.crt").read_bytes()
    sync(replica, rotate=True)
    after = (tmp_path / "a" / "tls.crt").read_bytes()
    assert before != after
    now = datetime.now(UTC)
    for bundle in bundles(control_plane, target.webhook_configuration):
        assert bundle.count(b"BEGIN CERTIFICATE") == 2
        verify_chain(before, bundle, hostname_or_ip="127.0.0.1", now=now)
        verify_chain(after, bundle, hostname_or_ip="127.0.0.1", now=now)
    other = keeper(control_plane, target, tmp_path / "b")
    sync(other)
    assert (tmp_path / "b" / "tls.crt").read_bytes() == after


def test_renewal_is_due_by_the_clock_and_keeps_the_ca(
    control_plane: ControlPlane, target: TLSTarget, tmp_path: Path
) -> None:
    now = datetime.now(UTC)
    replica = keeper(control_plane, target, tmp_path / "a")
    sync(replica)
    assert replica.state is not None
    ca, serving = replica.state.ca, replica.state.serving
    later = keeper(control_plane, target, tmp_path / "b", clock=lambda: now + timedelta(days=300))
    sync(later)
    assert later.state is not None
    assert later.state.ca == ca
    assert later.state.serving.not_after > serving.not_after


def test_only_gpuadms_own_webhook_configurations_are_touched(
    control_plane: ControlPlane,
    api_client: kubernetes.client.ApiClient,
    target: TLSTarget,
    tmp_path: Path,
) -> None:
    admission = kubernetes.client.AdmissionregistrationV1Api(api_client)
    bystander: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"bystander-{target.namespace}"},
        "webhooks": [
            {
                "name": "bystander.example.com",
                "clientConfig": {"url": "https://127.0.0.1:9/x"},
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "namespaceSelector": {"matchLabels": {"gpuadm.test/never": "true"}},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "operations": ["CREATE"],
                    }
                ],
            }
        ],
    }
    admission.create_validating_webhook_configuration(bystander)
    try:
        sync(keeper(control_plane, target, tmp_path), rotate=True)
        stored = admission.read_validating_webhook_configuration(bystander["metadata"]["name"])
        assert stored.webhooks[0].client_config.ca_bundle is None
    finally:
        admission.delete_validating_webhook_configuration(bystander["metadata"]["name"])


def test_the_certs_command_installs_shows_and_rotates(
    control_plane: ControlPlane, target: TLSTarget
) -> None:
    common = [
        "--kubeconfig",
        str(control_plane.kubeconfig_path),
        "--gpuadm-namespace",
        target.namespace,
        "--webhook-configuration",
        target.webhook_configuration,
    ]

    def certs(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "webhook.cli", "certs", *args, *common],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert "caBundle of" in certs("install")
    shown = certs("show")
    assert f"gpuadm.{target.namespace}.svc" in shown
    assert "caBundle holds 1 CA certificate(s)" in shown
    certs("rotate")
    assert "caBundle holds 2 CA certificate(s)" in certs("show")


def test_a_missing_secret_is_reported_by_show(
    control_plane: ControlPlane, core_v1: kubernetes.client.CoreV1Api, target: TLSTarget
) -> None:
    with pytest.raises(ApiException):
        core_v1.read_namespaced_secret("gpuadm-tls", target.namespace)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "certs",
            "show",
            "--kubeconfig",
            str(control_plane.kubeconfig_path),
            "--gpuadm-namespace",
            target.namespace,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "run `gpuadm certs install`" in result.stdout


def test_serve_manages_its_own_tls_as_the_deployment_runs_it(
    control_plane: ControlPlane, target: TLSTarget, tmp_path: Path
) -> None:
    port = free_port()
    with (tmp_path / "serve.log").open("wb") as log:
        process = spawn_serve(
            port,
            "--gpuadm-namespace",
            target.namespace,
            "--kubeconfig",
            str(control_plane.kubeconfig_path),
            "--manage-tls",
            "--tls-dir",
            str(tmp_path / "tls"),
            "--webhook-configuration",
            target.webhook_configuration,
            "--ip",
            "127.0.0.1",
            log=log,
        )
    try:
        wait_until_listening(process, port, (tmp_path / "serve.log").read_text)
        # Trust exactly what the apiserver would: the caBundle gpuadm wrote.
        (bundle, *_) = bundles(control_plane, target.webhook_configuration)
        context = ssl.create_default_context(cadata=bundle.decode())
        url = f"https://127.0.0.1:{port}/healthz"
        with urllib.request.urlopen(url, context=context, timeout=10) as response:
            assert response.read() == b"ok"
    finally:
        process.terminate()
        process.wait(timeout=10)
