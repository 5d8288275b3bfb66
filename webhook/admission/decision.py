"""A `Decision`: what admission decided about one request, and the review that answers it.

A decision is a plain value. Admission returns one for every request, whether a filter
answered it (`admission.filters`) or the core judged it; the edge turns it into the
AdmissionReview it sends back, and the audit record reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from policies import Plan
from policies.quota.judge import QuotaVerdict
from webhook.config.snapshot import Revisions
from webhook.reviews import responses

# queued: admitted behind gpuadm's scheduling gate, to wait in line for quota (queue mode).
Outcome = Literal["allowed", "mutated", "denied", "warned", "queued", "error"]
# A reason in auditAnnotations is for the apiserver's audit log, which keeps every request:
# 1 KiB holds any one denial message; the whole message is in gpuadm's own audit record.
AUDIT_VALUE_MAX = 1024


@dataclass(frozen=True, slots=True)
class Decision:
    """What was decided about one request: the outcome, why, and what it costs."""

    outcome: Outcome
    reason: str = ""
    warnings: tuple[str, ...] = ()
    plan: Plan | None = None
    patch: list[dict[str, Any]] = field(default_factory=list)
    quota: QuotaVerdict | None = None
    revisions: Revisions | None = None
    # `patch` already encoded as JSON, when it is the plan's own (the plan encodes it once).
    encoded_patch: bytes | None = field(default=None, repr=False, compare=False)

    def review(self, uid: str) -> dict[str, Any]:
        """Return the AdmissionReview that carries this decision to the apiserver."""
        audit = self.audit_annotations()
        if self.outcome == "error":
            return responses.errored(uid, self.reason)
        if self.outcome == "denied":
            return responses.denied(uid, self.reason, warnings=self.warnings, audit=audit)
        return responses.patched(
            uid, self.patch, warnings=self.warnings, audit=audit, encoded=self.encoded_patch
        )

    def audit_annotations(self) -> dict[str, str]:
        """Return what the apiserver's own audit log should record of this decision.

        The apiserver prefixes each key with the webhook's name, so keys hold no "/".
        """
        annotations: dict[str, str] = {"decision": self.outcome}
        if self.plan is not None and self.plan.class_name is not None:
            annotations["class"] = self.plan.class_name
            annotations["demand"] = self.plan.demand or ""
        if self.reason:
            annotations["reason"] = self.reason[:AUDIT_VALUE_MAX]
        return annotations
