"""Turn a decoded request into a decision, by calling the pure core and the quota gate.

Two error families meet here, each with its own channel: a pod that breaks a rule is a
`policies.Denial` and becomes `allowed: false` with the rule's message; a review that is not
a review was refused earlier, as an HTTP 400, by the edge in `webhook.http`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from policies import Denial, Plan, check_update, require_fixed_point
from webhook import response
from webhook.config import ConfigSnapshot
from webhook.quota import QuotaGate, QuotaOutcome
from webhook.review import AdmissionRequest

Outcome = Literal["allowed", "mutated", "denied", "warned", "error"]
# auditAnnotations: the apiserver prefixes each key with the webhook's name; a key may not
# contain "/" and is at most 63 characters. Values are kept short for the audit log.
AUDIT_VALUE_MAX = 1024


@dataclass(frozen=True, slots=True)
class Decision:
    """What was decided about one request: the outcome, why, and what it costs."""

    outcome: Outcome
    reason: str = ""
    warnings: tuple[str, ...] = ()
    plan: Plan | None = None
    patch: list[dict[str, Any]] = field(default_factory=list)
    quota: QuotaOutcome | None = None

    def review(self, uid: str) -> dict[str, Any]:
        """Return the AdmissionReview that carries this decision to the apiserver."""
        audit = self.audit_annotations()
        if self.outcome == "error":
            return response.errored(uid, self.reason)
        if self.outcome == "denied":
            return response.denied(uid, self.reason, warnings=self.warnings, audit=audit)
        return response.patched(uid, self.patch, warnings=self.warnings, audit=audit)

    def audit_annotations(self) -> dict[str, str]:
        """Return what the apiserver's own audit log should record of this decision."""
        annotations: dict[str, str] = {"decision": self.outcome}
        if self.plan is not None and self.plan.class_name is not None:
            annotations["class"] = self.plan.class_name
            annotations["demand"] = self.plan.demand or ""
        if self.reason:
            annotations["reason"] = self.reason[:AUDIT_VALUE_MAX]
        return annotations


ALLOWED = Decision("allowed")


def mutate(request: AdmissionRequest, config: ConfigSnapshot) -> Decision:
    """Rewrite a pod created with a GPU class into its backend's form."""
    if request.operation != "CREATE" or _exempt(request, config):
        return ALLOWED
    try:
        result = config.plan(request.object, request.namespace)
    except Denial as denial:
        return Decision("denied", denial.message)
    outcome: Outcome = "mutated" if result.patch else "allowed"
    return Decision(outcome, warnings=result.warnings, plan=result, patch=result.patch)


async def validate(
    request: AdmissionRequest, config: ConfigSnapshot, quota: QuotaGate, *, trusted_user: str
) -> Decision:
    """Judge a pod as it will be stored: its rewrite, its quota, and updates to gpuadm's keys."""
    if _exempt(request, config):
        return ALLOWED
    if request.operation == "UPDATE":
        return _validate_update(request, config, trusted_user=trusted_user)
    if request.operation != "CREATE":
        return ALLOWED
    try:
        result = require_fixed_point(config.plan(request.object, request.namespace))
    except Denial as denial:
        return Decision("denied", denial.message)
    if result.class_name is None:
        return Decision("allowed", plan=result)
    outcome = await quota.admit(request, result, config)
    warnings = (*result.warnings, *outcome.warnings)
    if not outcome.allowed:
        message = outcome.message or "GPU quota exceeded"
        return Decision("denied", message, warnings, plan=result, quota=outcome)
    kind: Outcome = "warned" if outcome.warnings else "allowed"
    return Decision(kind, outcome.message or "", warnings, plan=result, quota=outcome)


def _validate_update(
    request: AdmissionRequest, config: ConfigSnapshot, *, trusted_user: str
) -> Decision:
    if trusted_user and request.user == trusted_user:
        return ALLOWED
    assert request.old_object is not None  # decode_review guarantees it for UPDATE
    try:
        check_update(request.old_object, request.object, config.policy)
    except Denial as denial:
        return Decision("denied", denial.message)
    return ALLOWED


def _exempt(request: AdmissionRequest, config: ConfigSnapshot) -> bool:
    return request.namespace in config.policy.exempt_namespaces
