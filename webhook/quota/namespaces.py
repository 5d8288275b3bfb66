"""Which namespaces exist: quota state is kept only for namespaces the apiserver knows.

The apiserver never sends a review for a pod in a namespace that does not exist (its
NamespaceLifecycle admission refuses such a create first), so a review that names one was
forged. Refusing it before anything is written keeps forged reviews from leaving records
or metric series behind.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # For its type only: the namespace check runs in `gpuadm review` with no apiserver, and
    # the transport (aiohttp) loads only where a replica asks one.
    from webhook.kube.rest import AsyncApi

# A namespace seen to exist is taken to exist this long without asking again. Deleting a
# namespace takes its pods with it, so a stale "exists" costs at most a short-lived record.
REMEMBER_SECONDS = 300.0


class KnownNamespaces:
    """Asks the apiserver whether a namespace exists, remembering the ones that do."""

    def __init__(
        self,
        api: AsyncApi,
        *,
        clock: Callable[[], float] = time.monotonic,
        remember_seconds: float = REMEMBER_SECONDS,
    ) -> None:
        """Ask through `api`; remember an existing namespace for `remember_seconds`."""
        self.api = api
        self.clock = clock
        self.remember_seconds = remember_seconds
        # Only namespaces that exist are remembered, so this holds at most the cluster's own.
        self._seen: dict[str, float] = {}

    async def exists(self, name: str) -> bool:
        """Tell whether the namespace exists (raises `KubeError` if the apiserver fails)."""
        now = self.clock()
        seen = self._seen.get(name)
        if seen is not None and now - seen < self.remember_seconds:
            return True
        found = await self.api.get_namespace(name)
        if found is None:
            self._seen.pop(name, None)
            return False
        self._seen[name] = now
        return True


async def every_namespace_exists(name: str) -> bool:
    """Standalone: there is no cluster to ask, and no one else to send reviews."""
    return True
