"""Decoding reviews: a malformed review is refused naming the field; any kind is decoded."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.builders import pod, review
from webhook.reviews.request import BadReview, decode_review


def with_request(**fields: Any) -> bytes:
    """Return a review of a GPU pod whose request has `fields` set (None removes one)."""
    body = review(pod({"gpuadm.io/a100": "1"}), operation="UPDATE", old=pod({}))
    for name, value in fields.items():
        body["request"][name] = value
        if value is None:
            del body["request"][name]
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(b'"review"', "body is not a JSON object", id="a-string"),
        pytest.param(
            json.dumps({"kind": ["AdmissionReview"], "apiVersion": "v1"}).encode(),
            "expected kind AdmissionReview, apiVersion admission.k8s.io/v1; got kind "
            "['AdmissionReview'], apiVersion 'v1'",
            id="kind-a-list",
        ),
        pytest.param(
            json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}).encode(),
            "the AdmissionReview has no request object",
            id="no-request",
        ),
        pytest.param(
            json.dumps(review(pod({})) | {"request": [1]}).encode(),
            "request: [1] is not an object",
            id="request-a-list",
        ),
        pytest.param(with_request(uid=None), "request.uid is missing", id="no-uid"),
        pytest.param(
            with_request(uid=7), "request.uid: 7 is not a non-empty string", id="uid-a-number"
        ),
        pytest.param(
            with_request(uid=""), "request.uid: '' is not a non-empty string", id="uid-empty"
        ),
        pytest.param(
            with_request(userInfo="x"),
            "request.userInfo: 'x' is not an object",
            id="userinfo-is-a-string",
        ),
        pytest.param(
            with_request(userInfo={"username": ["alice"]}),
            "request.userInfo.username: ['alice'] is not a string",
            id="username-a-list",
        ),
        pytest.param(
            with_request(userInfo={"username": "alice", "groups": "admins"}),
            "request.userInfo.groups: 'admins' is not a list of strings",
            id="groups-a-string",
        ),
        pytest.param(
            with_request(userInfo={"username": "alice", "groups": [["admins"]]}),
            "request.userInfo.groups: [['admins']] is not a list of strings",
            id="group-a-list",
        ),
        pytest.param(
            with_request(userInfo={"username": "alice", "extra": {"scopes": "all"}}),
            "request.userInfo.extra: {'scopes': 'all'} is not an object of lists of strings",
            id="extra-value-a-string",
        ),
        pytest.param(
            with_request(kind=None), "request.kind is missing, or names no kind", id="no-kind"
        ),
        pytest.param(
            with_request(kind="Pod"), "request.kind: 'Pod' is not an object", id="kind-a-string"
        ),
        pytest.param(
            with_request(kind={"group": "", "version": "v1"}),
            "request.kind is missing, or names no kind",
            id="kind-without-kind",
        ),
        pytest.param(
            with_request(kind={"group": None, "version": "v1", "kind": 3}),
            "request.kind.kind: 3 is not a string",
            id="kind-kind-a-number",
        ),
        pytest.param(
            with_request(resource=["pods"]),
            "request.resource: ['pods'] is not an object",
            id="resource-a-list",
        ),
        pytest.param(
            with_request(subResource={}),
            "request.subResource: {} is not a string",
            id="subresource-an-object",
        ),
        pytest.param(
            with_request(operation=None),
            "request.operation: null is not one of ('CREATE', 'UPDATE', 'DELETE', 'CONNECT')",
            id="no-operation",
        ),
        pytest.param(
            with_request(operation=["CREATE"]),
            "request.operation: ['CREATE'] is not a string",
            id="operation-a-list",
        ),
        pytest.param(
            with_request(operation="PATCH"),
            "request.operation: 'PATCH' is not one of ('CREATE', 'UPDATE', 'DELETE', 'CONNECT')",
            id="operation-unknown",
        ),
        pytest.param(
            with_request(dryRun="false"),
            "request.dryRun: 'false' is not true or false",
            id="dryrun-a-string",
        ),
        pytest.param(
            with_request(namespace=["team-a"]),
            "request.namespace: ['team-a'] is not a string",
            id="namespace-a-list",
        ),
        pytest.param(with_request(name=5), "request.name: 5 is not a string", id="name-a-number"),
        pytest.param(
            with_request(object="pod"),
            "request.object: 'pod' is not an object",
            id="object-a-string",
        ),
        pytest.param(
            with_request(object=None),
            "request.object is missing, which every UPDATE review carries",
            id="update-without-object",
        ),
        pytest.param(
            with_request(oldObject=[]),
            "request.oldObject: [] is not an object",
            id="old-object-a-list",
        ),
        pytest.param(
            with_request(oldObject=None),
            "request.oldObject is missing, which every UPDATE review carries",
            id="update-without-old-object",
        ),
        pytest.param(
            with_request(options="x"),
            "request.options: 'x' is not an object",
            id="options-a-string",
        ),
    ],
)
def test_a_malformed_review_is_refused_naming_the_field(body: bytes, reason: str) -> None:
    with pytest.raises(BadReview) as refused:
        decode_review(body)
    assert refused.value.reason == reason


def test_a_review_of_another_kind_is_decoded_as_not_a_pod() -> None:
    body = review({"metadata": {"name": "web"}}, uid="d-1")
    body["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    decoded = decode_review(json.dumps(body).encode())
    assert (decoded.uid, decoded.kind, decoded.is_pod) == ("d-1", "Deployment.apps", False)


def test_a_pod_review_is_decoded_with_its_user_and_groups() -> None:
    body = review(pod({}), user="bob")
    body["request"]["userInfo"]["extra"] = {"scopes": ["a"], "empty": None}
    decoded = decode_review(json.dumps(body).encode())
    assert decoded.is_pod
    assert (decoded.user, decoded.groups) == ("bob", ("system:authenticated",))


@pytest.mark.parametrize(
    ("metadata", "name"),
    [
        pytest.param({"name": "p"}, "p", id="name"),
        pytest.param({"generateName": "p-"}, "p-", id="generate-name"),
        pytest.param(["p"], "", id="metadata-a-list"),
        pytest.param({"name": ["p"], "generateName": "p-"}, "p-", id="name-a-list"),
    ],
)
def test_the_pod_name_is_read_whatever_the_metadata_holds(metadata: object, name: str) -> None:
    body = review({"metadata": metadata})
    body["request"].pop("name", None)
    assert decode_review(json.dumps(body).encode()).pod_name == name
