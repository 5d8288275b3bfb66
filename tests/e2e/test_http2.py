"""HTTP/2 on a real apiserver (`gpuadm serve --http2`): the apiserver's webhook client
chooses it, a burst of creates shares a few connections instead of a handshake per call,
and the quota still fills exactly."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.e2e.cluster import ControlPlane
from tests.e2e.fixtures import Deployment, restarted_with
from tests.e2e.gpuadm import DROP_SHOWN, GpuadmProcess
from tests.e2e.test_allowances import streams_of_creates
from tests.e2e.test_quota import quota

OVER_HTTP2 = (*DROP_SHOWN, "--http2")
OPENED = "gpuadm_connections_opened_total"


@pytest.fixture(scope="module")
def over_http2(gpuadm: Deployment) -> Iterator[Deployment]:
    """The suite's three replicas, restarted with HTTP/2 offered; as they were after."""
    with restarted_with(gpuadm, OVER_HTTP2, "offering HTTP/2") as restarted:
        yield restarted


def opened(processes: list[GpuadmProcess], protocol: str) -> float:
    return sum(p.metric(OPENED, protocol=protocol) for p in processes)


def test_a_burst_of_creates_shares_a_few_http2_connections_and_fills_the_quota_exactly(
    over_http2: Deployment, control_plane: ControlPlane, namespace: str
) -> None:
    over_http2.set_quotas(quota(namespace, h100=50))
    processes = over_http2.processes
    # One create first, as in a cluster that has been running: the apiserver's connection
    # is open when the burst comes. (Into a cold start, Go's client dials one per call
    # until the first is up, and keeps one.)
    over_http2.create_pod(namespace, {"gpuadm.io/h100": "1"}, dry_run=True)
    before = {protocol: opened(processes, protocol) for protocol in ("h2", "http/1.1")}
    reviews = over_http2.reviews()
    # 40 clients at once, two creates each: over HTTP/1.1 the apiserver opened a connection,
    # and so a TLS handshake, for most of such a burst's calls.
    statuses = asyncio.run(streams_of_creates(control_plane, namespace, streams=40, each=2))
    answered = over_http2.reviews() - reviews
    new = {protocol: opened(processes, protocol) - before[protocol] for protocol in before}
    stored = over_http2.core.list_namespaced_pod(namespace).items
    print(f"\n80 creates against room for 50 over HTTP/2: {answered:.0f} reviews, {new}")
    assert statuses.count(201) == 50
    assert len(stored) == 50
    assert answered >= 2 * 80  # every create mutated, then validated
    # The test's own reads of /metrics, one connection each over HTTP/1.1 (urllib), are
    # all that came that way: 12 from its first read of that count to its last.
    assert new["http/1.1"] <= 12, new
    # The open connection carries the burst: another is opened only when one's 100 streams
    # are all busy, never one per call.
    assert new["h2"] <= 3, new
    # ... and it is HTTP/2: since the replicas started, the apiserver took no other.
    assert opened(processes, "h2") >= 1
