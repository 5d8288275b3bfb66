"""Decode an AdmissionReview (`admission.k8s.io/v1`) into a typed request.

Anything wrong with the review itself (not JSON, not a review, no uid, a request field of the
wrong type) raises `BadReview`, which the HTTP edge turns into a 400 with the reason. A
well-formed review of another kind than those gpuadm judges (`JUDGED_KINDS`) is decoded like
any other, and is not gpuadm's to judge. What is wrong with the pod is not decided here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

import orjson

from policies.pods.pod_shape import shown

API_VERSION = "admission.k8s.io/v1"
# Reviews from this size up are large: a typical pod's review is 4 to 10 KiB and is planned
# in well under a millisecond, while at 64 KiB (a hundred containers or more) planning takes
# milliseconds. Large reviews are read a few at a time and planned off the event loop.
LARGE_REVIEW_BYTES = 64 * 1024
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
POD = "Pod"
# The DRA objects gpuadm judges, as `AdmissionRequest.kind` names them.
CLAIM = "ResourceClaim.resource.k8s.io"
CLAIM_TEMPLATE = "ResourceClaimTemplate.resource.k8s.io"
# The ConfigMaps through which KAI's binder hands a share its GPUs are judged by name.
CONFIG_MAP = "ConfigMap"
JUDGED_KINDS = (POD, CLAIM, CLAIM_TEMPLATE, CONFIG_MAP)
# The JSON type of each request field the apiserver sends; null stands for an absent field.
_REQUEST_FIELDS: dict[str, tuple[type, str]] = {
    "kind": (dict, "an object"),
    "resource": (dict, "an object"),
    "subResource": (str, "a string"),
    "requestKind": (dict, "an object"),
    "requestResource": (dict, "an object"),
    "requestSubResource": (str, "a string"),
    "name": (str, "a string"),
    "namespace": (str, "a string"),
    "operation": (str, "a string"),
    "userInfo": (dict, "an object"),
    "object": (dict, "an object"),
    "oldObject": (dict, "an object"),
    "dryRun": (bool, "true or false"),
    "options": (dict, "an object"),
}
# The string members of the request's objects: the kinds and resources, and the user.
_MEMBERS = {
    "kind": ("group", "version", "kind"),
    "requestKind": ("group", "version", "kind"),
    "resource": ("group", "version", "resource"),
    "requestResource": ("group", "version", "resource"),
    "userInfo": ("username", "uid"),
}


class BadReview(ValueError):
    """The body is not an AdmissionReview gpuadm can judge; the message says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
    # The object's kind as kubectl names it: "Pod", or e.g. "Deployment.apps".
    kind: str = POD

    @property
    def is_pod(self) -> bool:
        """Tell whether the review is of a core/v1 Pod."""
        return self.kind == POD

    @property
    def is_judged(self) -> bool:
        """Tell whether the review is of a kind gpuadm judges: pods, DRA claims and
        templates, and ConfigMaps."""
        return self.kind in JUDGED_KINDS

    @property
    def pod_name(self) -> str:
        """Return the pod's name, or its generateName prefix on a CREATE that has none yet."""
        # The pod is not checked yet (that is the core's job), so its metadata may be odd.
        metadata = self.object.get("metadata")
        found = metadata if isinstance(metadata, dict) else {}
        for name in (self.name, found.get("name"), found.get("generateName")):
            if isinstance(name, str) and name:
                return name
        return ""


def decoded_weight(body: bytes) -> int:
    """Return an upper bound of the bytes that decoding `body` takes, without decoding it.

    What JSON decodes to depends on its shape more than its size: each object costs about
    190 bytes however small, each array 60 to 70, each string 50 plus its text, each number
    up to 8 times its digits (measured with tracemalloc over orjson; docs/security.md). So
    the bound is 10 bytes per byte, and each object, array and string again by the count of
    the characters that open it: three counts in C, under 2 ms per MiB, a tenth of what decoding
    the same bytes takes. A string holding such
    characters is counted more than once, which errs on the safe side. Real reviews weigh
    two to three times what they decode to; `[{},{},...]`, which decodes to 24 times its
    size, weighs 74 times.
    """
    return 10 * len(body) + 192 * body.count(b"{") + 72 * body.count(b"[") + 28 * body.count(b'"')


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
            f"{shown(review.get('kind'))}, apiVersion {shown(review.get('apiVersion'))}"
        )
    request = review.get("request")
    if request is None:
        raise BadReview("the AdmissionReview has no request object")
    if not isinstance(request, dict):
        raise BadReview(f"request: {shown(request)} is not an object")
    uid = request.get("uid")
    if uid is None:
        raise BadReview("request.uid is missing")
    if not isinstance(uid, str) or not uid:
        raise BadReview(f"request.uid: {shown(uid)} is not a non-empty string")
    return _request(request, uid, len(body))


def _request(request: dict[str, Any], uid: str, size: int) -> AdmissionRequest:
    _check_fields(request)
    kind = request.get("kind")
    if not kind or not kind.get("kind"):
        raise BadReview("request.kind is missing, or names no kind")
    operation = request.get("operation")
    if operation not in _OPERATIONS:
        raise BadReview(f"request.operation: {shown(operation)} is not one of {_OPERATIONS}")
    obj = request.get("object")
    old = request.get("oldObject")
    if operation in ("CREATE", "UPDATE") and obj is None:
        raise BadReview(f"request.object is missing, which every {operation} review carries")
    if operation == "UPDATE" and old is None:
        raise BadReview("request.oldObject is missing, which every UPDATE review carries")
    user_info = request.get("userInfo") or {}
    return AdmissionRequest(
        uid=uid,
        operation=cast(Operation, operation),
        namespace=request.get("namespace") or "",
        name=request.get("name") or "",
        object=obj or {},
        old_object=old,
        dry_run=request.get("dryRun") is True,
        user=user_info.get("username") or "",
        groups=tuple(user_info.get("groups") or ()),
        size=size,
        kind=kind["kind"] if not kind.get("group") else f"{kind['kind']}.{kind['group']}",
    )


def _check_fields(request: dict[str, Any]) -> None:
    """Refuse a request whose fields have other JSON types than the apiserver sends."""
    for field, (expected, spelled) in _REQUEST_FIELDS.items():
        value = request.get(field)
        if value is not None and type(value) is not expected:
            raise BadReview(f"request.{field}: {shown(value)} is not {spelled}")
    for field, members in _MEMBERS.items():
        value = request.get(field) or {}
        for member in members:
            item = value.get(member)
            if item is not None and not isinstance(item, str):
                raise BadReview(f"request.{field}.{member}: {shown(item)} is not a string")
    _check_user_lists(request.get("userInfo") or {})


def _check_user_lists(user_info: dict[str, Any]) -> None:
    groups = user_info.get("groups")
    if groups is not None and not _strings(groups):
        raise BadReview(f"request.userInfo.groups: {shown(groups)} is not a list of strings")
    extra = user_info.get("extra")
    if extra is not None and not (
        isinstance(extra, dict) and all(v is None or _strings(v) for v in extra.values())
    ):
        raise BadReview(
            f"request.userInfo.extra: {shown(extra)} is not an object of lists of strings"
        )


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)
