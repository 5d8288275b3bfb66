"""Read the ResourceClaims a pod names, to judge if they hold GPUs (`policies.access.claims`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from webhook.claims.templates import ClaimError
from webhook.kube.errors import KubeError

if TYPE_CHECKING:
    from webhook.kube.rest import AsyncApi


class Claims(Protocol):
    """Reads a ResourceClaim of a namespace."""

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return the claim, None if it does not exist; raise `ClaimError` if unknown."""
        ...


class ClusterClaims:
    """Claims read from the apiserver, over the admission path's session."""

    def __init__(self, api: AsyncApi) -> None:
        """Read claims with `api`."""
        self.api = api

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return the claim, None if it does not exist; raise `ClaimError` on failure."""
        try:
            return await self.api.get_claim(namespace, name)
        except KubeError as error:
            raise ClaimError(
                f"could not read ResourceClaim {name} in namespace {namespace}: {error}; retry"
            ) from None


class NoClaims:
    """No claims to read: gpuadm serves from files, with no apiserver."""

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Refuse: what the claim holds cannot be known."""
        raise ClaimError(
            f"the pod names ResourceClaim {name}, and this gpuadm, serving from files, cannot "
            "read it to tell whether it holds GPUs"
        )
