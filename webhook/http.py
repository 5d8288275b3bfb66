"""The HTTP edge: checks a review's envelope, calls admission, and never leaks a stack trace.

- A body that is not an AdmissionReview gpuadm can judge is an HTTP 4xx whose body names
  what was wrong (413 too large, 415 not JSON, 400 malformed or not a pod review).
- A pod that breaks a rule is an HTTP 200 review with `allowed: false` (webhook.admission).
- Any other failure is logged here with its traceback and answered with a review that still
  carries the request's uid, so the apiserver shows the user a message instead of a 500.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from webhook import admission
from webhook.admission import Decision
from webhook.audit import audit_entry
from webhook.config import ConfigSnapshot, NoConfig
from webhook.keys import AUDIT, CONFIG, METRICS, QUOTA, READINESS, SETTINGS
from webhook.metrics import Metrics
from webhook.review import AdmissionRequest, BadReview, decode_review

log = logging.getLogger("gpuadm.http")

Decide = Callable[[web.Request, AdmissionRequest, ConfigSnapshot], Awaitable[Decision]]


async def _mutate(
    request: web.Request, review: AdmissionRequest, config: ConfigSnapshot
) -> Decision:
    return admission.mutate(review, config)


async def _validate(
    request: web.Request, review: AdmissionRequest, config: ConfigSnapshot
) -> Decision:
    app = request.app
    return await admission.validate(
        review, config, app[QUOTA], trusted_user=app[SETTINGS].trusted_user
    )


async def handle_mutate(request: web.Request) -> web.Response:
    """POST /mutate."""
    return await _serve_review(request, "mutate", _mutate)


async def handle_validate(request: web.Request) -> web.Response:
    """POST /validate."""
    return await _serve_review(request, "validate", _validate)


async def _serve_review(request: web.Request, endpoint: str, decide: Decide) -> web.Response:
    started = time.perf_counter()
    metrics = request.app[METRICS]
    try:
        body = await _read_review_body(request)
        review = decode_review(body)
    except BadReview as error:
        return _bad_request(metrics, endpoint, 400, error.reason)
    except web.HTTPException as error:
        return _bad_request(metrics, endpoint, error.status, error.text or error.reason)
    config = None
    try:
        config = request.app[CONFIG].current
        decision = await decide(request, review, config)
    except NoConfig as error:
        decision = Decision("error", f"{error}; retry")
    except Exception:
        incident = uuid.uuid4().hex[:12]
        log.exception("admission of %s failed (incident %s)", review.uid, incident)
        decision = Decision(
            "error", f"gpuadm failed to judge this request (incident {incident}); retry"
        )
    latency = time.perf_counter() - started
    metrics.answered(endpoint, review.operation, decision.outcome, latency)
    audit = request.app.get(AUDIT)
    if audit is not None:
        audit.write(
            audit_entry(
                endpoint=endpoint, request=review, decision=decision, config=config, latency=latency
            )
        )
    return _json(200, decision.review(review.uid))


async def _read_review_body(request: web.Request) -> bytes:
    limit = request.app[SETTINGS].max_review_bytes
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


def _bad_request(metrics: Metrics, endpoint: str, status: int, reason: str) -> web.Response:
    log.warning("refused a request to /%s with HTTP %d: %s", endpoint, status, reason)
    metrics.bad_requests.labels(endpoint, str(status)).inc()
    return _json(status, {"error": reason})


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
