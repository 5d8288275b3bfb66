"""The audit record of one admission decision: the same fields for every decision."""

from __future__ import annotations

from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from policies.quantity import format_amount
from webhook.admission.decision import Decision
from webhook.reviews.request import AdmissionRequest


def audit_entry(
    *,
    endpoint: str,
    request: AdmissionRequest,
    decision: Decision,
    latency: float,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Return the audit record of one decision, with the same fields for every decision."""
    plan = decision.plan
    quota = decision.quota
    return {
        "time": (now or datetime.now(UTC)).isoformat(timespec="milliseconds"),
        "endpoint": endpoint,
        "uid": request.uid,
        "operation": request.operation,
        "dryRun": request.dry_run,
        "namespace": request.namespace,
        "pod": request.pod_name,
        "user": request.user,
        "groups": request.groups,
        "class": plan.class_name if plan else None,
        "demand": plan.demand if plan else None,
        "decision": decision.outcome,
        "reason": decision.reason or None,
        "warnings": decision.warnings,
        "patch": [op["path"] for op in decision.patch],
        "quotaInUse": _amount(quota.in_use) if quota else None,
        "quotaLimit": _amount(quota.limit) if quota else None,
        "wouldDeny": quota.would_deny if quota else False,
        "policyRevision": decision.revisions.policy if decision.revisions else None,
        "quotasRevision": decision.revisions.quotas if decision.revisions else None,
        "latencyMs": round(latency * 1000, 3),
    }


def _amount(value: Fraction | None) -> str | None:
    return None if value is None else format_amount(value)
