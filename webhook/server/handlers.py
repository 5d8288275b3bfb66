"""The HTTP edge: checks a review's envelope, calls admission, and never leaks a stack trace.

- A body that is not a well-formed AdmissionReview is an HTTP 4xx whose body names what was
  wrong (413 too large or too heavy to decode, 415 not JSON or compressed, 400 malformed,
  naming the field and its value). A body not received and let in within the request
  budget (server.budget) is a 503 asking to retry; a caller that hangs up gets nothing.
- Before its body is read, a request passes the edge's filters: the client certificate
  when one is required (401 without), then the headers (415 not JSON or compressed, 413
  announced too large). The first that refuses answers.
- A well-formed review of another kind than a Pod, a ResourceClaim or a ResourceClaimTemplate
  is not gpuadm's to judge: admission's first filter allows it, with no patch.
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
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from functools import partial
from typing import Any

import orjson
from aiohttp import web

from certs import peer_certificate_verified
from policies.pods.pod_shape import shown
from webhook.admission.audit_record import audit_entry
from webhook.admission.decision import Decision
from webhook.observe.audit_log import AuditLog
from webhook.observe.metrics import Metrics
from webhook.reviews.large_pods import off_loop_if_large
from webhook.reviews.request import (
    LARGE_REVIEW_BYTES,
    AdmissionRequest,
    BadReview,
    decode_review,
    decoded_weight,
)
from webhook.server.appkeys import METRICS, NOTICES, READINESS
from webhook.server.budget import ByteBudget, MiB, RequestBudget

log = logging.getLogger("gpuadm.http")

Decide = Callable[[AdmissionRequest], Awaitable[Decision]]
# Large reviews decoded and planned at once, per endpoint, once read and weighed: each is
# planned off the event loop, and two at a time serve them as fast as two cores allow.
MAX_LARGE_IN_FLIGHT = 2
# The encodings a body may come in: the apiserver sends reviews as they are. A compressed
# body is refused unread, so no caller can make a replica inflate a few KiB into gigabytes.
IDENTITY = frozenset({"", "identity"})


class Refusal(Exception):
    """A request refused before admission, with the HTTP status and the reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


# A filter of the edge, on the HTTP request before its body is read: a refusal, or None.
RequestFilter = Callable[[web.Request], Refusal | None]


def client_certificate(request: web.Request) -> Refusal | None:
    """Refuse a caller without a certificate signed by the client CA (the apiserver has one)."""
    transport = request.transport
    if transport is not None and peer_certificate_verified(transport.get_extra_info("peercert")):
        return None
    return Refusal(401, "a client certificate signed by gpuadm's --client-ca-file is required")


def json_content(request: web.Request) -> Refusal | None:
    """Refuse a body that does not say it is JSON."""
    if request.content_type == "application/json":
        return None
    return Refusal(415, f"Content-Type must be application/json, got {request.content_type!r}")


def uncompressed(request: web.Request) -> Refusal | None:
    """Refuse a compressed body unread."""
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding in IDENTITY:
        return None
    return Refusal(
        415,
        f"Content-Encoding {shown(encoding)} is not accepted: send the review "
        "uncompressed, as the apiserver does",
    )


def announced_within(request: web.Request, limit: int) -> Refusal | None:
    """Refuse a body whose announced length is over `limit` bytes, before reading it."""
    if request.content_length is None or request.content_length <= limit:
        return None
    return Refusal(413, f"body of {request.content_length} bytes exceeds the {limit}-byte limit")


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
        budget: RequestBudget | None = None,
        require_client_certificate: bool = False,
    ) -> None:
        """Answer reviews with `decide`, labelled `name` in metrics and audit records.

        Bodies over `max_review_bytes` are refused with 413 before they are read; every
        request is read and let in within `budget` (server.budget), shared by the endpoints
        of one replica. With `require_client_certificate`, a caller without a verified
        certificate gets 401.
        """
        self.name = name
        self.decide = decide
        self.metrics = metrics
        self.audit = audit
        self.max_review_bytes = max_review_bytes
        self.budget = budget if budget is not None else RequestBudget()
        self.filters: tuple[RequestFilter, ...] = (
            *((client_certificate,) if require_client_certificate else ()),
            json_content,
            uncompressed,
            partial(announced_within, limit=max_review_bytes),
        )
        self._large = asyncio.Semaphore(MAX_LARGE_IN_FLIGHT)

    async def handle(self, request: web.Request) -> web.Response:
        """Pass the filters, read the review within the budget, decode, decide, audit, and
        answer."""
        started = time.perf_counter()
        for step in self.filters:
            if (refusal := step(request)) is not None:
                return self._refuse(refusal.status, refusal.reason)
        try:
            async with AsyncExitStack() as held:
                try:
                    async with asyncio.timeout(self.budget.read_seconds):
                        body = await self._read_within_budget(request, held)
                except TimeoutError:
                    raise Refusal(
                        503,
                        f"the review was not received and let in within "
                        f"{self.budget.read_seconds:g} s (a slow sender, or a replica at its "
                        "limit); retry",
                    ) from None
                return await self._decode_and_answer(body, started)
        except Refusal as refusal:
            return self._refuse(refusal.status, refusal.reason)
        except ConnectionError:
            # The caller hung up: no one is left to answer, and nothing went wrong here.
            log.debug("the caller of /%s closed the connection before its answer", self.name)
            return web.Response(status=499)

    async def _read_within_budget(self, request: web.Request, held: AsyncExitStack) -> bytes:
        """Read the body, then take what decoding it costs from the budget, in `held`."""
        announced = request.content_length
        if announced is None or announced >= LARGE_REVIEW_BYTES:
            # Large, or of unknown size: its bytes count while they arrive, so stalled
            # senders hold at most this budget, and only until the deadline.
            async with self._hold(self.budget.large_reading, announced or self.max_review_bytes):
                body = await self._read_body(request)
        else:
            body = await self._read_body(request)
        large = len(body) >= LARGE_REVIEW_BYTES
        weight = decoded_weight(body)
        if weight > self.budget.decode_room(large):
            raise Refusal(
                413,
                f"the review would take up to {weight // MiB} MiB to decode, more than the "
                f"{self.budget.decode_room(large) // MiB} MiB a replica gives one review; "
                "a pod's JSON is never shaped like this",
            )
        if large:
            await held.enter_async_context(self._hold(self.budget.large_decoding, weight))
        await held.enter_async_context(self._hold(self.budget.decoding, weight))
        if large:
            await held.enter_async_context(self._large)
        return body

    def _hold(self, budget: ByteBudget, amount: int) -> AbstractAsyncContextManager[None]:
        return budget.hold(min(amount, budget.capacity))

    async def _decode_and_answer(self, body: bytes, started: float) -> web.Response:
        try:
            review = await off_loop_if_large(len(body), decode_review, body)
        except BadReview as error:
            raise Refusal(400, error.reason) from None
        del body  # the decoded review is what is held from here on
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
            decision = await self.decide(review)
            return decision, decision.review(review.uid)
        except Exception:
            incident = uuid.uuid4().hex[:12]
            log.exception("admission of %s failed (incident %s)", review.uid, incident)
            decision = Decision(
                "error", f"gpuadm failed to judge this request (incident {incident}); retry"
            )
            return decision, decision.review(review.uid)

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.max_review_bytes
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise Refusal(413, f"body exceeds the {limit}-byte limit") from None
        except web.HTTPException as error:
            # aiohttp's own refusal of a body it cannot take (a broken chunked encoding).
            raise Refusal(error.status, error.text or error.reason) from None

    def _refuse(self, status: int, reason: str) -> web.Response:
        log.warning("refused a request to /%s with HTTP %d: %s", self.name, status, reason)
        self.metrics.bad_requests.labels(self.name, str(status)).inc()
        return _json(status, {"error": reason})


def _json(status: int, payload: object) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(payload), content_type="application/json")


async def handle_healthz(request: web.Request) -> web.Response:
    """GET /healthz: the process serves requests."""
    return web.Response(text="ok")


async def handle_readyz(request: web.Request) -> web.Response:
    """GET /readyz: config loaded and every background source in sync; notices of what is
    degraded follow an `ok` without failing it."""
    reasons = [reason for check in request.app[READINESS] if (reason := check()) is not None]
    if reasons:
        return web.Response(status=503, text="not ready: " + "; ".join(reasons))
    notices = [notice for check in request.app[NOTICES] if (notice := check()) is not None]
    return web.Response(text="; ".join(["ok", *notices]))


async def handle_metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text format."""
    body = request.app[METRICS].exposition()
    return web.Response(body=body, content_type="text/plain", charset="utf-8")
