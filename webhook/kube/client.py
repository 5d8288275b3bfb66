"""The one module that imports the official Kubernetes client, for what it alone does well:
finding the cluster as kubectl does.

A kubeconfig (its contexts, clusters, client certificates and tokens, as kubectl reads
them) or the pod's service account is read here, and handed to the async client
(`webhook.kube.rest`) as an `Endpoint`: the apiserver's address, its CA, the client
certificate, and the Authorization header, built through the official client's refresh hook
so that a rotated service-account token is used. The header is built again at most every
`AUTHORIZATION_SECONDS`: the hook reloads the whole kubeconfig (and reads every proxy
variable of the environment) each time, a fifth of what an admission's write of its quota
record cost gpuadm's CPU when it ran on every call. The official client itself re-reads a
service account's token once a minute. Every call to the apiserver goes through the async
client.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import kubernetes.client
import kubernetes.config

from webhook.kube.endpoint import Endpoint, file_or_none
from webhook.kube.errors import KubeError

__all__ = ["Kube", "KubeError", "connect"]

# How long an Authorization header, once built, is used before it is built again.
AUTHORIZATION_SECONDS = 10.0


def connect(kubeconfig: str | None, *, context: str | None = None) -> Kube:
    """Connect with `kubeconfig` (and a context of it), else the files `$KUBECONFIG` lists,
    else in a pod with its service account, else with ~/.kube/config.

    `$KUBECONFIG` comes before the service account, as for kubectl: a command run in a CI
    pod against another cluster must reach that cluster, not the one it runs in. A pod's
    own account comes before ~/.kube/config, which kubectl reads first: in a pod, only a
    file named on purpose takes gpuadm elsewhere. A `$KUBECONFIG` naming no file is an
    error, never a fall back to the pod's own cluster."""
    try:
        if (
            kubeconfig
            or context
            or os.environ.get("KUBECONFIG")
            or not os.environ.get("KUBERNETES_SERVICE_HOST")
        ):
            # Named here, not left to the client's default, which it reads once at import.
            files = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            client = kubernetes.config.new_client_from_config(
                config_file=os.path.expanduser(files), context=context
            )
        else:
            kubernetes.config.load_incluster_config()
            client = kubernetes.client.ApiClient()
    except (kubernetes.config.ConfigException, OSError) as error:
        raise KubeError(0, f"cannot reach a cluster: {error}") from None
    return Kube(client)


class Kube:
    """A cluster as its kubeconfig (or service account) names it."""

    def __init__(
        self,
        client: kubernetes.client.ApiClient,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._configuration = client.configuration
        self._clock = clock

    def endpoint(self) -> Endpoint:
        """Return the apiserver's address and credentials, for the calls made from the loop."""
        configuration = self._configuration
        clock = self._clock
        built_at, header = float("-inf"), None

        def authorization() -> str | None:
            nonlocal built_at, header
            now = clock()
            if now - built_at >= AUTHORIZATION_SECONDS:
                # As the client itself builds the header: through its refresh hook, so that
                # a rotated service-account token is used.
                setting = configuration.auth_settings().get("BearerToken") or {}
                value = setting.get("value")
                built_at, header = now, str(value) if value else None
            return header

        return Endpoint(
            host=str(configuration.host).rstrip("/"),
            ca_file=file_or_none(configuration.ssl_ca_cert),
            cert_file=file_or_none(configuration.cert_file),
            key_file=file_or_none(configuration.key_file),
            verify=bool(configuration.verify_ssl),
            authorization=authorization,
        )
