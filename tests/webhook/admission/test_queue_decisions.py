"""Queue mode through the server: the gate given at /mutate, judged at /validate, and kept."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from tests.builders import POLICY_YAML, pod, review
from tests.webhook.calls import Client, MakeClient, decoded_patch, post
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.server.app import create_app
from webhook.server.settings import Settings

QUOTAS = """
namespaces:
  team-q: {mode: queue, a100: 1}
  team-e: {a100: 1}
"""
GATE = "gpuadm.io/quota"
TRUSTED = "system:serviceaccount:gpuadm-system:gpuadm"


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def ledger(store: MemoryStore) -> QuotaLedger:
    return QuotaLedger(UsageIndex(), store, pods_visible=False)


@pytest.fixture
async def client(aiohttp_client: MakeClient, ledger: QuotaLedger) -> Client:
    snapshot = snapshot_from_text(
        POLICY_YAML, QUOTAS, policy_source="policy.yaml", quotas_source="quotas.yaml"
    )
    app = create_app(Settings(trusted_user=TRUSTED), ConfigHolder(snapshot), quota=ledger)
    return await aiohttp_client(app)


def new_pod(
    name: str, limits: dict[str, str], namespace: str, **spec: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pod being created, and its review; the apiserver has given it a uid."""
    body = pod(limits, **spec)
    body["metadata"].update(name=name, namespace=namespace, uid=f"uid-{name}")
    return body, review(body, namespace=namespace, uid=f"review-{name}")


def gate_ops(patch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [op for op in patch if op["path"].startswith("/spec/schedulingGates")]


async def create(client: Client, name: str, limits: dict[str, str], namespace: str) -> Any:
    """Send a pod through /mutate, then, as stored, through /validate: what each answered,
    and the pod."""
    body, request = new_pod(name, limits, namespace)
    mutated = await post(client, "/mutate", request)
    assert mutated["allowed"] is True, mutated
    stored = jsonpatch.apply_patch(body, decoded_patch(mutated))
    validated = await post(
        client, "/validate", review(stored, namespace=namespace, uid=f"validate-{name}")
    )
    return mutated, validated, stored


async def test_in_a_queue_namespace_a_pod_that_fits_is_charged_and_one_that_does_not_waits(
    client: Client, ledger: QuotaLedger, store: MemoryStore
) -> None:
    mutated, validated, first = await create(client, "first", {"gpuadm.io/a100": "1"}, "team-q")
    assert gate_ops(decoded_patch(mutated)) == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}
    ]
    assert first["spec"]["schedulingGates"] == [{"name": GATE}]
    assert validated["allowed"] is True
    assert validated["auditAnnotations"]["decision"] == "allowed"
    assert not any(GATE in w for w in validated.get("warnings", []))
    assert ledger.book.in_use("team-q") == {"a100": 1}
    assert store.writes == 1

    mutated, validated, second = await create(client, "second", {"gpuadm.io/a100": "0.5"}, "team-q")
    assert second["spec"]["schedulingGates"] == [{"name": GATE}]
    assert validated["allowed"] is True
    assert validated["auditAnnotations"]["decision"] == "queued"
    (warning,) = [w for w in validated["warnings"] if GATE in w]
    assert warning == (
        'waiting for GPU quota: namespace "team-q": a100 quota exceeded: requested 0.5, in use '
        f"1 of 1; 0 pods ahead of it in line; the scheduling gate {GATE} holds it"
    )
    # Waiting costs nothing: no write, nothing more in use.
    assert store.writes == 1
    assert ledger.book.in_use("team-q") == {"a100": 1}
    assert set((await store.read("team-q")).reservations) == {"uid-first"}


async def test_a_pod_that_could_never_fit_is_refused_at_mutate(client: Client) -> None:
    _, request = new_pod("huge", {"gpuadm.io/a100": "2"}, "team-q")
    response = await post(client, "/mutate", request)
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"] == (
        'namespace "team-q": a100 quota exceeded: requested 2, more than the whole limit of 1, '
        "so the pod could never run"
    )


@pytest.mark.parametrize(
    ("namespace", "limits"),
    [
        pytest.param("team-e", {"gpuadm.io/a100": "1"}, id="enforce-namespace"),
        pytest.param("team-q", {"gpuadm.io/t4": "1"}, id="class-without-a-limit"),
        pytest.param("team-q", {"cpu": "1"}, id="no-gpu"),
    ],
)
async def test_no_gate_where_no_queue_limit_applies(
    client: Client, namespace: str, limits: dict[str, str]
) -> None:
    _, request = new_pod("p", limits, namespace)
    response = await post(client, "/mutate", request)
    assert response["allowed"] is True
    patch = decoded_patch(response) if "patch" in response else []
    assert gate_ops(patch) == []


async def test_in_an_enforce_namespace_a_pod_that_does_not_fit_is_refused(client: Client) -> None:
    _, validated, _ = await create(client, "first", {"gpuadm.io/a100": "1"}, "team-e")
    assert validated["allowed"] is True
    body, request = new_pod("second", {"gpuadm.io/a100": "0.5"}, "team-e")
    mutated = await post(client, "/mutate", request)
    stored = jsonpatch.apply_patch(body, decoded_patch(mutated))
    assert "schedulingGates" not in stored["spec"]
    validated = await post(client, "/validate", review(stored, namespace="team-e"))
    assert validated["allowed"] is False
    assert validated["status"]["message"] == (
        'namespace "team-e": a100 quota exceeded: requested 0.5, in use 1 of 1'
    )


@pytest.mark.parametrize(
    "gates",
    [
        pytest.param([{"name": "example.com/provisioning"}], id="another-gate"),
        pytest.param([{"name": GATE}], id="ours-already"),
    ],
)
async def test_a_pod_created_with_gates_keeps_them_and_carries_ours_once(
    client: Client, gates: list[dict[str, str]]
) -> None:
    body, request = new_pod(
        "p", {"gpuadm.io/a100": "0.5"}, "team-q", schedulingGates=copy.deepcopy(gates)
    )
    response = await post(client, "/mutate", request)
    assert response["allowed"] is True
    stored = jsonpatch.apply_patch(body, decoded_patch(response))
    names = [g["name"] for g in stored["spec"]["schedulingGates"]]
    assert names.count(GATE) == 1
    assert names[: len(gates)] == [g["name"] for g in gates]


async def gated_pod(client: Client) -> dict[str, Any]:
    await create(client, "holder", {"gpuadm.io/a100": "1"}, "team-q")
    _, validated, waiting = await create(client, "waiting", {"gpuadm.io/a100": "1"}, "team-q")
    assert validated["auditAnnotations"]["decision"] == "queued"
    return dict(waiting)


@pytest.mark.parametrize(
    ("user", "allowed"),
    [pytest.param("alice", False, id="tenant"), pytest.param(TRUSTED, True, id="gpuadm")],
)
async def test_only_gpuadm_may_remove_its_gate(client: Client, user: str, allowed: bool) -> None:
    waiting = await gated_pod(client)
    released = copy.deepcopy(waiting)
    released["spec"]["schedulingGates"] = []
    response = await post(
        client, "/validate", review(released, operation="UPDATE", old=waiting, user=user)
    )
    assert response["allowed"] is allowed
    if not allowed:
        assert response["status"]["message"].startswith(
            f"the scheduling gate {GATE} may be removed by gpuadm only"
        )


async def test_other_updates_of_a_waiting_pod_are_allowed(client: Client) -> None:
    waiting = await gated_pod(client)
    labelled = copy.deepcopy(waiting)
    labelled["metadata"].setdefault("labels", {})["team"] = "ml"
    response = await post(
        client, "/validate", review(labelled, operation="UPDATE", old=waiting, user="alice")
    )
    assert response["allowed"] is True


# --- the gate is gpuadm's ---------------------------------------------------------------------


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize(
    "limits",
    [
        pytest.param({"gpuadm.io/a100": "0.5"}, id="fits"),
        pytest.param({"gpuadm.io/a100": "1"}, id="does-not-fit"),
        pytest.param({"gpuadm.io/t4": "1"}, id="class-without-a-limit"),
    ],
)
async def test_a_pod_that_brings_the_gate_outside_queue_mode_is_refused_uncharged(
    client: Client, store: MemoryStore, limits: dict[str, str], dry_run: bool
) -> None:
    await create(client, "holder", {"gpuadm.io/a100": "0.5"}, "team-e")
    writes = store.writes
    body, request = new_pod("sneaky", limits, "team-e", schedulingGates=[{"name": GATE}])
    mutated = await post(client, "/mutate", request)
    stored = jsonpatch.apply_patch(body, decoded_patch(mutated))
    sent = review(stored, namespace="team-e", uid="validate-sneaky")
    sent["request"]["dryRun"] = dry_run
    validated = await post(client, "/validate", sent)
    assert validated["allowed"] is False
    assert validated["status"]["message"] == (
        f"the scheduling gate {GATE} is gpuadm's: it holds pods in line only in namespaces "
        'whose GPU quota mode is queue, and namespace "team-e" is in enforce mode: create the '
        "pod without it"
    )
    assert store.writes == writes
    assert "uid-sneaky" not in (await store.read("team-e")).reservations


async def test_a_pod_that_brings_the_gate_in_queue_mode_and_fits_is_charged_once(
    client: Client, store: MemoryStore
) -> None:
    body, request = new_pod(
        "own-gate", {"gpuadm.io/a100": "0.5"}, "team-q", schedulingGates=[{"name": GATE}]
    )
    mutated = await post(client, "/mutate", request)
    stored = jsonpatch.apply_patch(body, decoded_patch(mutated))
    assert [g["name"] for g in stored["spec"]["schedulingGates"]] == [GATE]
    validated = await post(client, "/validate", review(stored, namespace="team-q"))
    assert validated["auditAnnotations"]["decision"] == "allowed"
    assert {u: r.charge for u, r in (await store.read("team-q")).reservations.items()} == {
        "uid-own-gate": 0.5
    }
    # The leader finds it in line, charged already: it hands it over to be ungated and
    # charges nothing more.
    snapshot = snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")
    usage = UsageIndex()
    stored["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    usage.observe(stored, snapshot.policy, snapshot.quotas, now=0)
    leader = QuotaLedger(usage, store, pods_visible=True)
    writes = store.writes
    released, turn = await leader.line.release("team-q", snapshot.quotas)
    assert [w.uid for w in released] == ["uid-own-gate"]
    assert turn.released == ()
    assert store.writes == writes
