"""Constructors of AdmissionReview responses: patched (or admitted unchanged), denied, errored.

The apiserver requires the response to echo the request's uid, apiVersion and kind. A
validating response must carry no patch; only `patched` adds one.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from webhook.reviews.request import API_VERSION

# The apiserver keeps about 4 KiB of warnings in all (4096 characters) and cuts the rest; a
# warning that is cut is worse than one shortened with a mark, so gpuadm stays under that
# with room for the "N more warnings" line.
WARNINGS_BUDGET = 4000
# No single warning may take the budget from the others: a quarter of it each.
ONE_WARNING_MAX = 1000


def patched(
    uid: str,
    patch: Sequence[Mapping[str, Any]],
    *,
    warnings: Sequence[str] = (),
    audit: Mapping[str, str] | None = None,
    encoded: bytes | None = None,
) -> dict[str, Any]:
    """Admit the object with a JSON patch; an empty patch is no patch at all.

    `encoded` is the patch already encoded as JSON, when the caller has it.
    """
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        text = encoded if encoded is not None else orjson.dumps(list(patch))
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(text).decode("ascii")
    return _review(response, warnings, audit)


def denied(
    uid: str,
    message: str,
    *,
    code: int = 403,
    reason: str = "Forbidden",
    warnings: Sequence[str] = (),
    audit: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Refuse the object; `message` is what the user sees after the apiserver's prefix."""
    status = {"code": code, "reason": reason, "message": message, "status": "Failure"}
    return _review({"uid": uid, "allowed": False, "status": status}, warnings, audit)


def errored(uid: str, message: str, *, code: int = 500) -> dict[str, Any]:
    """Refuse because gpuadm itself failed; the message says so and hides the internals."""
    return denied(uid, message, code=code, reason="InternalError")


def _review(
    response: dict[str, Any], warnings: Sequence[str], audit: Mapping[str, str] | None
) -> dict[str, Any]:
    if warnings:
        response["warnings"] = fit_warnings(warnings)
    if audit:
        response["auditAnnotations"] = dict(audit)
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def fit_warnings(warnings: Sequence[str]) -> list[str]:
    """Shorten warnings to what the apiserver passes on, marking what was cut."""
    fitted: list[str] = []
    used = 0
    for warning in warnings:
        text = warning if len(warning) <= ONE_WARNING_MAX else warning[: ONE_WARNING_MAX - 1] + "…"
        if used + len(text) > WARNINGS_BUDGET:
            fitted.append(f"{len(warnings) - len(fitted)} more warnings were left out")
            break
        fitted.append(text)
        used += len(text)
    return fitted
