"""Quota through a real apiserver: refusals, freed room, dry runs, live edits, and the race."""

from __future__ import annotations

import asyncio
import ssl
import time
import uuid
from fractions import Fraction

import aiohttp
import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import GPUADM_USER, ControlPlane
from tests.e2e.fixtures import Deployment, pod_body
from tests.e2e.gpuadm import NAMESPACE, put_configmap, wait_until
from webhook.kube.client import connect
from webhook.kube.rest import AsyncApi
from webhook.quota.configmap_store import (
    DATA_KEY,
    RECORD_MAX_BYTES,
    ConfigMapStore,
    record_name,
)
from webhook.quota.reservations import Record, Reservation


def quota(namespace: str, **limits: int) -> str:
    entries = ", ".join(f"{cls}: {limit}" for cls, limit in limits.items())
    return f"namespaces:\n  {namespace}: {{{entries}}}\n"


def test_the_pod_that_would_exceed_the_quota_is_refused(gpuadm: Deployment, namespace: str) -> None:
    gpuadm.set_quotas(quota(namespace, h100=2))
    gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"})
    gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"})
    message = gpuadm.refusal(namespace, {"gpuadm.io/h100": "1"})
    assert f'namespace "{namespace}": h100 quota exceeded: requested 1, in use 2 of 2' in message


def test_deleting_a_pod_frees_its_room(gpuadm: Deployment, namespace: str) -> None:
    gpuadm.set_quotas(quota(namespace, t4=1))
    first = gpuadm.create_pod(namespace, {"gpuadm.io/t4": "1"})
    assert "quota exceeded" in gpuadm.refusal(namespace, {"gpuadm.io/t4": "0.5"})
    gpuadm.core.delete_namespaced_pod(first["metadata"]["name"], namespace)

    def admitted() -> bool:
        try:
            gpuadm.create_pod(namespace, {"gpuadm.io/t4": "0.5"})
        except ApiException:
            return False
        return True

    # Every replica must see the deletion in its pod watch first.
    wait_until(admitted, "room freed by the deleted pod")


def test_a_dry_run_is_judged_but_consumes_nothing(gpuadm: Deployment, namespace: str) -> None:
    gpuadm.set_quotas(quota(namespace, a100=1))
    for _ in range(3):
        gpuadm.create_pod(namespace, {"gpuadm.io/a100": "1"}, dry_run=True)
    assert "quota exceeded" in gpuadm.refusal(namespace, {"gpuadm.io/a100": "2"}, dry_run=True)
    gpuadm.create_pod(namespace, {"gpuadm.io/a100": "0.5"})
    gpuadm.create_pod(namespace, {"gpuadm.io/a100": "0.5"})
    assert "in use 1 of 1" in gpuadm.refusal(namespace, {"gpuadm.io/a100": "0.1"})


def test_a_configmap_edit_takes_effect_without_restart(gpuadm: Deployment, namespace: str) -> None:
    gpuadm.set_quotas(quota(namespace, h100=0))
    assert "in use 0 of 0" in gpuadm.refusal(namespace, {"gpuadm.io/h100": "1"})
    gpuadm.set_quotas(quota(namespace, h100=1))
    gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"})


def test_a_bad_edit_is_refused_and_reported_on_the_configmap(
    gpuadm: Deployment, namespace: str
) -> None:
    gpuadm.set_quotas(quota(namespace, h100=0))
    put_configmap(
        gpuadm.core,
        "gpuadm-quotas",
        "quotas.yaml",
        f"namespaces:\n  {namespace}:\n    h100: plenty\n",
    )

    def reported() -> bool:
        events = gpuadm.core.list_namespaced_event(
            NAMESPACE, field_selector="involvedObject.name=gpuadm-quotas"
        ).items
        return any("'plenty' is not a quantity" in (e.message or "") for e in events)

    wait_until(reported, "a Warning Event on ConfigMap gpuadm-quotas")
    for process in gpuadm.processes:
        wait_until(
            lambda p=process: p.metric("gpuadm_config_valid", config="gpuadm-quotas") == 0,
            "gpuadm_config_valid to drop to 0",
        )
    assert "in use 0 of 0" in gpuadm.refusal(namespace, {"gpuadm.io/h100": "1"})


def _delete_quotas(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    core.delete_namespaced_config_map("gpuadm-quotas", NAMESPACE)


def _rename_key(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    put_configmap(core, "gpuadm-quotas", "quotas.yml", quota(namespace, h100=5))


def _empty_value(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    put_configmap(core, "gpuadm-quotas", "quotas.yaml", "")


@pytest.mark.parametrize(
    ("slip", "reason"),
    [
        pytest.param(
            _delete_quotas, f"ConfigMap {NAMESPACE}/gpuadm-quotas not found", id="deleted"
        ),
        pytest.param(
            _rename_key,
            f"ConfigMap {NAMESPACE}/gpuadm-quotas has no key quotas.yaml (its keys: quotas.yml)",
            id="key-renamed",
        ),
        pytest.param(_empty_value, "the document is empty", id="value-emptied"),
    ],
)
def test_an_admins_slip_never_turns_the_quotas_off(
    gpuadm: Deployment, namespace: str, slip: object, reason: str
) -> None:
    gpuadm.set_quotas(quota(namespace, h100=1))
    slip(gpuadm.core, namespace)  # type: ignore[operator]

    def reported() -> bool:
        events = gpuadm.core.list_namespaced_event(
            NAMESPACE, field_selector="involvedObject.name=gpuadm-quotas"
        ).items
        return any(reason in (e.message or "") and e.type == "Warning" for e in events)

    wait_until(reported, f"a Warning Event saying {reason!r}")
    for process in gpuadm.processes:
        wait_until(
            lambda p=process: p.metric("gpuadm_config_valid", config="gpuadm-quotas") == 0,
            "gpuadm_config_valid to drop to 0",
        )
    # The limit of 1 still holds: a 2-GPU pod is refused, on every replica.
    for _ in gpuadm.processes:
        message = gpuadm.refusal(namespace, {"gpuadm.io/h100": "2"})
        assert f'namespace "{namespace}": h100 quota exceeded: requested 2' in message
        assert "of 1" in message
    gpuadm.set_quotas(quota(namespace, h100=1))  # repaired: valid again everywhere
    for process in gpuadm.processes:
        wait_until(
            lambda p=process: p.metric("gpuadm_config_valid", config="gpuadm-quotas") == 1,
            "gpuadm_config_valid back to 1",
        )


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("namespaces:\n  team-x:\n    1: 2\n", id="class-key-1"),
        pytest.param("namespaces: " + "[" * 900, id="nested-900"),
        pytest.param("a: &a [1]\nb: [" + ", ".join(["*a"] * 500) + "]\n", id="alias-bomb"),
    ],
)
def test_the_config_watch_lives_through_any_edit_and_applies_the_next_valid_one(
    gpuadm: Deployment, namespace: str, text: str
) -> None:
    gpuadm.set_quotas(quota(namespace, h100=0))
    put_configmap(gpuadm.core, "gpuadm-quotas", "quotas.yaml", text)
    for process in gpuadm.processes:
        wait_until(
            lambda p=process: p.metric("gpuadm_config_valid", config="gpuadm-quotas") == 0,
            "gpuadm_config_valid to drop to 0",
        )
    gpuadm.set_quotas(quota(namespace, h100=1))  # waits until every replica has it in force
    gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"})
    for process in gpuadm.processes:
        assert process.metric("gpuadm_task_restarts_total", task="configmaps") == 0


async def create_concurrently(plane: ControlPlane, namespace: str, count: int) -> list[int]:
    """Create `count` one-GPU pods at once, straight through the apiserver's REST API."""
    context = ssl.create_default_context(cafile=plane.ca_file)
    headers = {"Authorization": f"Bearer {plane.token}"}
    url = f"{plane.url}/api/v1/namespaces/{namespace}/pods"
    connector = aiohttp.TCPConnector(ssl=context, limit=count)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def create(index: int) -> int:
            body = pod_body({"gpuadm.io/h100": "1"}, name=f"race-{index}")
            async with session.post(url, json=body) as response:
                if response.status not in (201, 403):
                    raise AssertionError(f"{response.status}: {await response.text()}")
                if response.status == 403:
                    assert "quota exceeded" in (await response.json())["message"]
                return response.status

        return await asyncio.gather(*(create(i) for i in range(count)))


@pytest.mark.parametrize("run", [1, 2, 3])
@pytest.mark.parametrize("replicas", [1, 3])
def test_fifty_concurrent_creates_against_room_for_ten_store_exactly_ten(
    gpuadm: Deployment, control_plane: ControlPlane, namespace: str, replicas: int, run: int
) -> None:
    serving = gpuadm.route(replicas)
    try:
        gpuadm.set_quotas(quota(namespace, h100=10))
        before = [p.metric("gpuadm_admission_requests_total", endpoint="validate") for p in serving]
        started = time.monotonic()
        statuses = asyncio.run(create_concurrently(control_plane, namespace, 50))
        elapsed = time.monotonic() - started
        stored = gpuadm.core.list_namespaced_pod(namespace).items
        print(
            f"\nrace with {replicas} replica(s): {statuses.count(201)} admitted of 50, "
            f"{len(stored)} stored, {elapsed:.2f} s"
        )
        assert statuses.count(201) == 10
        assert len(stored) == 10
        if replicas > 1:
            after = [
                p.metric("gpuadm_admission_requests_total", endpoint="validate") for p in serving
            ]
            busy = [a - b for a, b in zip(after, before, strict=True)]
            assert sum(1 for n in busy if n > 0) >= 2, f"one replica took all traffic: {busy}"
    finally:
        gpuadm.route(len(gpuadm.processes))


def test_a_record_of_the_largest_size_gpuadm_writes_is_stored_and_one_byte_more_is_not(
    core_v1: kubernetes.client.CoreV1Api, namespace: str
) -> None:
    # gpuadm refuses, before sending it, a record larger than RECORD_MAX_BYTES: the
    # apiserver's own limit, not a guess at it.
    def config_map(name: str, size: int) -> kubernetes.client.V1ConfigMap:
        return kubernetes.client.V1ConfigMap(
            metadata=kubernetes.client.V1ObjectMeta(name=name), data={DATA_KEY: "x" * size}
        )

    core_v1.create_namespaced_config_map(namespace, config_map("at-limit", RECORD_MAX_BYTES))
    with pytest.raises(ApiException) as refused:
        core_v1.create_namespaced_config_map(
            namespace, config_map("over-limit", RECORD_MAX_BYTES + 1)
        )
    assert refused.value.status == 422


def test_the_store_writes_a_record_of_thousands_and_reads_back_each_reservation(
    gpuadm: Deployment, control_plane: ControlPlane, core_v1: kubernetes.client.CoreV1Api
) -> None:
    kube = connect(str(control_plane.kubeconfig_of(GPUADM_USER)))
    # Only the records' names: no such namespaces.
    tenant, other = (f"record-{uuid.uuid4().hex[:8]}" for _ in range(2))
    # Made now, so that no replica's pruning finds them expired while the test runs.
    now = time.time()
    record = {
        str(uuid.uuid4()): Reservation("h100", Fraction(n % 7 + 1, 2), now + n / 1000, f"pod-{n}")
        for n in range(3000)
    }

    async def write_twice_read_and_delete() -> tuple[Record, Record, list[list[str]]]:
        api = AsyncApi(kube.endpoint())
        store = ConfigMapStore(api, NAMESPACE)
        kept = []  # the namespaces whose text the store keeps, after each step
        try:
            first = await store.write(tenant, record, None)
            # Written again with one reservation more, as at an admission: the text of the
            # 3,000 is reused, the new one is encoded.
            record["new"] = Reservation("h100", Fraction(1), now, "new")
            await store.write(tenant, record, first)
            await store.write(other, {"x": record["new"]}, None)
            stored = await store.read(tenant)
            kept.append(sorted(store.text.namespaces()))
            await store.delete(tenant, str(stored.version))
            kept.append(sorted(store.text.namespaces()))
            # Another replica deletes the other record; the next listing forgets its text.
            await asyncio.to_thread(
                core_v1.delete_namespaced_config_map, record_name(other), NAMESPACE
            )
            await store.namespaces()
            kept.append(sorted(store.text.namespaces()))
            return stored, await store.read(tenant), kept
        finally:
            await api.close()

    stored, after_delete, kept = asyncio.run(write_twice_read_and_delete())
    assert stored.reservations == record
    assert after_delete.version is None
    assert kept == [sorted([tenant, other]), [other], []]
