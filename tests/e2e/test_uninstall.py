"""`gpuadm uninstall` against the real apiserver and the running gpuadm: the webhook
configurations go first, then every pod waiting behind gpuadm's gate loses it, and no other
gate is touched. Run as the admin, as with kustomize; as the chart's pre-delete Job runs it,
with the account and roles the chart makes for it; and as gpuadm's own account with
deploy/base's roles, which is refused.

Each test deletes the session's webhook configurations, which the other tests need: the
`restore_webhooks` fixture registers them again and waits until the apiserver calls them.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import ControlPlane
from tests.e2e.fixtures import Deployment
from tests.e2e.gpuadm import DEPLOY_BASE, NAMESPACE, register_webhooks, wait_until
from tests.e2e.installed import helm_binary
from tests.e2e.test_queue import (
    GATE,
    H100_POD,
    create_in_line,
    queue_quota,
    released,
    waiting_events,
)
from tests.support import ROOT

HOLD = {"name": "example.com/hold"}  # another controller's gate, which gpuadm must leave


@pytest.fixture
def restore_webhooks(gpuadm: Deployment, namespace: str) -> Iterator[None]:
    """Give the session back gpuadm as it was: every replica routed, both webhook
    configurations registered, and the apiserver calling them again."""
    yield
    gpuadm.route(len(gpuadm.processes))
    register_webhooks(
        gpuadm.api,
        gpuadm.ca_file,
        mutate_url=f"{gpuadm.url}/mutate",
        validate_url=f"{gpuadm.url}/validate",
    )

    def mutated() -> bool:
        stored = gpuadm.create_pod(namespace, H100_POD, dry_run=True)
        return "gpuadm.io/class" in (stored["metadata"].get("labels") or {})

    wait_until(mutated, "the apiserver to call gpuadm's webhooks again")


def gates(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> list[str]:
    pod = core.read_namespaced_pod(name, namespace)
    return [g.name for g in pod.spec.scheduling_gates or ()]


def waiting_line(gpuadm: Deployment, namespace: str) -> None:
    """In a queue namespace whose one GPU is held: `waiting` behind gpuadm's gate alone,
    `held-twice` behind another gate and gpuadm's, and `held-elsewhere`, no GPU pod, behind
    the other gate alone."""
    core = gpuadm.core
    gpuadm.set_quotas(queue_quota(namespace, 1))
    released(core, namespace, create_in_line(gpuadm, namespace, "holder"))
    create_in_line(gpuadm, namespace, "waiting")
    stored = gpuadm.create_pod(
        namespace, H100_POD, name="held-twice", spec={"schedulingGates": [HOLD]}
    )
    assert [g["name"] for g in stored["spec"]["schedulingGates"]] == [HOLD["name"], GATE]
    gpuadm.create_pod(
        namespace, {"cpu": "100m"}, name="held-elsewhere", spec={"schedulingGates": [HOLD]}
    )
    # Both in line, the leader having seen them (their places depend on the second each was
    # created in: a tie goes by name).
    wait_until(
        lambda: {"waiting", "held-twice"} <= waiting_events(core, namespace).keys(),
        "both GPU pods told they wait in line",
    )


def uninstall(kubeconfig: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run `gpuadm uninstall` as an admin would."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "uninstall",
            "--gpuadm-namespace",
            NAMESPACE,
            "--kubeconfig",
            str(kubeconfig),
            *argv,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def configurations(api: kubernetes.client.ApiClient) -> set[str]:
    """The kinds of the webhook configurations named gpuadm that exist."""
    admission = kubernetes.client.AdmissionregistrationV1Api(api)
    found = set()
    for kind, read in (
        ("mutating", admission.read_mutating_webhook_configuration),
        ("validating", admission.read_validating_webhook_configuration),
    ):
        try:
            read("gpuadm")
        except ApiException as error:
            if error.status != 404:
                raise
        else:
            found.add(kind)
    return found


def check_uninstalled(gpuadm: Deployment, namespace: str, result: Any) -> None:
    """What the command must have done, said and left alone in `namespace`."""
    core = gpuadm.core
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    ours = [line for line in lines if line.startswith(f"pod {namespace}/")]
    assert sorted(ours) == [
        f"pod {namespace}/held-twice: gate {GATE} lifted",
        f"pod {namespace}/waiting: gate {GATE} lifted",
    ]
    assert lines[:2] == [
        "mutatingwebhookconfiguration/gpuadm deleted",
        "validatingwebhookconfiguration/gpuadm deleted",
    ]
    assert lines[-1].startswith(
        "deleted MutatingWebhookConfiguration gpuadm and ValidatingWebhookConfiguration "
        f"gpuadm; lifted the gate {GATE} of "
    )
    assert configurations(gpuadm.api) == set()
    assert gates(core, namespace, "waiting") == []
    assert gates(core, namespace, "held-twice") == [HOLD["name"]]
    assert gates(core, namespace, "held-elsewhere") == [HOLD["name"]]
    assert gates(core, namespace, "holder") == []
    # gpuadm's pods gone now, a GPU pod is created all the same: nothing is left to refuse
    # it, or to hold it in line.
    gpuadm.route(0)
    after = gpuadm.create_pod(namespace, H100_POD, name="after")
    assert not after["spec"].get("schedulingGates")
    assert "gpuadm.io/class" not in (after["metadata"].get("labels") or {})


@pytest.mark.usefixtures("restore_webhooks")
def test_uninstall_deletes_the_webhooks_then_lifts_gpuadms_gate_and_no_other(
    gpuadm: Deployment, namespace: str, control_plane: ControlPlane
) -> None:
    waiting_line(gpuadm, namespace)

    # A dry run changes nothing, and says what the real run will do.
    dry = uninstall(control_plane.kubeconfig_path, "--dry-run", "-o", "json")
    assert dry.returncode == 0, dry.stderr
    said = json.loads(dry.stdout)
    assert said["dryRun"] is True
    assert said["gate"] == GATE
    assert [c["existed"] for c in said["webhookConfigurations"]] == [True, True]
    assert sorted(p["name"] for p in said["lifted"] if p["namespace"] == namespace) == [
        "held-twice",
        "waiting",
    ]
    assert configurations(gpuadm.api) == {"mutating", "validating"}
    assert gates(gpuadm.core, namespace, "waiting") == [GATE]

    check_uninstalled(gpuadm, namespace, uninstall(control_plane.kubeconfig_path))

    # Run again, it finds nothing left to do, and says so.
    again = uninstall(control_plane.kubeconfig_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[:2] == [
        "mutatingwebhookconfiguration/gpuadm not found: already gone",
        "validatingwebhookconfiguration/gpuadm not found: already gone",
    ]
    assert not [line for line in again.stdout.splitlines() if f" {namespace}/" in line]


def _account(
    api_client: kubernetes.client.ApiClient,
    core_v1: kubernetes.client.CoreV1Api,
    control_plane: ControlPlane,
    tmp_path: Path,
    account: str,
    documents: list[dict[str, Any]],
) -> Iterator[Path]:
    """A kubeconfig of ServiceAccount `account` in gpuadm's namespace, with `documents`
    (its roles and bindings) created for the test and deleted after it."""
    rbac = kubernetes.client.RbacAuthorizationV1Api(api_client)
    create = {
        "ClusterRole": rbac.create_cluster_role,
        "ClusterRoleBinding": rbac.create_cluster_role_binding,
        "Role": lambda body: rbac.create_namespaced_role(NAMESPACE, body),
        "RoleBinding": lambda body: rbac.create_namespaced_role_binding(NAMESPACE, body),
    }
    delete = {
        "ClusterRole": rbac.delete_cluster_role,
        "ClusterRoleBinding": rbac.delete_cluster_role_binding,
        "Role": lambda name: rbac.delete_namespaced_role(name, NAMESPACE),
        "RoleBinding": lambda name: rbac.delete_namespaced_role_binding(name, NAMESPACE),
    }
    assert sorted(d["kind"] for d in documents) == sorted(create)
    core_v1.create_namespaced_service_account(
        NAMESPACE, {"metadata": {"name": account, "namespace": NAMESPACE}}
    )
    try:
        for document in documents:
            create[document["kind"]](document)
        token = core_v1.create_namespaced_service_account_token(
            account, NAMESPACE, {"spec": {"expirationSeconds": 600}}
        ).status.token
        kubeconfig = yaml.safe_load(control_plane.kubeconfig_path.read_text())
        (user,) = kubeconfig["users"]
        user["user"] = {"token": token}
        path = tmp_path / f"{account}.kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig))
        yield path
    finally:
        for document in documents:
            with contextlib.suppress(ApiException):
                delete[document["kind"]](document["metadata"]["name"])
        core_v1.delete_namespaced_service_account(account, NAMESPACE)


@pytest.fixture
def gpuadm_account(
    api_client: kubernetes.client.ApiClient,
    core_v1: kubernetes.client.CoreV1Api,
    control_plane: ControlPlane,
    tmp_path: Path,
) -> Iterator[Path]:
    """A kubeconfig of gpuadm's ServiceAccount, bound to the ClusterRole and Role `gpuadm`
    as deploy/base ships them (the chart's are the same, tests/deploy)."""
    documents = [
        document
        for name in ("clusterrole", "clusterrolebinding", "role", "rolebinding")
        for document in yaml.safe_load_all((DEPLOY_BASE / f"{name}.yaml").read_text())
        if document and document["metadata"]["name"] == "gpuadm"
    ]
    yield from _account(api_client, core_v1, control_plane, tmp_path, "gpuadm", documents)


@pytest.fixture
def hook_account(
    api_client: kubernetes.client.ApiClient,
    core_v1: kubernetes.client.CoreV1Api,
    control_plane: ControlPlane,
    tmp_path: Path,
) -> Iterator[Path]:
    """A kubeconfig of the chart's uninstall Job's account, with the roles the chart renders
    for it."""
    rendered = subprocess.run(
        [
            str(helm_binary()),
            "template",
            "gpuadm",
            str(ROOT / "deploy" / "helm" / "gpuadm"),
            "--namespace",
            NAMESPACE,
            "--show-only",
            "templates/uninstall-hook.yaml",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    hook = [d for d in yaml.safe_load_all(rendered) if d]
    documents = [d for d in hook if d["kind"] not in ("ServiceAccount", "Job", "NetworkPolicy")]
    assert {d["metadata"]["name"] for d in hook if d["kind"] == "ServiceAccount"} == {
        "gpuadm-uninstall"
    }
    for document in documents:
        document["metadata"].pop("annotations", None)  # hook annotations mean nothing here
    yield from _account(api_client, core_v1, control_plane, tmp_path, "gpuadm-uninstall", documents)


@pytest.mark.usefixtures("restore_webhooks")
def test_the_charts_hook_account_may_uninstall(
    gpuadm: Deployment, namespace: str, hook_account: Path
) -> None:
    waiting_line(gpuadm, namespace)
    # The account is held to its roles: what they do not grant is refused.
    refused = uninstall(hook_account, "--gpuadm-namespace", "kube-system", "--dry-run")
    assert refused.returncode == 2
    assert "forbidden" in refused.stderr
    check_uninstalled(gpuadm, namespace, uninstall(hook_account))


@pytest.mark.usefixtures("restore_webhooks")
def test_the_servers_own_account_may_not_delete_the_webhooks(
    gpuadm: Deployment, namespace: str, gpuadm_account: Path
) -> None:
    """The long-running replicas hold no grant to switch gpuadm off."""
    waiting_line(gpuadm, namespace)
    refused = uninstall(gpuadm_account)
    assert refused.returncode == 2
    assert 'cannot delete resource "mutatingwebhookconfigurations"' in refused.stderr
    assert configurations(gpuadm.api) == {"mutating", "validating"}
    assert gates(gpuadm.core, namespace, "waiting") == [GATE]
