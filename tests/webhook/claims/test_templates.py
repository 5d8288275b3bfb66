"""gpuadm's templates on the admission path: one create per template and replica while it is
known to exist, a create that finds it there is success, and any other failure is the user's
message. The apiserver's own answers are in tests/e2e/test_dra.py; here it is a stand-in
that answers each create with a status."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from policies import load_policy
from policies.classes.backends.dra import DraClass
from policies.pods.dra_templates import ClaimTemplate, Held
from webhook.claims.templates import CONFIRMED_SECONDS, ClaimError, ClusterTemplates
from webhook.config.snapshot import ConfigHolder
from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi

POLICY = load_policy("classes:\n  h100: {backend: dra, models: [NVIDIA H100 80GB HBM3]}\n")
GPU_CLASS = POLICY.classes["h100"]
assert isinstance(GPU_CLASS, DraClass)


def made(gpu_class: DraClass, held: Held) -> ClaimTemplate:
    template = gpu_class.claim_template("h100", held)
    assert template is not None
    return template


TEMPLATE = made(GPU_CLASS, Held(1))


class Api:
    """Answers creates with the next status of `answers` (201 when none is left)."""

    def __init__(self, *answers: int, existing: dict[str, Any] | None = None) -> None:
        self.answers = list(answers)
        self.created: list[tuple[str, dict[str, Any]]] = []
        self.deleted: list[tuple[str, str, str]] = []
        self.existing = existing

    async def get_claim_template(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.existing

    async def create_claim_template(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append((namespace, body))
        status = self.answers.pop(0) if self.answers else 201
        if status == 0 or status >= 400:  # 0: no answer at all
            raise KubeError(status, f"HTTP {status}")
        return body

    async def delete_claim_template(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append((namespace, name, uid))


def keeper(api: Api, now: list[float]) -> ClusterTemplates:
    stand_in: Any = api
    typed: AsyncApi = stand_in
    return ClusterTemplates(typed, ConfigHolder(), clock=lambda: now[0])


async def test_a_template_is_made_once_while_it_is_known_to_exist() -> None:
    api, now = Api(), [0.0]
    templates = keeper(api, now)
    for _ in range(3):
        await templates.ensure("team-a", [TEMPLATE])
    await templates.ensure("team-b", [TEMPLATE])
    assert [namespace for namespace, _ in api.created] == ["team-a", "team-b"]
    body = api.created[0][1]
    assert body == TEMPLATE.manifest("team-a", labels={"app.kubernetes.io/managed-by": "gpuadm"})
    now[0] += CONFIRMED_SECONDS
    await templates.ensure("team-a", [TEMPLATE])
    assert len(api.created) == 3


OURS = TEMPLATE.manifest("team-a", labels={"app.kubernetes.io/managed-by": "gpuadm"})


async def test_a_template_another_replica_made_first_is_as_good_as_one_made_here() -> None:
    api, now = Api(409, existing=OURS), [0.0]
    templates = keeper(api, now)
    await templates.ensure("team-a", [TEMPLATE])
    await templates.ensure("team-a", [TEMPLATE])
    assert len(api.created) == 1


@pytest.mark.parametrize(
    "existing",
    [
        pytest.param({**OURS, "metadata": {"name": TEMPLATE.name}}, id="without-gpuadms-label"),
        pytest.param(
            {
                "metadata": {"name": TEMPLATE.name},
                "spec": {"spec": GPU_CLASS.claim_spec(Held(8))},
            },
            id="with-another-spec",
        ),
    ],
)
async def test_a_template_under_gpuadms_name_that_is_not_gpuadms_is_not_used(
    existing: dict[str, Any],
) -> None:
    api, now = Api(409, existing=existing), [0.0]
    with pytest.raises(ClaimError) as refused:
        await keeper(api, now).ensure("team-a", [TEMPLATE])
    assert refused.value.message == (
        f"ResourceClaimTemplate {TEMPLATE.name} in namespace team-a bears gpuadm's name but is "
        "not gpuadm's (another label or spec); an admin must delete it"
    )


@pytest.mark.parametrize("status", [403, 422, 500, 0])
async def test_any_other_failure_is_the_pods_denial_and_is_asked_again(status: int) -> None:
    api, now = Api(status), [0.0]
    templates = keeper(api, now)
    with pytest.raises(ClaimError) as failed:
        await templates.ensure("team-a", [TEMPLATE])
    assert failed.value.message.startswith(
        f"could not make ResourceClaimTemplate {TEMPLATE.name} in namespace team-a: "
    )
    assert failed.value.message.endswith("; retry")
    await templates.ensure("team-a", [TEMPLATE])
    assert len(api.created) == 2


SHARING = load_policy(
    "classes:\n  h100:\n    backend: dra\n"
    "    sharing: {strategy: capacity, capacity: {memory: 80Gi}}\n"
)
SHARE_CLASS = SHARING.classes["h100"]
assert isinstance(SHARE_CLASS, DraClass)
SHARE = made(SHARE_CLASS, Held.share(50))


class Dropping(Api):
    """An apiserver whose DRAConsumableCapacity is off: it stores a claim's `capacity`
    request not at all, and answers the create with what it stored."""

    def __init__(self, *, delete_fails: bool = False) -> None:
        super().__init__()
        self.delete_fails = delete_fails

    async def create_claim_template(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        await super().create_claim_template(namespace, body)
        stored = copy.deepcopy(body)
        for request in stored["spec"]["spec"]["devices"]["requests"]:
            request["exactly"].pop("capacity", None)
        stored["metadata"]["uid"] = "uid-1"
        return stored

    async def delete_claim_template(self, namespace: str, name: str, uid: str) -> None:
        await super().delete_claim_template(namespace, name, uid)
        if self.delete_fails:
            raise KubeError(500, "HTTP 500")


@pytest.mark.parametrize("delete_fails", [False, True], ids=["deleted", "delete-failed"])
async def test_a_share_the_apiserver_stores_without_its_capacity_is_refused(
    delete_fails: bool,
) -> None:
    api, now = Dropping(delete_fails=delete_fails), [0.0]
    templates = keeper(api, now)
    with pytest.raises(ClaimError) as refused:
        await templates.ensure("team-a", [SHARE])
    assert refused.value.message == (
        f"the apiserver did not store ResourceClaimTemplate {SHARE.name} as gpuadm wrote it: a "
        "capacity request needs the feature gate DRAConsumableCapacity on the "
        "apiserver, the scheduler and the controller manager; the pod cannot get what it "
        "would be charged for"
    )
    assert api.deleted == [("team-a", SHARE.name, "uid-1")]
    # Not confirmed: the next pod's create is tried again.
    with pytest.raises(ClaimError):
        await templates.ensure("team-a", [SHARE])
    assert len(api.created) == 2


async def test_a_whole_device_template_the_same_apiserver_stores_as_written() -> None:
    api, now = Dropping(), [0.0]
    await keeper(api, now).ensure("team-a", [TEMPLATE])
    assert api.deleted == []


async def test_gpuadms_template_left_stored_otherwise_is_deleted_when_met_again() -> None:
    # A share made while the gate was off, whose delete then failed: the next pod's create
    # finds it under gpuadm's name and label without its capacity request.
    stored = copy.deepcopy(
        SHARE.manifest("team-a", labels={"app.kubernetes.io/managed-by": "gpuadm"})
    )
    del stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    stored["metadata"]["uid"] = "uid-2"
    api, now = Api(409, existing=stored), [0.0]
    with pytest.raises(ClaimError, match="needs the feature gate DRAConsumableCapacity"):
        await keeper(api, now).ensure("team-a", [SHARE])
    assert api.deleted == [("team-a", SHARE.name, "uid-2")]


async def test_capacity_requests_are_compared_as_amounts() -> None:
    # The apiserver keeps the amount and may spell it otherwise (4000 as 4k).
    api, now = Api(), [0.0]
    respelled = copy.deepcopy(
        SHARE.manifest("team-a", labels={"app.kubernetes.io/managed-by": "gpuadm"})
    )
    requests = respelled["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    requests["requests"] = {"memory": "40960Mi"}

    async def create(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        api.created.append((namespace, body))
        return respelled

    api.create_claim_template = create  # type: ignore[method-assign]
    await keeper(api, now).ensure("team-a", [SHARE])
    assert api.deleted == []
