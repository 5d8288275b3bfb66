"""Decode an AdmissionReview (`admission.k8s.io/v1`) into a typed request.

Anything wrong with the review itself (not JSON, not a review, not a pod, no uid) raises
`BadReview`, which the HTTP edge turns into a 400 with the reason. What is wrong with the pod
is not decided here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

import orjson

API_VERSION = "admission.k8s.io/v1"
# Reviews from this size up are large: a typical pod's review is 4 to 10 KiB and is planned
# in well under a millisecond, while at 64 KiB (a hundred containers or more) planning takes
# milliseconds. Large reviews are read a few at a time and planned off the event loop.
LARGE_REVIEW_BYTES = 64 * 1024
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class BadReview(ValueError):
    """The body is not an AdmissionReview gpuadm can judge; the message says why."""

    def __init__(self, reason: str, uid: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.uid = uid


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """The parts of an AdmissionReview request gpuadm uses."""

    uid: str
    operation: Operation
    namespace: str
    name: str
    object: dict[str, Any]
    old_object: dict[str, Any] | None
    dry_run: bool
    user: str
    groups: tuple[str, ...]
    # Bytes of the review as received: a large pod is planned off the event loop.
    size: int = 0

    @property
    def pod_name(self) -> str:
        """Return the pod's name, or its generateName prefix on a CREATE that has none yet."""
        metadata = self.object.get("metadata") or {}
        return str(self.name or metadata.get("name") or metadata.get("generateName") or "")


def decode_review(body: bytes) -> AdmissionRequest:
    """Parse the body of a POST from the apiserver, or raise `BadReview`."""
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadReview(f"body is not valid JSON: {error}") from None
    if not isinstance(review, dict):
        raise BadReview("body is not a JSON object")
    if review.get("kind") != "AdmissionReview" or review.get("apiVersion") != API_VERSION:
        raise BadReview(
            f"expected kind AdmissionReview, apiVersion {API_VERSION}; got kind "
            f"{review.get('kind')!r}, apiVersion {review.get('apiVersion')!r}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid is missing")
    return _request(request, uid, len(body))


def _request(request: dict[str, Any], uid: str, size: int) -> AdmissionRequest:
    kind = request.get("kind") or {}
    if not isinstance(kind, dict) or (kind.get("group"), kind.get("kind")) != ("", "Pod"):
        raise BadReview(f"gpuadm admits core/v1 Pods only, got {kind!r}", uid)
    operation = request.get("operation")
    if operation not in _OPERATIONS:
        raise BadReview(f"request.operation {operation!r} is not one of {_OPERATIONS}", uid)
    obj = request.get("object")
    old = request.get("oldObject")
    if operation in ("CREATE", "UPDATE") and not isinstance(obj, dict):
        raise BadReview(f"a {operation} review must carry the pod in request.object", uid)
    if operation == "UPDATE" and not isinstance(old, dict):
        raise BadReview("an UPDATE review must carry the old pod in request.oldObject", uid)
    user_info = request.get("userInfo") or {}
    groups = user_info.get("groups") or ()
    return AdmissionRequest(
        uid=uid,
        operation=cast(Operation, operation),
        namespace=str(request.get("namespace") or ""),
        name=str(request.get("name") or ""),
        object=obj if isinstance(obj, dict) else {},
        old_object=old if isinstance(old, dict) else None,
        dry_run=request.get("dryRun") is True,
        user=str(user_info.get("username") or ""),
        groups=tuple(str(g) for g in groups) if isinstance(groups, list) else (),
        size=size,
    )
