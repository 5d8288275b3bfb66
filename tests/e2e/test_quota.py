"""Quota through a real apiserver: refusals, freed room, dry runs, live edits, and the race."""

from __future__ import annotations

import asyncio
import re
import signal
import ssl
import threading
import time
import uuid
from fractions import Fraction

import aiohttp
import kubernetes.client
import orjson
import pytest
from kubernetes.client.exceptions import ApiException

from tests.builders import ALIAS_CYCLE, LAUGHS
from tests.e2e.cluster import GPUADM_USER, ControlPlane
from tests.e2e.fixtures import Deployment, pod_body
from tests.e2e.gpuadm import NAMESPACE, GpuadmProcess, put_configmap, wait_until
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
        pytest.param(ALIAS_CYCLE, id="alias-cycle"),
        pytest.param(LAUGHS, id="laughs-under-the-alias-cap"),
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


# How gpuadm's refusals that a retry may turn around end (docs/troubleshooting.md).
RETRY_ASKED = re.compile(r"retry( the request)?$")
# The burst's creates come in waves, so that the replica is stopped while they still come.
WAVE = 10
WAVE_SECONDS = 0.5
# How long a frozen replica stays frozen: longer than the webhook's timeout (5 s as
# shipped), so the apiserver gives up on the calls it holds.
FROZEN_SECONDS = 6


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_replica_stopped_in_the_middle_of_a_burst_leaves_exactly_the_pods_that_fit(
    gpuadm: Deployment, control_plane: ControlPlane, namespace: str, how: str
) -> None:
    # 120 creates against room for 40, through three replicas, in waves of 10 every half
    # second, each retried as clients retry a refusal that asks for it or a failed webhook
    # call. When a third are answered,
    # the replica that has written the record most is killed (SIGKILL, and the Service
    # stops routing to it) or frozen (SIGSTOP for longer than the webhook's timeout, then
    # SIGCONT: its watch is then far behind the record's mark).
    gpuadm.set_quotas(quota(namespace, h100=40, a100=1))
    written = [p.metric("gpuadm_quota_record_bytes_written_total") for p in gpuadm.processes]
    answered = threading.Event()
    stopped: list[GpuadmProcess] = []
    outcomes = {"admitted": 0, "refused": 0, "retried": 0}
    when: dict[str, float] = {}

    def stop_the_busiest_writer() -> None:
        answered.wait(timeout=60)
        now = [p.metric("gpuadm_quota_record_bytes_written_total") for p in gpuadm.processes]
        busiest = max(range(3), key=lambda i: now[i] - written[i])
        victim = gpuadm.processes[busiest]
        when["wrote"] = now[busiest] - written[busiest]
        stopped.append(victim)
        assert victim.process is not None
        if how == "killed":
            victim.kill()
            when["answered"] = outcomes["admitted"] + outcomes["refused"]
            # As a Service stops routing to a pod that no longer answers its probes: not at
            # once, so that calls meet the dead replica first and fail.
            time.sleep(1)
            gpuadm.balancer.route_to([p.port for p in gpuadm.processes if p is not victim])
        else:
            victim.process.send_signal(signal.SIGSTOP)
            when["answered"] = outcomes["admitted"] + outcomes["refused"]
            time.sleep(FROZEN_SECONDS)
            victim.process.send_signal(signal.SIGCONT)

    stopper = threading.Thread(target=stop_the_busiest_writer)
    stopper.start()
    try:
        asyncio.run(
            create_retrying(control_plane, namespace, 120, outcomes, answered=answered, after=40)
        )
        stopper.join()
        stored = {p.metadata.uid for p in gpuadm.core.list_namespaced_pod(namespace).items}
        print(f"\nreplica {how} mid-burst: {outcomes}, {when}")
        assert outcomes["admitted"] == 40
        assert outcomes["refused"] == 80
        assert len(stored) == 40
        # Stopped mid-burst, after it had written the record: else the test proves nothing.
        # (The apiserver retries a call whose connection failed by itself; a frozen replica's
        # calls time out instead, and the clients retry.)
        assert when["wrote"] > 0
        assert when["answered"] < 100
        if how == "frozen":
            assert outcomes["retried"] > 0
        # Once the pods are shown, the next write drops their reservations: each replica's
        # prune, every 30 s, if nothing else.
        wait_until(
            lambda: not reserved(gpuadm, namespace) & stored,
            "the record to hold no reservation of a stored pod",
            seconds=75,
        )
    finally:
        stopper.join()
        for victim in stopped:
            if how == "killed":
                victim.start()
                wait_until(victim.ready, "the killed replica back", victim.log_tail)
        gpuadm.route(len(gpuadm.processes))


def reserved(gpuadm: Deployment, namespace: str) -> set[str]:
    """Return the uids of the pods the namespace's usage record holds reservations for."""
    try:
        record = gpuadm.core.read_namespaced_config_map(record_name(namespace), NAMESPACE)
    except ApiException as error:
        if error.status == 404:
            return set()
        raise
    return {str(entry["uid"]) for entry in orjson.loads((record.data or {}).get(DATA_KEY) or "[]")}


async def create_retrying(
    plane: ControlPlane,
    namespace: str,
    count: int,
    outcomes: dict[str, int],
    *,
    answered: threading.Event,
    after: int,
) -> None:
    """Create `count` one-GPU pods in waves of `WAVE` every `WAVE_SECONDS`; retry each create
    refused with a request to retry or failed in a webhook call (as a controller does),
    until it is admitted or refused for quota; count each in `outcomes`. Set `answered` once
    `after` creates are answered for good."""
    context = ssl.create_default_context(cafile=plane.ca_file)
    headers = {"Authorization": f"Bearer {plane.token}"}
    url = f"{plane.url}/api/v1/namespaces/{namespace}/pods"
    connector = aiohttp.TCPConnector(ssl=context, limit=count)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def create(index: int) -> None:
            body = pod_body({"gpuadm.io/h100": "1"}, name=f"burst-{index}")
            await asyncio.sleep(index // WAVE * WAVE_SECONDS)
            for _ in range(200):
                async with session.post(url, json=body) as response:
                    message = str((await response.json()).get("message", ""))
                    if response.status == 201:
                        outcomes["admitted"] += 1
                        break
                    if response.status == 403 and "quota exceeded" in message:
                        outcomes["refused"] += 1
                        break
                    if response.status == 409:  # stored by an earlier try whose answer was lost
                        outcomes["admitted"] += 1
                        break
                    if not (RETRY_ASKED.search(message) or "failed calling webhook" in message):
                        raise AssertionError(f"{response.status}: {message}")
                outcomes["retried"] += 1
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"burst-{index} was never answered for good")
            if outcomes["admitted"] + outcomes["refused"] >= after:
                answered.set()

        await asyncio.gather(*(create(i) for i in range(count)))
