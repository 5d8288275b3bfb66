"""Turn a decoded request into a decision, by calling the pure core and the quota gate.

Two error families meet here, each with its own channel: a pod that breaks a rule is a
`policies.Denial` and becomes `allowed: false` with the rule's message; a review that is not
a review was refused earlier, as an HTTP 400, by the edge in `webhook.http`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from policies import Denial, Plan, check_final, check_update, plan
from webhook import response
from webhook.config import ConfigSnapshot
from webhook.quota import QuotaGate
from webhook.review import AdmissionRequest

Outcome = Literal["allowed", "mutated", "denied", "warned", "error"]


@dataclass(frozen=True, slots=True)
class Decision:
    """What was decided about one request, and the review that carries it to the apiserver."""

    review: dict[str, Any]
    outcome: Outcome
    reason: str = ""
    warnings: tuple[str, ...] = ()
    plan: Plan | None = None
    patch: list[dict[str, Any]] = field(default_factory=list)


def mutate(request: AdmissionRequest, config: ConfigSnapshot) -> Decision:
    """Rewrite a pod created with a GPU class into its backend's form."""
    if request.operation != "CREATE" or _exempt(request, config):
        return Decision(response.allowed(request.uid), "allowed")
    try:
        result = plan(
            request.object,
            config.policy,
            namespace_default_class=config.quotas.default_class_for(request.namespace),
        )
    except Denial as denial:
        return _denied(request, denial.message)
    warnings = result.warnings
    review = response.patched(request.uid, result.patch, warnings=warnings)
    outcome: Outcome = "mutated" if result.patch else "allowed"
    return Decision(review, outcome, warnings=warnings, plan=result, patch=result.patch)


async def validate(
    request: AdmissionRequest, config: ConfigSnapshot, quota: QuotaGate, *, trusted_user: str
) -> Decision:
    """Judge a pod as it will be stored: its rewrite, its quota, and updates to gpuadm's keys."""
    if _exempt(request, config):
        return Decision(response.allowed(request.uid), "allowed")
    if request.operation == "UPDATE":
        return _validate_update(request, config, trusted_user=trusted_user)
    if request.operation != "CREATE":
        return Decision(response.allowed(request.uid), "allowed")
    try:
        result = check_final(
            request.object,
            config.policy,
            namespace_default_class=config.quotas.default_class_for(request.namespace),
        )
    except Denial as denial:
        return _denied(request, denial.message)
    if result.class_name is None:
        return Decision(response.allowed(request.uid), "allowed", plan=result)
    outcome = await quota.admit(request, result, config)
    warnings = (*result.warnings, *outcome.warnings)
    if not outcome.allowed:
        message = outcome.message or "GPU quota exceeded"
        review = response.denied(request.uid, message, warnings=warnings)
        return Decision(review, "denied", message, warnings, plan=result)
    kind: Outcome = "warned" if outcome.warnings else "allowed"
    review = response.allowed(request.uid, warnings=warnings)
    return Decision(review, kind, outcome.message or "", warnings, plan=result)


def _validate_update(
    request: AdmissionRequest, config: ConfigSnapshot, *, trusted_user: str
) -> Decision:
    if trusted_user and request.user == trusted_user:
        return Decision(response.allowed(request.uid), "allowed")
    assert request.old_object is not None  # decode_review guarantees it for UPDATE
    try:
        check_update(request.old_object, request.object, config.policy)
    except Denial as denial:
        return _denied(request, denial.message)
    return Decision(response.allowed(request.uid), "allowed")


def _exempt(request: AdmissionRequest, config: ConfigSnapshot) -> bool:
    return request.namespace in config.policy.exempt_namespaces


def _denied(request: AdmissionRequest, message: str) -> Decision:
    return Decision(response.denied(request.uid, message), "denied", message)
