"""gpuadm's own TLS in a cluster: one Secret shared by every replica, and the caBundle of
gpuadm's two webhook configurations (and no others) kept in step with it.

- Start: read the Secret; if there is none, issue a CA and a serving certificate and create
  it. When two replicas start at once, the apiserver lets one create win (409 for the
  other), and the loser adopts the winner's material, so the CA does not churn.
- Renewal: any replica may renew; the Secret write names the resourceVersion it read, so
  only one renewal lands, and the others adopt it on their next check.
- Trust first: a CA is merged into both caBundles before a Secret that serves a certificate
  it signed is written. CAs leave a bundle only when they expire. So there is no moment in
  which the apiserver distrusts the certificate a replica serves.
- Each replica writes the Secret's certificate and key to a local directory, where the
  certificate reloader picks them up without a restart.

The calls go through the async client (`webhook.kube.rest`), on the replica's event loop and
session; the key pairs are loaded, issued and written in a worker thread, so that no key is
made or parsed on the loop that answers reviews (merging a caBundle, which reads
certificates only, stays on it).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from certs import TLSPaths, ca_bundle, load_certified_key, write_tls_dir
from certs.rotation import TLSState, issue, renewed, rotate_ca
from webhook.kube.errors import KubeError
from webhook.kube.objects import MANAGED_BY

if TYPE_CHECKING:
    from webhook.kube.rest import AsyncApi

log = logging.getLogger("gpuadm.tls")

WEBHOOK_KINDS = ("mutating", "validating")
# How often a replica re-reads the Secret: it adopts another replica's renewal this fast.
CHECK_SECONDS = 60.0
# Each lost race means another replica wrote the Secret or a caBundle, which this replica
# then adopts; ten in a row only happen when something keeps rewriting them, and then the
# caller is told so instead of looping.
MAX_SYNC_ATTEMPTS = 10


@dataclass(frozen=True)
class TLSTarget:
    """What the keeper manages: the Secret, the webhook configurations, the names to serve."""

    namespace: str
    secret: str
    webhook_configuration: str
    dns_names: Sequence[str]
    ip_addresses: Sequence[str] = ()


class TLSKeeper:
    """Keeps the shared Secret, the caBundles and the local files in step."""

    def __init__(
        self,
        api: AsyncApi,
        target: TLSTarget,
        directory: Path,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """Keep `target` through `api`, writing the serving pair to `directory`.

        `clock` is the time renewals are judged by; tests move it forward.
        """
        self.api = api
        self.target = target
        self.directory = directory
        self.clock = clock
        self.state: TLSState | None = None

    async def run(
        self, progress: Callable[[], None] = lambda: None, *, every: float = CHECK_SECONDS
    ) -> None:
        """Check for renewals (ours or another replica's) until cancelled; `progress` is
        called after each check that succeeded."""
        while True:
            await asyncio.sleep(every)
            try:
                await self.sync()
            except KubeError as error:
                log.warning("TLS check failed, retrying later: %s", error)
                continue
            progress()

    async def sync(self, *, rotate: bool = False) -> TLSPaths:
        """One pass: read, renew or rotate if due (or asked), trust, store, write files."""
        for _ in range(MAX_SYNC_ATTEMPTS):
            secret = await self.api.get_secret(self.target.namespace, self.target.secret)
            state, next_state = await asyncio.to_thread(self._read_and_next, secret, rotate)
            try:
                if next_state is not None:
                    await self.trust(next_state)
                    await self._store(next_state, secret)
                    log.info("TLS material %s", "created" if state is None else "renewed")
                    state = next_state
                assert state is not None
                await self.trust(state)
            except KubeError as error:
                if error.status == 409:
                    continue  # another replica wrote first: adopt what it wrote
                raise
            self.state = state
            return await asyncio.to_thread(
                write_tls_dir, self.directory, ca=state.ca, serving=state.serving
            )
        raise KubeError(409, f"Secret {self.target.secret} kept changing; try again")

    def _read_and_next(
        self, secret: dict[str, Any] | None, rotate: bool
    ) -> tuple[TLSState | None, TLSState | None]:
        """Return the Secret's material, and what replaces it if anything is due."""
        state = _state_of(secret) if secret else None
        return state, self._next(state, rotate=rotate)

    def _next(self, state: TLSState | None, *, rotate: bool) -> TLSState | None:
        now = self.clock()
        names = {"dns_names": self.target.dns_names, "ip_addresses": self.target.ip_addresses}
        if state is None:
            return issue(now=now, **names)
        if rotate:
            return rotate_ca(state, now=now, **names)
        return renewed(state, now=now, **names)

    async def trust(self, state: TLSState) -> None:
        """Merge the state's CAs into both webhook configurations' caBundle (by name only)."""
        now = self.clock()
        for kind in WEBHOOK_KINDS:
            configuration = await self.api.get_webhook_configuration(
                kind, self.target.webhook_configuration
            )
            if configuration is None:
                log.warning(
                    "%s webhook configuration %s not found; cannot set its caBundle",
                    kind,
                    self.target.webhook_configuration,
                )
                continue
            changed = False
            for webhook in configuration.get("webhooks") or []:
                client = webhook.setdefault("clientConfig", {})
                current = base64.b64decode(client.get("caBundle") or "")
                bundle = ca_bundle(*_valid_pems(current), *state.trusted(), now=now)
                encoded = base64.b64encode(bundle).decode()
                if client.get("caBundle") != encoded:
                    client["caBundle"] = encoded
                    changed = True
            if changed:
                await self.api.replace_webhook_configuration(kind, configuration)

    async def _store(self, state: TLSState, secret: dict[str, Any] | None) -> None:
        data = {
            "tls.crt": state.serving.cert_pem,
            "tls.key": state.serving.key_pem,
            "ca.crt": state.ca.cert_pem,
            "ca.key": state.ca.key_pem,
        }
        if state.previous_ca is not None:
            data["ca-previous.crt"] = state.previous_ca
        metadata: dict[str, Any] = {
            "name": self.target.secret,
            "namespace": self.target.namespace,
            "labels": dict(MANAGED_BY),
        }
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": metadata,
            "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
        }
        if secret is None:
            await self.api.create_secret(self.target.namespace, body)
        else:
            metadata["resourceVersion"] = secret["metadata"]["resourceVersion"]
            await self.api.replace_secret(self.target.namespace, body)


def secret_data(secret: dict[str, Any]) -> dict[str, bytes]:
    """Return a Secret's data, decoded."""
    return {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}


def _state_of(secret: dict[str, Any]) -> TLSState | None:
    """Read the material of a Secret; None (issue anew) if it lacks what gpuadm needs."""
    data = secret_data(secret)
    try:
        serving = load_certified_key(data["tls.crt"], data["tls.key"])
        ca = load_certified_key(data["ca.crt"], data["ca.key"])
    except (KeyError, ValueError) as error:
        log.warning(
            "Secret %s holds no usable CA and certificate (%s); issuing new ones",
            secret["metadata"]["name"],
            error,
        )
        return None
    return TLSState(ca, serving, data.get("ca-previous.crt"))


def _valid_pems(bundle: bytes) -> list[bytes]:
    """Return the certificates of a caBundle, or nothing if it holds none."""
    return [bundle] if b"BEGIN CERTIFICATE" in bundle else []
