"""Before any valid quota config, GPU pods are refused with the reason, never admitted unlimited.

These tests call the decisions directly, as the server binds them, without HTTP.
"""

from __future__ import annotations

from typing import Any

import jsonpatch
import orjson
import pytest

from tests.builders import POLICY_YAML, QUOTAS_YAML, pod, review
from webhook.admission import decisions
from webhook.admission.decision import Decision
from webhook.claims.lookup import NoClaims
from webhook.claims.templates import NoTemplates
from webhook.config.snapshot import ConfigHolder, Missing, PartText
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest, decode_review

POLICY = PartText(POLICY_YAML, "policy.yaml")
GONE = PartText(Missing("ConfigMap gpuadm-system/gpuadm-quotas not found"), "q")


def request(body: dict[str, Any], namespace: str) -> AdmissionRequest:
    return decode_review(orjson.dumps(review(body, namespace=namespace)))


async def judged(holder: ConfigHolder, body: dict[str, Any], namespace: str) -> Decision:
    """Mutate as the apiserver would, then validate the pod as stored."""
    ledger = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False)
    mutated = await decisions.mutate(
        request(body, namespace), config=holder, templates=NoTemplates(), quota=ledger
    )
    assert mutated.outcome in ("allowed", "mutated"), mutated
    stored = jsonpatch.apply_patch(body, mutated.patch)
    return await decisions.validate(
        request(stored, namespace),
        config=holder,
        quota=ledger,
        claims=NoClaims(),
        trusted=decisions.Trusted("system:serviceaccount:gpuadm-system:gpuadm"),
    )


@pytest.mark.parametrize(
    ("limits", "namespace", "outcome"),
    [
        pytest.param({"gpuadm.io/a100": "0.5"}, "team-a", "denied", id="gpu-pod-refused"),
        pytest.param({"nvidia.com/gpu": "1"}, "team-x", "denied", id="untyped-gpu-pod-refused"),
        pytest.param({}, "team-a", "allowed", id="cpu-pod-admitted"),
        pytest.param({"gpuadm.io/a100": "1"}, "kube-system", "allowed", id="exempt-namespace"),
    ],
)
async def test_without_quotas_gpu_pods_are_refused_and_others_admitted(
    limits: dict[str, str], namespace: str, outcome: str
) -> None:
    holder = ConfigHolder()
    holder.update(POLICY, GONE)
    decision = await judged(holder, pod(limits), namespace)
    assert decision.outcome == outcome, decision
    if outcome == "denied":
        assert decision.reason == (
            "gpuadm has no valid GPU quota config (ConfigMap gpuadm-system/gpuadm-quotas not "
            "found), so it admits no GPU pods in this namespace until an admin fixes it; "
            "retry then"
        )


async def test_once_the_quotas_are_valid_the_same_pod_is_judged_by_them() -> None:
    holder = ConfigHolder()
    holder.update(POLICY, GONE)
    holder.update(POLICY, PartText(QUOTAS_YAML, "quotas.yaml"))
    decision = await judged(holder, pod({"gpuadm.io/a100": "0.5"}), "team-a")
    assert decision.outcome == "allowed", decision
