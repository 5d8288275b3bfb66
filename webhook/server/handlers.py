"""The HTTP edge: checks a review's envelope, calls admission, and never leaks a stack trace.

- A body that is not a well-formed AdmissionReview is an HTTP 4xx whose body names what was
  wrong (413 too large, 415 not JSON, 400 malformed, naming the field and its value).
- A well-formed review of another kind than a Pod, a ResourceClaim or a ResourceClaimTemplate
  is not gpuadm's to judge: it is allowed, with no patch, here, without reaching admission.
- A pod that breaks a rule, or that is merely odd (a field of the wrong type), is an HTTP 200
  review with `allowed: false` (webhook.admission and the core).
- Any other failure is logged here with its traceback and answered with a review that still
  carries the request's uid, so the apiserver shows the user a message instead of a 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from certs import peer_certificate_verified
from webhook.admission.audit_record import audit_entry
from webhook.admission.decisions import Decision
from webhook.observe.audit_log import AuditLog
from webhook.observe.metrics import Metrics
from webhook.reviews.request import (
    LARGE_REVIEW_BYTES,
    AdmissionRequest,
    BadReview,
    decode_review,
)
from webhook.server.appkeys import METRICS, READINESS

log = logging.getLogger("gpuadm.http")

Decide = Callable[[AdmissionRequest], Awaitable[Decision]]
# Large reviews read, decoded and planned at once, per endpoint. Each holds its body (up to
# 7 MiB), its decoded pod (about ten times that) and its plan while it is served, so this
# bounds what a flood of them costs; the rest wait, unread, in their connections. Real
# pods this large are rare, and two at a time still serve them as fast as two cores allow.
MAX_LARGE_IN_FLIGHT = 2


class ReviewEndpoint:
    """POST /mutate or /validate: one admission decision per request, audited and counted."""

    def __init__(
        self,
        name: str,
        decide: Decide,
        *,
        metrics: Metrics,
        audit: AuditLog | None,
        max_review_bytes: int,
        require_client_certificate: bool = False,
    ) -> None:
        """Answer reviews with `decide`, labelled `name` in metrics and audit records.

        Bodies over `max_review_bytes` are refused with 413 before they are parsed. With
        `require_client_certificate`, a caller without a verified certificate gets 401.
        """
        self.name = name
        self.decide = decide
        self.metrics = metrics
        self.audit = audit
        self.max_review_bytes = max_review_bytes
        self.require_client_certificate = require_client_certificate
        self._large = asyncio.Semaphore(MAX_LARGE_IN_FLIGHT)

    async def handle(self, request: web.Request) -> web.Response:
        """Decode the review, decide, audit, and answer."""
        started = time.perf_counter()
        if self.require_client_certificate and not _caller_verified(request):
            return self._bad_request(
                401, "a client certificate signed by gpuadm's --client-ca-file is required"
            )
        # The apiserver always sends a Content-Length; a body without one may be any size.
        length = request.content_length
        if length is not None and length < LARGE_REVIEW_BYTES:
            return await self._serve(request, started)
        async with self._large:
            return await self._serve(request, started)

    async def _serve(self, request: web.Request, started: float) -> web.Response:
        try:
            review = decode_review(await self._read_body(request))
        except BadReview as error:
            return self._bad_request(400, error.reason)
        except web.HTTPException as error:
            return self._bad_request(error.status, error.text or error.reason)
        decision, answer = await self._answer(review)
        latency = time.perf_counter() - started
        self.metrics.answered(self.name, review.operation, decision.outcome, latency)
        if self.audit is not None:
            self.audit.write(
                audit_entry(endpoint=self.name, request=review, decision=decision, latency=latency)
            )
        return _json(200, answer)

    async def _answer(self, review: AdmissionRequest) -> tuple[Decision, dict[str, Any]]:
        """Decide, and write the review that answers; a failure of either keeps the uid."""
        try:
            decision = await self._decide(review)
            return decision, decision.review(review.uid)
        except Exception:
            incident = uuid.uuid4().hex[:12]
            log.exception("admission of %s failed (incident %s)", review.uid, incident)
            decision = Decision(
                "error", f"gpuadm failed to judge this request (incident {incident}); retry"
            )
            return decision, decision.review(review.uid)

    async def _decide(self, review: AdmissionRequest) -> Decision:
        if not review.is_judged:
            # The webhooks' rules send no other kind, so this is a misrouted or hand-made
            # review: well-formed, so not a 4xx, and nothing of gpuadm's to judge or rewrite.
            return Decision(
                "allowed",
                f"gpuadm judges Pods and DRA claims only; {review.kind} passes unchanged",
            )
        return await self.decide(review)

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.max_review_bytes
        if request.content_type != "application/json":
            raise web.HTTPUnsupportedMediaType(
                text=f"Content-Type must be application/json, got {request.content_type!r}"
            )
        if request.content_length is not None and request.content_length > limit:
            raise web.HTTPRequestEntityTooLarge(
                max_size=limit,
                actual_size=request.content_length,
                text=f"body of {request.content_length} bytes exceeds the {limit}-byte limit",
            )
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise web.HTTPRequestEntityTooLarge(
                max_size=limit, actual_size=limit + 1, text=f"body exceeds the {limit}-byte limit"
            ) from None

    def _bad_request(self, status: int, reason: str) -> web.Response:
        log.warning("refused a request to /%s with HTTP %d: %s", self.name, status, reason)
        self.metrics.bad_requests.labels(self.name, str(status)).inc()
        return _json(status, {"error": reason})


def _caller_verified(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and peer_certificate_verified(transport.get_extra_info("peercert"))


def _json(status: int, payload: object) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(payload), content_type="application/json")


async def handle_healthz(request: web.Request) -> web.Response:
    """GET /healthz: the process serves requests."""
    return web.Response(text="ok")


async def handle_readyz(request: web.Request) -> web.Response:
    """GET /readyz: config loaded and every background source in sync."""
    reasons = [reason for check in request.app[READINESS] if (reason := check()) is not None]
    if reasons:
        return web.Response(status=503, text="not ready: " + "; ".join(reasons))
    return web.Response(text="ok")


async def handle_metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text format."""
    body = request.app[METRICS].exposition()
    return web.Response(body=body, content_type="text/plain", charset="utf-8")
