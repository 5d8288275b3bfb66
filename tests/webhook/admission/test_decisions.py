"""`mutate` and `validate` called directly with an `AdmissionRequest`, without HTTP.

Each path a request can take through admission: the filters that answer before any
judgement (another kind, an exempt namespace, an operation left alone), the class rewrite,
the checks on an UPDATE, the quota's denial, and a dry run that stores nothing.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

import jsonpatch
import orjson
import pytest

from policies.pods.dra_templates import ClaimTemplate
from tests.builders import POLICY_YAML, QUOTAS_YAML, pod, review
from webhook.admission import decisions
from webhook.admission.decision import Decision
from webhook.claims.lookup import NoClaims
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.quota.gate import QuotaGate, Unlimited
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest, Operation, decode_review

TRUSTED = "system:serviceaccount:gpuadm-system:gpuadm"
DRA_POLICY_YAML = (
    POLICY_YAML + "  h100-dra:\n    backend: dra\n    models: [NVIDIA H100 80GB HBM3]\n"
)
OTHER_KIND = "gpuadm judges Pods, DRA claims and ConfigMaps only; Deployment.apps passes unchanged"


class Templates:
    """Records the templates each `ensure` was asked for."""

    def __init__(self) -> None:
        self.ensured: list[tuple[str, list[str]]] = []

    async def ensure(self, namespace: str, templates: Sequence[ClaimTemplate]) -> None:
        self.ensured.append((namespace, [template.name for template in templates]))


def holder(policy: str = POLICY_YAML) -> ConfigHolder:
    return ConfigHolder(
        snapshot_from_text(policy, QUOTAS_YAML, policy_source="p", quotas_source="q")
    )


def request(
    obj: dict[str, Any] | None, *, kind: str = "Pod", dry_run: bool = False, **fields: Any
) -> AdmissionRequest:
    """The request of a review built as the apiserver sends it (`tests.builders.review`)."""
    decoded = decode_review(orjson.dumps(review(obj, uid="uid-1", **fields)))
    return dataclasses.replace(decoded, kind=kind, dry_run=dry_run)


async def mutate(
    config: ConfigHolder,
    req: AdmissionRequest,
    *,
    quota: QuotaGate | None = None,
    templates: Templates | None = None,
) -> Decision:
    return await decisions.mutate(
        req,
        config=config,
        templates=templates or Templates(),
        quota=quota if quota is not None else Unlimited(),
    )


async def validate(
    config: ConfigHolder, req: AdmissionRequest, *, quota: QuotaGate | None = None
) -> Decision:
    return await decisions.validate(
        req,
        config=config,
        quota=quota if quota is not None else Unlimited(),
        claims=NoClaims(),
        trusted=decisions.Trusted(TRUSTED),
    )


async def stored(config: ConfigHolder, body: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The pod as the apiserver stores it after /mutate."""
    decision = await mutate(config, request(body, **fields))
    assert decision.outcome in ("allowed", "mutated"), decision
    return dict(jsonpatch.apply_patch(body, decision.patch))


async def test_a_class_request_is_rewritten_and_its_rewrite_is_allowed_as_stored() -> None:
    config = holder()
    body = pod({"gpuadm.io/a100": "0.5"})
    decision = await mutate(config, request(body))
    assert decision.outcome == "mutated"
    assert decision.plan is not None
    assert decision.plan.class_name == "a100"
    assert decision.revisions == config.current.revisions
    pod_as_stored = jsonpatch.apply_patch(body, decision.patch)
    assert pod_as_stored["spec"]["schedulerName"] == "hami-scheduler"
    limits = pod_as_stored["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpucores"] == "50"
    # The review carries the same patch as the decision, encoded once by the plan.
    response = decision.review("uid-1")["response"]
    assert orjson.loads(base64.b64decode(response["patch"])) == decision.patch
    assert response["auditAnnotations"]["class"] == "a100"

    validated = await validate(config, request(pod_as_stored))
    assert validated.outcome == "allowed"
    assert "patch" not in validated.review("uid-2")["response"]


async def test_a_pod_without_gpus_is_allowed_without_patch() -> None:
    decision = await mutate(holder(), request(pod({"cpu": "1"})))
    assert decision.outcome == "allowed"
    assert decision.patch == []
    assert decision.review("uid-1")["response"] == {
        "uid": "uid-1",
        "allowed": True,
        "auditAnnotations": {"decision": "allowed"},
    }


async def test_a_rule_broken_is_a_denial_with_the_rule() -> None:
    decision = await mutate(holder(), request(pod({"gpuadm.io/a100": "1.5"})))
    assert decision.outcome == "denied"
    assert "gpuadm.io/a100: '1.5' is neither" in decision.reason


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
async def test_an_exempt_namespace_is_left_alone(operation: Operation) -> None:
    config = holder()
    body = pod({"gpuadm.io/a100": "1.5"})
    old = body if operation == "UPDATE" else None
    req = request(body, operation=operation, namespace="kube-system", old=old)
    for decision in (await mutate(config, req), await validate(config, req)):
        assert decision == Decision("allowed", revisions=config.current.revisions)


async def test_another_kind_passes_unchanged_even_before_any_config_is_loaded() -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {}}
    for config in (holder(), ConfigHolder()):
        req = request(deployment, kind="Deployment.apps")
        for decision in (await mutate(config, req), await validate(config, req)):
            assert decision == Decision("allowed", OTHER_KIND)


async def test_a_pod_before_any_config_is_loaded_is_an_error_to_retry() -> None:
    decision = await mutate(ConfigHolder(), request(pod({"gpuadm.io/a100": "1"})))
    assert decision.outcome == "error"
    assert decision.reason.endswith("; retry")


async def test_only_creations_are_rewritten_and_deletions_are_not_judged() -> None:
    config = holder()
    body = pod({"gpuadm.io/a100": "1.5"})
    allowed = Decision("allowed", revisions=config.current.revisions)
    assert await mutate(config, request(body, operation="UPDATE", old=body)) == allowed
    assert await validate(config, request(None, operation="DELETE", old=body)) == allowed


async def test_a_pod_that_skipped_mutation_is_sent_back() -> None:
    decision = await validate(holder(), request(pod({"gpuadm.io/a100": "1"})))
    assert decision.outcome == "denied"
    assert "retry" in decision.reason


async def test_an_update_of_gpuadms_label_is_denied_to_all_but_gpuadm() -> None:
    config = holder()
    old = await stored(config, pod({"gpuadm.io/a100": "1"}))
    changed = copy.deepcopy(old)
    del changed["metadata"]["labels"]["gpuadm.io/class"]
    denied = await validate(config, request(changed, operation="UPDATE", old=old))
    assert denied.outcome == "denied"
    assert "label gpuadm.io/class may be set by gpuadm only" in denied.reason

    by_gpuadm = request(changed, operation="UPDATE", old=old, user=TRUSTED)
    assert (await validate(config, by_gpuadm)).outcome == "allowed"


async def test_an_update_that_keeps_the_pod_as_stored_is_allowed() -> None:
    config = holder()
    old = await stored(config, pod({"gpuadm.io/a100": "1"}))
    changed = copy.deepcopy(old)
    changed["metadata"]["labels"]["app"] = "web"
    decision = await validate(config, request(changed, operation="UPDATE", old=old))
    assert decision.outcome == "allowed"


async def test_a_pod_over_its_namespaces_quota_is_denied_with_the_numbers() -> None:
    config = holder()
    ledger = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False)
    # team-a may hold 4 A100s.
    first = await stored(config, pod({"gpuadm.io/a100": "2"}), namespace="team-a")
    first["metadata"].update(name="first", uid="uid-first")
    fits = await validate(config, request(first, namespace="team-a"), quota=ledger)
    assert fits.outcome == "allowed"

    second = await stored(config, pod({"gpuadm.io/a100": "3"}), namespace="team-a")
    second["metadata"].update(name="second", uid="uid-second")
    over = await validate(config, request(second, namespace="team-a"), quota=ledger)
    assert over.outcome == "denied"
    assert over.quota is not None
    assert not over.quota.allowed
    assert over.reason == over.quota.message
    assert 'namespace "team-a": a100 quota exceeded' in over.reason
    assert over.review("uid-2")["response"]["status"]["code"] == 403


async def test_a_dry_run_is_judged_but_reserves_nothing() -> None:
    config = holder()
    store = MemoryStore()
    ledger = QuotaLedger(UsageIndex(), store, pods_visible=False)
    body = await stored(config, pod({"gpuadm.io/a100": "2"}), namespace="team-a")
    body["metadata"].update(name="dry", uid="uid-dry")
    dry = await validate(config, request(body, namespace="team-a", dry_run=True), quota=ledger)
    assert dry.outcome == "allowed"
    assert store.writes == 0

    # Had the dry run taken 2 of team-a's 4 A100s, this pod would not fit.
    real = await stored(config, pod({"gpuadm.io/a100": "4"}), namespace="team-a")
    real["metadata"].update(name="real", uid="uid-real")
    admitted = await validate(config, request(real, namespace="team-a"), quota=ledger)
    assert admitted.outcome == "warned"
    assert store.writes == 1


async def test_a_dry_run_makes_no_claim_template_but_is_rewritten_alike() -> None:
    config = holder(DRA_POLICY_YAML)
    templates = Templates()
    body = pod({"gpuadm.io/h100-dra": "1"})
    dry = await mutate(config, request(body, dry_run=True), templates=templates)
    assert templates.ensured == []
    real = await mutate(config, request(body), templates=templates)
    assert dry.patch == real.patch
    assert any(op["path"] == "/spec/resourceClaims" for op in dry.patch)
    assert len(templates.ensured) == 1
