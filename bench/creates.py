"""Pod creates sent straight to a kube-apiserver over aiohttp, one by one or all at once.

The official Kubernetes client is synchronous, so a burst from it would be as parallel as its
thread pool; here every create of a burst is in flight at once, each on its own keep-alive
connection, as the creates of many controllers and users would be.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

from tests.e2e.cluster import ControlPlane
from tests.e2e.fixtures import pod_body


@dataclass(frozen=True)
class Burst:
    """What a burst of creates did: how long it took, and the answers by HTTP status."""

    seconds: float
    statuses: dict[int, int]

    @property
    def admitted(self) -> int:
        """Return how many creates were stored."""
        return self.statuses.get(201, 0)


class PodCreator:
    """Creates pods as the admin user, over as many connections as `connections`."""

    def __init__(self, plane: ControlPlane, *, connections: int) -> None:
        """Talk to `plane`'s apiserver with its admin token; open connections lazily."""
        self._plane = plane
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> PodCreator:
        context = ssl.create_default_context(cafile=str(self._plane.ca_file))
        self._session = aiohttp.ClientSession(
            base_url=self._plane.url,
            headers={"Authorization": f"Bearer {self._plane.token}"},
            connector=aiohttp.TCPConnector(ssl=context, limit=self._connections),
        )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        """Return the open session."""
        if self._session is None:
            raise RuntimeError("use PodCreator as an async context manager")
        return self._session

    async def open_connections(self) -> None:
        """Open every connection now, so that no TLS handshake falls inside a measurement."""

        async def get_version() -> None:
            async with self.session.get("/version") as answer:
                await answer.read()

        await asyncio.gather(*(get_version() for _ in range(self._connections)))

    async def create(self, namespace: str, body: dict[str, Any], *, dry_run: bool = False) -> int:
        """Create one pod; return the apiserver's HTTP status (201 when it was stored)."""
        return (await self._post_pod(namespace, body, dry_run=dry_run))[0]

    async def _post_pod(
        self, namespace: str, body: dict[str, Any], *, dry_run: bool
    ) -> tuple[int, bytes]:
        params = {"dryRun": "All"} if dry_run else {}
        path = f"/api/v1/namespaces/{namespace}/pods"
        async with self.session.post(path, json=body, params=params) as answer:
            return answer.status, await answer.read()

    async def delete(self, namespace: str, name: str) -> None:
        """Delete one pod at once (no grace period); fail unless it was there."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        async with self.session.delete(path, params={"gracePeriodSeconds": "0"}) as answer:
            if answer.status != 200:
                text = (await answer.read()).decode()[:500]
                raise RuntimeError(
                    f"deleting pod {namespace}/{name} answered {answer.status}: {text}"
                )

    async def count_pods(self, namespace: str) -> int:
        """Return how many pods the namespace holds."""
        async with self.session.get(f"/api/v1/namespaces/{namespace}/pods") as answer:
            listed: dict[str, Any] = await answer.json()
            return len(listed["items"])

    async def burst(self, namespace: str, bodies: list[dict[str, Any]], *, dry_run: bool) -> Burst:
        """Send every create at once; return the wall time until the last answer."""
        started = time.perf_counter()
        statuses = await asyncio.gather(
            *(self.create(namespace, body, dry_run=dry_run) for body in bodies)
        )
        return Burst(time.perf_counter() - started, dict(collections.Counter(statuses)))

    async def latency(self, namespace: str, body: dict[str, Any]) -> float:
        """Return the seconds one create takes; fail unless it is stored."""
        started = time.perf_counter()
        status, answer = await self._post_pod(namespace, body, dry_run=False)
        elapsed = time.perf_counter() - started
        if status != 201:
            raise RuntimeError(
                f"creating a pod in {namespace} answered HTTP {status}: {answer.decode()[:500]}"
            )
        return elapsed


def one_gpu_pods(resource: str, prefix: str, count: int) -> list[dict[str, Any]]:
    """Return `count` pods named `prefix-N`, each asking for one of `resource`."""
    return [pod_body({resource: "1"}, name=f"{prefix}-{index}") for index in range(count)]


async def interleaved_latencies(
    creator: PodCreator, kinds: Mapping[str, tuple[str, str]], *, count: int, prefix: str
) -> dict[str, list[float]]:
    """Create `count` pods of each kind one after another, taking the kinds in turn.

    `kinds` maps a kind to its namespace and the resource its pods ask for. Taking turns
    spreads the machine's changing load over every kind alike, so that the difference
    between two kinds is what they do, not when they ran.
    """
    latencies: dict[str, list[float]] = {kind: [] for kind in kinds}
    for index in range(count):
        for kind, (namespace, resource) in kinds.items():
            body = pod_body({resource: "1"}, name=f"{prefix}-{index}")
            latencies[kind].append(await creator.latency(namespace, body))
    return latencies
