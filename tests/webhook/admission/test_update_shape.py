"""An UPDATE whose pods are not shaped like stored pods is a denial naming the field, never an
incident: the update check reads the metadata, the spec and its scheduling gates of both."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.builders import pod, review
from tests.webhook.calls import Client, MakeClient, post
from tests.webhook.server.test_server import snapshot
from webhook.config.snapshot import ConfigHolder
from webhook.server.app import create_app
from webhook.server.settings import Settings


@pytest.fixture
async def client(aiohttp_client: MakeClient) -> Client:
    return await aiohttp_client(create_app(Settings(), ConfigHolder(snapshot())))


def update(new_spec: object, old_spec: object) -> dict[str, Any]:
    stored = pod({"gpuadm.io/h100": "1"})
    old = copy.deepcopy(stored)
    old["spec"] = old_spec
    stored["spec"] = new_spec
    return review(stored, operation="UPDATE", old=old, uid="odd-update")


FINE = {"containers": [{"name": "main", "image": "busybox"}]}


@pytest.mark.parametrize(
    ("new_spec", "old_spec", "reason"),
    [
        pytest.param([1], FINE, "spec: [1] is not an object", id="spec-list"),
        pytest.param(5, FINE, "spec: 5 is not an object", id="spec-number"),
        pytest.param("x", "x", "spec: 'x' is not an object", id="both-strings"),
        pytest.param(FINE, [1], "the old pod's spec: [1] is not an object", id="old-spec-list"),
        pytest.param(
            {**FINE, "schedulingGates": {"name": "x"}},
            FINE,
            "spec.schedulingGates: {'name': 'x'} is not a list",
            id="gates-object",
        ),
    ],
)
async def test_an_update_of_odd_pods_is_denied_naming_the_field(
    client: Client, new_spec: object, old_spec: object, reason: str
) -> None:
    answer = await post(client, "/validate", update(new_spec, old_spec))
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 403
    assert answer["status"]["message"] == reason


async def test_an_update_of_ordinary_pods_is_allowed(client: Client) -> None:
    answer = await post(client, "/validate", update(FINE, FINE))
    assert answer["allowed"] is True
