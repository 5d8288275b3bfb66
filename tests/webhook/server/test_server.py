"""The server through aiohttp's test client: real reviews in, answers the apiserver accepts."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import pytest

from policies import Plan
from policies.quota.judge import QuotaVerdict
from tests.apiserver_rules import violations
from tests.builders import POLICY_YAML, QUOTAS_YAML, pod, review
from tests.webhook.calls import Client, MakeClient, decoded_patch, post
from webhook.config.snapshot import ConfigHolder, ConfigSnapshot, snapshot_from_text
from webhook.quota.gate import Unlimited
from webhook.reviews.request import AdmissionRequest
from webhook.server.app import create_app
from webhook.server.settings import Settings


def snapshot() -> ConfigSnapshot:
    return snapshot_from_text(
        POLICY_YAML, QUOTAS_YAML, policy_source="policy.yaml", quotas_source="quotas.yaml"
    )


@pytest.fixture
async def client(aiohttp_client: MakeClient) -> Client:
    settings = Settings(max_review_bytes=64 * 1024, trusted_user="system:serviceaccount:gpuadm")
    return await aiohttp_client(create_app(settings, ConfigHolder(snapshot())))


async def test_mutate_rewrites_a_class_request(client: Client) -> None:
    body = pod({"gpuadm.io/a100": "0.5"})
    response = await post(client, "/mutate", review(body))
    assert response["allowed"] is True
    stored = jsonpatch.apply_patch(body, decoded_patch(response))
    assert violations(stored, "gpuadm.io") == []
    assert stored["spec"]["schedulerName"] == "hami-scheduler"
    assert stored["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == "50"

    validated = await post(client, "/validate", review(stored))
    assert validated["allowed"] is True
    assert "patch" not in validated
    assert "patchType" not in validated


async def test_mutate_of_its_own_output_returns_no_patch(client: Client) -> None:
    body = pod({"gpuadm.io/t4": "1"})
    first = await post(client, "/mutate", review(body))
    stored = jsonpatch.apply_patch(body, decoded_patch(first))
    second = await post(client, "/mutate", review(stored))
    assert second["allowed"] is True
    assert "patch" not in second


async def test_pod_without_gpus_is_allowed_without_patch(client: Client) -> None:
    response = await post(client, "/mutate", review(pod({"cpu": "1"})))
    assert response == {
        "uid": "0f1e2d3c",
        "allowed": True,
        "auditAnnotations": {"decision": "allowed"},
    }


async def test_rounding_is_announced_as_a_warning(client: Client) -> None:
    response = await post(client, "/mutate", review(pod({"gpuadm.io/t4": "0.333"})))
    assert any("rounded down to 0.33" in w for w in response["warnings"])


async def test_invalid_request_is_denied_with_the_rule(client: Client) -> None:
    response = await post(client, "/mutate", review(pod({"gpuadm.io/a100": "1.5"})))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert "gpuadm.io/a100: '1.5' is neither" in response["status"]["message"]


async def test_validate_sends_back_a_pod_that_skipped_mutation(client: Client) -> None:
    response = await post(client, "/validate", review(pod({"gpuadm.io/a100": "1"})))
    assert response["allowed"] is False
    assert "retry" in response["status"]["message"]


async def test_exempt_namespace_is_left_alone(client: Client) -> None:
    body = pod({"gpuadm.io/a100": "1.5"})
    for path in ("/mutate", "/validate"):
        response = await post(client, path, review(body, namespace="kube-system"))
        assert response["allowed"] is True
        assert "patch" not in response


async def test_namespace_default_class_comes_from_the_quota_config(client: Client) -> None:
    body = pod({"nvidia.com/gpu": "1"})
    response = await post(client, "/mutate", review(body, namespace="team-a"))
    stored = jsonpatch.apply_patch(body, decoded_patch(response))
    assert stored["metadata"]["labels"]["gpuadm.io/class"] == "a100"


async def test_update_removing_the_class_label_is_denied(client: Client) -> None:
    body = pod({"gpuadm.io/a100": "1"})
    stored = jsonpatch.apply_patch(body, decoded_patch(await post(client, "/mutate", review(body))))
    changed = json.loads(json.dumps(stored))
    del changed["metadata"]["labels"]["gpuadm.io/class"]
    response = await post(client, "/validate", review(changed, operation="UPDATE", old=stored))
    assert response["allowed"] is False
    assert "label gpuadm.io/class may be set by gpuadm only" in response["status"]["message"]

    trusted = review(changed, operation="UPDATE", old=stored, user="system:serviceaccount:gpuadm")
    assert (await post(client, "/validate", trusted))["allowed"] is True


async def test_update_and_delete_are_not_mutated(client: Client) -> None:
    body = pod({"gpuadm.io/a100": "1"})
    update = await post(client, "/mutate", review(body, operation="UPDATE", old=body))
    delete = await post(client, "/validate", review(None, operation="DELETE", old=body))
    for answer in (update, delete):
        assert answer["allowed"] is True
        assert "patch" not in answer


def _without(key: str) -> dict[str, Any]:
    body = review(pod({"cpu": "1"}))
    del body["request"][key]
    return body


@pytest.mark.parametrize(
    ("payload", "content_type", "status", "reason"),
    [
        pytest.param(
            b"{not json", "application/json", 400, "body is not valid JSON", id="malformed"
        ),
        pytest.param(b"[1, 2]", "application/json", 400, "body is not a JSON object", id="array"),
        pytest.param(
            b'{"kind": "Pod", "apiVersion": "v1"}',
            "application/json",
            400,
            "expected kind AdmissionReview",
            id="not-a-review",
        ),
        pytest.param(
            json.dumps({**review(pod({})), "apiVersion": "admission.k8s.io/v1beta1"}),
            "application/json",
            400,
            "apiVersion admission.k8s.io/v1",
            id="old-version",
        ),
        pytest.param(
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
            "application/json",
            400,
            "has no request object",
            id="no-request",
        ),
        pytest.param(
            json.dumps(_without("uid")),
            "application/json",
            400,
            "request.uid is missing",
            id="no-uid",
        ),
        pytest.param(
            json.dumps(_without("object")),
            "application/json",
            400,
            "request.object is missing, which every CREATE review carries",
            id="create-without-object",
        ),
        pytest.param(
            json.dumps(review(pod({})) | {"request": "x"}),
            "application/json",
            400,
            "request: 'x' is not an object",
            id="request-is-a-string",
        ),
        pytest.param(
            json.dumps(review(pod({}), operation="PATCH")),
            "application/json",
            400,
            "request.operation: 'PATCH'",
            id="unknown-operation",
        ),
        pytest.param(
            b"{}",
            "text/plain",
            415,
            "Content-Type must be application/json",
            id="wrong-content-type",
        ),
        pytest.param(
            b"{" + b" " * (70 * 1024) + b"}",
            "application/json",
            413,
            "exceeds the 65536-byte limit",
            id="huge-body",
        ),
    ],
)
async def test_bad_reviews_get_a_4xx_with_the_reason(
    client: Client, payload: bytes | str, content_type: str, status: int, reason: str
) -> None:
    response = await client.post("/validate", data=payload, headers={"Content-Type": content_type})
    assert response.status == status
    assert reason in (await response.json())["error"]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("kind", "named"),
    [
        pytest.param({"group": "apps", "version": "v1", "kind": "Deployment"}, "Deployment.apps"),
        pytest.param({"group": "", "version": "v1", "kind": "Secret"}, "Secret"),
        pytest.param({"group": "example.com", "version": "v1", "kind": "Pod"}, "Pod.example.com"),
    ],
)
async def test_a_review_of_another_kind_is_allowed_without_patch(
    client: Client, path: str, kind: dict[str, str], named: str
) -> None:
    # The object is a GPU pod in all but its kind: gpuadm must not judge or rewrite it.
    body = review(pod({"gpuadm.io/a100": "1.5"}), uid="other-kind")
    body["request"]["kind"] = kind
    response = await post(client, path, body)
    assert response == {
        "uid": "other-kind",
        "allowed": True,
        "auditAnnotations": {
            "decision": "allowed",
            "reason": (
                f"gpuadm judges Pods, DRA claims and ConfigMaps only; {named} passes unchanged"
            ),
        },
    }


def _odd(*path: str | int, value: object, limits: dict[str, Any] | None = None) -> dict[str, Any]:
    """Return a review of a GPU pod with `value` put at `path` in the pod."""
    body = pod(limits or {"gpuadm.io/a100": "1"})
    *parents, last = path
    target: Any = body
    for step in parents:
        target = target[step]
    target[last] = value
    return review(body, uid="odd-1")


def _nested(depth: int) -> Any:
    value: Any = "1"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            _odd("metadata", "annotations", value=["gpuadm.io/class=a100"]),
            "metadata.annotations: ['gpuadm.io/class=a100'] is not an object of strings",
            id="annotations-as-a-list",
        ),
        pytest.param(
            _odd("spec", "containers", 0, "resources", "claims", value=_nested(255)),
            f'container "main": resources.claims[0]: {"[" * 59}… is not a claim (an object '
            "with a name)",
            id="resources-nested-255-deep",
        ),
        pytest.param(
            _odd(
                "spec", "containers", 0, "resources", "limits", value={"gpuadm.io/a100": "9" * 4400}
            ),
            "container \"main\": gpuadm.io/a100: '99999999999999999999'… (4400 characters) is not "
            "a quantity: a quantity is a number with an optional suffix such as 500m, 2, 10Gi or "
            "1e3, in at most 64 characters",
            id="quantity-of-4400-digits",
        ),
        pytest.param(
            _odd(
                "spec",
                "affinity",
                value={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [None]
                        }
                    }
                },
            ),
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution."
            "nodeSelectorTerms[0]: null is not a node selector term (an object with "
            "matchExpressions)",
            id="node-selector-terms-null",
        ),
    ],
)
async def test_an_odd_pod_is_denied_cleanly(
    client: Client,
    caplog: pytest.LogCaptureFixture,
    path: str,
    body: dict[str, Any],
    message: str,
) -> None:
    response = await post(client, path, body)
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 403,
        "reason": "Forbidden",
        "message": message,
        "status": "Failure",
    }
    assert not [record for record in caplog.records if record.exc_info]


async def test_a_review_whose_user_info_is_a_string_is_a_400(client: Client) -> None:
    body = review(pod({"gpuadm.io/a100": "1"}))
    body["request"]["userInfo"] = "x"
    response = await client.post("/mutate", json=body)
    assert response.status == 400
    assert await response.json() == {"error": "request.userInfo: 'x' is not an object"}


async def test_huge_body_without_content_length_is_refused(client: Client) -> None:
    async def chunks() -> Any:
        for _ in range(100):
            yield b" " * 1024

    response = await client.post(
        "/mutate", data=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status == 413
    assert "exceeds the 65536-byte limit" in (await response.json())["error"]


async def test_an_internal_failure_still_answers_with_the_uid(
    aiohttp_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenQuota(Unlimited):
        async def admit(
            self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
        ) -> QuotaVerdict | None:
            raise RuntimeError("ledger exploded: secret internals")

    app = create_app(Settings(), ConfigHolder(snapshot()), quota=BrokenQuota())
    client = await aiohttp_client(app)
    body = pod({"gpuadm.io/h100": "1"})
    stored = jsonpatch.apply_patch(body, decoded_patch(await post(client, "/mutate", review(body))))
    response = await post(client, "/validate", review(stored, uid="abc-123"))
    assert response["uid"] == "abc-123"
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert "retry" in response["status"]["message"]
    assert "secret internals" not in response["status"]["message"]
    assert "ledger exploded" in caplog.text


async def test_quota_denial_and_warnings_reach_the_response(aiohttp_client: MakeClient) -> None:
    class FullQuota(Unlimited):
        async def admit(
            self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
        ) -> QuotaVerdict | None:
            return QuotaVerdict(False, f'namespace "{request.namespace}": {plan.demand} over')

    client = await aiohttp_client(
        create_app(Settings(), ConfigHolder(snapshot()), quota=FullQuota())
    )
    body = pod({"gpuadm.io/h100": "2"})
    stored = jsonpatch.apply_patch(body, decoded_patch(await post(client, "/mutate", review(body))))
    response = await post(client, "/validate", review(stored))
    assert response["allowed"] is False
    assert response["status"]["message"] == 'namespace "team-x": h100=2 over'


async def test_health_and_readiness(client: Client) -> None:
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200


async def test_readiness_reports_what_is_not_ready(aiohttp_client: MakeClient) -> None:
    app = create_app(
        Settings(), ConfigHolder(snapshot()), readiness=[lambda: "pod watch not synced"]
    )
    response = await (await aiohttp_client(app)).get("/readyz")
    assert response.status == 503
    assert "pod watch not synced" in await response.text()


async def test_audit_annotations_carry_decision_class_demand_and_reason(client: Client) -> None:
    mutated = await post(client, "/mutate", review(pod({"gpuadm.io/a100": "0.5"})))
    assert mutated["auditAnnotations"] == {
        "decision": "mutated",
        "class": "a100",
        "demand": "a100=0.5",
    }
    denied = await post(client, "/mutate", review(pod({"gpuadm.io/a100": "2.5"})))
    annotations = denied["auditAnnotations"]
    assert annotations["decision"] == "denied"
    assert "'2.5' is neither a whole number" in annotations["reason"]
    for key in (*mutated["auditAnnotations"], *annotations):
        assert "/" not in key
        assert len(key) <= 63
