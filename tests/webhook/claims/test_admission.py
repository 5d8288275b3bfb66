"""DRA through the server: templates made before the answer, claims and templates judged.

The apiserver's side (what it stores, what the scheduler allocates) is proven in
tests/e2e/test_dra.py; here the keepers are in-memory stand-ins that record what they were
asked, so each decision's calls can be counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from policies.pods.dra_templates import ClaimTemplate
from tests.builders import POLICY_YAML, QUOTAS_YAML, pod, review
from tests.webhook.calls import Client, MakeClient, decoded_patch, post
from webhook.claims.templates import ClaimError
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.server.app import create_app
from webhook.server.settings import Settings

DRA_POLICY_YAML = (
    POLICY_YAML
    + """  h100-dra:
    backend: dra
    models: [NVIDIA H100 80GB HBM3]
"""
)
TRUSTED = "system:serviceaccount:gpuadm-system:gpuadm"
CONTROLLER = "system:kube-controller-manager"
GPU_SPEC = {
    "devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
}
NIC_SPEC = {
    "devices": {"requests": [{"name": "n", "exactly": {"deviceClassName": "nic.example.com"}}]}
}


class Templates:
    """Records each `ensure`; fails with `error` when one is set."""

    def __init__(self) -> None:
        self.ensured: list[tuple[str, list[str]]] = []
        self.error: ClaimError | None = None

    async def ensure(self, namespace: str, templates: Sequence[ClaimTemplate]) -> None:
        if self.error is not None:
            raise self.error
        self.ensured.append((namespace, [t.name for t in templates]))


class Claims:
    """Claims by name; `error` is raised instead when set."""

    def __init__(self) -> None:
        self.stored: dict[str, dict[str, Any]] = {}
        self.error: ClaimError | None = None

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.error is not None:
            raise self.error
        return self.stored.get(name)


@pytest.fixture
def templates() -> Templates:
    return Templates()


@pytest.fixture
def claims() -> Claims:
    return Claims()


@pytest.fixture
async def client(aiohttp_client: MakeClient, templates: Templates, claims: Claims) -> Client:
    snapshot = snapshot_from_text(
        DRA_POLICY_YAML, QUOTAS_YAML, policy_source="policy.yaml", quotas_source="quotas.yaml"
    )
    settings = Settings(trusted_user=TRUSTED)
    app = create_app(settings, ConfigHolder(snapshot), templates=templates, claims=claims)
    return await aiohttp_client(app)


def dry(body: dict[str, Any]) -> dict[str, Any]:
    body["request"]["dryRun"] = True
    return body


async def test_the_template_is_made_before_the_pod_is_answered(
    client: Client, templates: Templates
) -> None:
    response = await post(client, "/mutate", review(pod({"gpuadm.io/h100-dra": "2"})))
    assert response["allowed"] is True
    ops = {op["path"]: op["value"] for op in decoded_patch(response)}
    (entry,) = ops["/spec/resourceClaims"]
    assert entry["name"] == "gpuadm-c0"
    assert entry["resourceClaimTemplateName"].startswith("gpuadm-h100-dra-2-")
    assert ops["/spec/containers/0/resources"]["claims"] == [{"name": "gpuadm-c0"}]
    assert templates.ensured == [("team-x", [entry["resourceClaimTemplateName"]])]


async def test_a_dry_run_makes_no_template(client: Client, templates: Templates) -> None:
    response = await post(client, "/mutate", dry(review(pod({"gpuadm.io/h100-dra": "1"}))))
    assert response["allowed"] is True
    assert any(op["path"] == "/spec/resourceClaims" for op in decoded_patch(response))
    assert templates.ensured == []


async def test_a_pod_of_another_backend_makes_no_template(
    client: Client, templates: Templates
) -> None:
    response = await post(client, "/mutate", review(pod({"gpuadm.io/h100": "1"})))
    assert response["allowed"] is True
    assert templates.ensured == []


async def test_a_template_that_cannot_be_made_denies_the_pod_with_the_reason(
    client: Client, templates: Templates
) -> None:
    templates.error = ClaimError("could not make ResourceClaimTemplate x: 403: forbidden; retry")
    response = await post(client, "/mutate", review(pod({"gpuadm.io/h100-dra": "1"})))
    assert response["allowed"] is False
    assert response["status"]["message"] == templates.error.message


async def test_served_from_files_a_dra_pod_is_denied_not_left_waiting(
    aiohttp_client: MakeClient,
) -> None:
    snapshot = snapshot_from_text(
        DRA_POLICY_YAML, None, policy_source="policy.yaml", quotas_source="quotas.yaml"
    )
    client = await aiohttp_client(create_app(Settings(), ConfigHolder(snapshot)))
    response = await post(client, "/mutate", review(pod({"gpuadm.io/h100-dra": "1"})))
    assert response["allowed"] is False
    assert "gpuadm makes only when it runs in a cluster" in response["status"]["message"]


def object_review(
    kind: str, obj: dict[str, Any], *, user: str, operation: str = "CREATE", old: Any = None
) -> dict[str, Any]:
    body = review(obj, operation=operation, user=user, old=old)
    resource = {
        "ResourceClaim": "resourceclaims",
        "ResourceClaimTemplate": "resourceclaimtemplates",
    }
    body["request"]["kind"] = {"group": "resource.k8s.io", "version": "v1", "kind": kind}
    body["request"]["resource"] = {
        "group": "resource.k8s.io",
        "version": "v1",
        "resource": resource[kind],
    }
    return body


def template(spec: dict[str, Any], name: str = "mine", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {"spec": spec}}


def claim(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "c"}, "spec": spec}


@pytest.mark.parametrize(
    ("kind", "obj", "user", "operation", "refused"),
    [
        pytest.param(
            "ResourceClaimTemplate", template(GPU_SPEC), "alice", "CREATE", True, id="gpu-template"
        ),
        pytest.param(
            "ResourceClaimTemplate",
            template(GPU_SPEC),
            TRUSTED,
            "CREATE",
            False,
            id="gpuadm-template",
        ),
        pytest.param(
            "ResourceClaimTemplate", template(NIC_SPEC), "alice", "CREATE", False, id="nic-template"
        ),
        pytest.param(
            "ResourceClaimTemplate",
            template(NIC_SPEC, **{"app.kubernetes.io/managed-by": "gpuadm"}),
            "alice",
            "CREATE",
            True,
            id="template-with-gpuadm-label",
        ),
        pytest.param(
            "ResourceClaimTemplate",
            template(NIC_SPEC, name="gpuadm-h100-dra-1-0123456789"),
            "alice",
            "CREATE",
            True,
            id="template-with-gpuadm-name",
        ),
        pytest.param("ResourceClaim", claim(GPU_SPEC), "alice", "CREATE", True, id="gpu-claim"),
        pytest.param(
            "ResourceClaim", claim(GPU_SPEC), CONTROLLER, "CREATE", False, id="controller-claim"
        ),
        pytest.param("ResourceClaim", claim(NIC_SPEC), "alice", "CREATE", False, id="nic-claim"),
        pytest.param(
            "ResourceClaim", claim(GPU_SPEC), "alice", "UPDATE", False, id="claim-status-update"
        ),
        pytest.param(
            "ResourceClaimTemplate",
            template(GPU_SPEC),
            "alice",
            "DELETE",
            False,
            id="template-delete",
        ),
    ],
)
async def test_claims_and_templates_for_gpus_are_gpuadms_alone(
    client: Client, kind: str, obj: dict[str, Any], user: str, operation: str, refused: bool
) -> None:
    old = obj if operation == "UPDATE" else None
    body = object_review(kind, obj, user=user, operation=operation, old=old)
    response = await post(client, "/validate", body)
    assert response["allowed"] is not refused
    if refused:
        assert "gpuadm" in response["status"]["message"]


async def test_an_update_that_takes_gpuadms_label_off_its_template_is_refused(
    client: Client,
) -> None:
    ours = template(NIC_SPEC, name="t", **{"app.kubernetes.io/managed-by": "gpuadm"})
    body = object_review(
        "ResourceClaimTemplate",
        template(NIC_SPEC, name="t"),
        user="alice",
        operation="UPDATE",
        old=ours,
    )
    response = await post(client, "/validate", body)
    assert response["allowed"] is False
    assert "only gpuadm writes it" in response["status"]["message"]


async def test_in_an_exempt_namespace_claims_are_not_judged(client: Client) -> None:
    body = object_review("ResourceClaim", claim(GPU_SPEC), user="alice")
    body["request"]["namespace"] = "kube-system"
    assert (await post(client, "/validate", body))["allowed"] is True


NAMING = pod({"cpu": "1"}, resourceClaims=[{"name": "x", "resourceClaimName": "shared"}])


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        pytest.param({}, "which does not exist; create the claim first", id="missing"),
        pytest.param(
            {"shared": claim(GPU_SPEC)},
            "which holds devices of DeviceClass gpu.nvidia.com",
            id="gpu",
        ),
        pytest.param({"shared": claim(NIC_SPEC)}, None, id="nic"),
    ],
)
async def test_a_pod_may_name_a_claim_only_if_it_holds_no_gpus(
    client: Client, claims: Claims, stored: dict[str, dict[str, Any]], expected: str | None
) -> None:
    claims.stored = stored
    response = await post(client, "/validate", review(NAMING))
    assert response["allowed"] is (expected is None)
    if expected is not None:
        assert expected in response["status"]["message"]


async def test_a_claim_that_cannot_be_read_denies_the_pod_with_the_reason(
    client: Client, claims: Claims
) -> None:
    claims.error = ClaimError(
        "could not read ResourceClaim shared in namespace team-x: 0: timeout; retry"
    )
    response = await post(client, "/validate", review(NAMING))
    assert response["allowed"] is False
    assert response["status"]["message"] == claims.error.message
