"""Bytes written per admission under quota, in a namespace whose pods churn.

Pods are created one after another at a steady rate in a namespace with a roomy quota, and
each is deleted a few creates later, as a controller that replaces short-lived pods does.
Each admission writes the namespace's usage record, and a reservation stays in it for 90 s
(`RESERVATION_TTL`), pruned by each replica every 30 s: so the record grows by one
reservation a create until the oldest expire, then holds about `rate` x 90 of them, and
every write carries them all.

What the churn costs is read from what the apiserver receives:

- gpuadm's counter of the bytes of the record bodies it sends
  (`gpuadm_quota_record_bytes_written_total`, summed over the replicas, prunes included),
  sampled between creates every `SAMPLE_EVERY` creates, with the record's size then;
- the apiserver's own `apiserver_request_body_size_bytes` for ConfigMap creates and
  updates, over the whole churn: nothing else writes a ConfigMap meanwhile, so it must
  equal gpuadm's count, which checks the counter;
- the same metric for pod creates: the pod's own body, the anchor;
- etcd's `etcd_debugging_mvcc_total_put_size_in_bytes`: what etcd stored, everything
  included (the pods, the records, Leases, Events).
"""

from __future__ import annotations

import asyncio
import collections
import re
import time
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from bench.creates import PodCreator
from tests.e2e.cluster import ControlPlane
from tests.e2e.fixtures import Deployment, pod_body
from tests.e2e.gpuadm import NAMESPACE
from webhook.kube.objects import USAGE_RECORD_LABEL
from webhook.quota.book import RESERVATION_TTL
from webhook.quota.configmap_store import DATA_KEY, record_name

CHURN_NAMESPACE = "churn"
# Creates a second. A record of 90 s of them holds 1,800 reservations, about a fifth of what
# a ConfigMap may hold: the namespace is never refused as full, and every create is stored.
RATE = 20
# Pods alive at once: each is deleted this many creates after its own.
ALIVE = 20
SAMPLE_EVERY = 20
# Record sizes at which the bytes per admission are reported, when the churn reaches them.
RECORD_POINTS = (100, 1000)
# The record is at its steady size once its oldest reservations expire (90 s) and the
# replicas' prunes (every 30 s each, at their own times) have begun to drop them.
STEADY_AFTER = RESERVATION_TTL + 10
BYTES_WRITTEN = "gpuadm_quota_record_bytes_written_total"
BODY_SIZE = "apiserver_request_body_size_bytes"
BODY_SIZE_LINE = re.compile(
    rf"^{BODY_SIZE}_(?P<part>sum|count)\{{(?P<labels>[^}}]*)\}} (?P<value>\S+)$"
)
ETCD_PUT_BYTES = "etcd_debugging_mvcc_total_put_size_in_bytes"
# Dry runs before the churn, at most, until one is admitted.
WARMUP_TRIES = 5


@dataclass(frozen=True)
class Sample:
    """The counters at one moment between two creates."""

    seconds: float
    admitted: int
    written: float
    """gpuadm's bytes of record bodies, all replicas."""
    etcd_put: float
    reservations: int
    """In the churning namespace's record."""


async def measure_churn(
    plane: ControlPlane, deployment: Deployment, creator: PodCreator, *, seconds: float
) -> dict[str, Any]:
    """Churn for `seconds` through gpuadm's first replica; return the samples and figures."""
    await asyncio.to_thread(deployment.route, 1)
    # Taking the other replicas out of the route cut the apiserver's connections to them,
    # and behind the kernel's balancer its next webhook call has met a cut one (a create
    # refused as unmutated): dry runs first, until one is admitted, as a burst warms up.
    for attempt in range(WARMUP_TRIES):
        warm = pod_body({"gpuadm.io/h100": "1"}, name=f"warm-{attempt}")
        if await creator.create(CHURN_NAMESPACE, warm, dry_run=True) == 201:
            break
    await forget_other_records(creator)
    bodies_before = await apiserver_body_sizes(creator)
    samples = await churn(plane, deployment, creator, seconds=seconds)
    bodies_after = await apiserver_body_sizes(creator)
    bodies = {key: bodies_after[key] - bodies_before.get(key, 0.0) for key in bodies_after}
    first, last = samples[0], samples[-1]
    pod_creates = bodies.get("pods/create/count", 0.0)
    return {
        "rate": RATE,
        "seconds": last.seconds,
        "admitted": last.admitted,
        "ttl_seconds": RESERVATION_TTL,
        "pod_bytes": bodies.get("pods/create/sum", 0.0) / pod_creates if pod_creates else 0.0,
        "written_bytes": last.written - first.written,
        "apiserver_configmap_bytes": bodies.get("configmaps/create/sum", 0.0)
        + bodies.get("configmaps/update/sum", 0.0),
        "at_record": at_record(samples),
        "steady": steady(samples),
        "largest_record": max(sample.reservations for sample in samples),
        "samples": [asdict(sample) for sample in samples],
    }


async def churn(
    plane: ControlPlane, deployment: Deployment, creator: PodCreator, *, seconds: float
) -> list[Sample]:
    """Create `RATE` pods a second, each deleted `ALIVE` creates later; sample as it goes."""
    started = time.perf_counter()
    alive: collections.deque[str] = collections.deque()

    async def sample(admitted: int) -> Sample:
        written, etcd_put = await asyncio.to_thread(_counters, plane, deployment)
        return Sample(
            time.perf_counter() - started,
            admitted,
            written,
            etcd_put,
            await record_size(creator),
        )

    samples = [await sample(0)]
    created = 0
    while time.perf_counter() - started < seconds:
        if (wait := started + created / RATE - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        # Names of a ReplicaSet's length (the name is in each reservation).
        name = f"trainer-5f7d8c9b4-{created:05d}"
        await creator.latency(CHURN_NAMESPACE, pod_body({"gpuadm.io/h100": "1"}, name=name))
        created += 1
        alive.append(name)
        if len(alive) > ALIVE:
            await creator.delete(CHURN_NAMESPACE, alive.popleft())
        if created % SAMPLE_EVERY == 0:
            samples.append(await sample(created))
    if created % SAMPLE_EVERY:
        samples.append(await sample(created))
    return samples


def per_admission(first: Sample, last: Sample) -> dict[str, float]:
    """Return the bytes per admission between two samples, and the record's mean size."""
    admitted = last.admitted - first.admitted
    return {
        "written": (last.written - first.written) / admitted,
        "etcd_put": (last.etcd_put - first.etcd_put) / admitted,
        "reservations": (first.reservations + last.reservations) / 2,
        "admitted": admitted,
    }


def at_record(samples: list[Sample]) -> dict[str, dict[str, float]]:
    """For each of `RECORD_POINTS` the churn reached: the bytes per admission over the
    stretch of samples around it, from the last at or below the point less half a sampling
    step to the first at or above the point plus half a step (before the first reservations
    expire, the record grows by one a create, so the stretch is centred on the point)."""
    found = {}
    half = SAMPLE_EVERY // 2
    for point in RECORD_POINTS:
        above = next((s for s in samples if s.reservations >= point + half), None)
        if above is None:
            continue
        below = [s for s in samples if s.seconds < above.seconds and s.reservations <= point - half]
        if below:
            found[str(point)] = per_admission(below[-1], above)
    return found


def steady(samples: list[Sample]) -> dict[str, float] | None:
    """Return the bytes per admission once the record stopped growing (from `STEADY_AFTER`
    to the end), or None if the churn did not last that long."""
    later = [sample for sample in samples if sample.seconds >= STEADY_AFTER]
    if len(later) < 2:
        return None
    return {**per_admission(later[0], later[-1]), "from_seconds": later[0].seconds}


async def forget_other_records(creator: PodCreator) -> None:
    """Delete the usage records of the namespaces the benchmark is done with.

    Their reservations expire during the churn, and each replica's prune would rewrite
    them: bytes written, but not by an admission in the churning namespace. Nothing is
    created in those namespaces again, and a replica that finds a record gone has nothing to
    prune.
    """
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    async with creator.session.delete(path, params={"labelSelector": USAGE_RECORD_LABEL}) as answer:
        if answer.status != 200:
            text = (await answer.read()).decode()[:500]
            raise RuntimeError(f"deleting the usage records answered {answer.status}: {text}")


async def record_size(creator: PodCreator) -> int:
    """Return how many reservations the churning namespace's record holds."""
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{record_name(CHURN_NAMESPACE)}"
    async with creator.session.get(path) as answer:
        if answer.status == 404:
            return 0
        found: dict[str, Any] = orjson.loads(await answer.read())
    return len(orjson.loads((found.get("data") or {}).get(DATA_KEY) or "[]"))


async def apiserver_body_sizes(creator: PodCreator) -> dict[str, float]:
    """Return the apiserver's request body sizes so far, as `resource/verb/sum` and
    `resource/verb/count`, for the core group's resources."""
    async with creator.session.get("/metrics") as answer:
        text = (await answer.read()).decode()
    found = {}
    for line in text.splitlines():
        match = BODY_SIZE_LINE.match(line)
        if match is not None:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            if labels.get("group") == "":
                found[f"{labels['resource']}/{labels['verb']}/{match['part']}"] = float(
                    match["value"]
                )
    return found


def _counters(plane: ControlPlane, deployment: Deployment) -> tuple[float, float]:
    written = sum(process.metric(BYTES_WRITTEN) for process in deployment.processes)
    with urllib.request.urlopen(f"{plane.etcd_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    etcd_put = next(
        float(line.split()[1]) for line in text.splitlines() if line.startswith(ETCD_PUT_BYTES)
    )
    return written, etcd_put
