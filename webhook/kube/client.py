"""The one module that imports the official Kubernetes client: the calls gpuadm makes.

Objects travel as plain dicts decoded with orjson (`_preload_content=False`): the client's
model classes cost far more to build than the JSON costs to parse, and gpuadm reads only a
few fields. Every call here blocks; callers run them with `asyncio.to_thread`.
"""

from __future__ import annotations

import os
from typing import Any

import kubernetes.client
import kubernetes.config
import orjson
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from webhook.kube.endpoint import LIST_PAGE_SIZE, Endpoint, file_or_none
from webhook.kube.errors import KubeError, status_message
from webhook.kube.objects import MANAGED_BY, USAGE_RECORD_LABEL, Page

__all__ = [
    "LIST_PAGE_SIZE",
    "MANAGED_BY",
    "USAGE_RECORD_LABEL",
    "Kube",
    "KubeError",
    "Page",
    "connect",
]


def connect(kubeconfig: str | None, *, context: str | None = None) -> Kube:
    """Connect with a kubeconfig file (and a context of it), or in-cluster with the pod's
    service account."""
    try:
        if kubeconfig or context or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            client = kubernetes.config.new_client_from_config(
                config_file=kubeconfig, context=context
            )
        else:
            kubernetes.config.load_incluster_config()
            client = kubernetes.client.ApiClient()
    except (kubernetes.config.ConfigException, OSError) as error:
        raise KubeError(0, f"cannot reach a cluster: {error}") from None
    return Kube(client)


class Kube:
    """The calls gpuadm makes, on plain dicts."""

    def __init__(self, client: kubernetes.client.ApiClient) -> None:
        self._core = kubernetes.client.CoreV1Api(client)
        self._admission = kubernetes.client.AdmissionregistrationV1Api(client)
        self._configuration = client.configuration

    def endpoint(self) -> Endpoint:
        """Return the apiserver's address and credentials, for the calls made from the loop."""
        configuration = self._configuration

        def authorization() -> str | None:
            # As the client itself builds the header: through its refresh hook, so that a
            # rotated service-account token is used.
            setting = configuration.auth_settings().get("BearerToken") or {}
            value = setting.get("value")
            return str(value) if value else None

        return Endpoint(
            host=str(configuration.host).rstrip("/"),
            ca_file=file_or_none(configuration.ssl_ca_cert),
            cert_file=file_or_none(configuration.cert_file),
            key_file=file_or_none(configuration.key_file),
            verify=bool(configuration.verify_ssl),
            authorization=authorization,
        )

    def list_pods(
        self,
        *,
        label_selector: str = "",
        limit: int = LIST_PAGE_SIZE,
        token: str | None = None,
        namespace: str | None = None,
    ) -> Page:
        """List one page of pods, in all namespaces or in one."""
        call: Any = self._core.list_pod_for_all_namespaces
        args: tuple[str, ...] = ()
        if namespace is not None:
            call, args = self._core.list_namespaced_pod, (namespace,)
        body = self._json(call, *args, label_selector=label_selector, limit=limit, _continue=token)
        metadata = body.get("metadata") or {}
        return Page(
            body.get("items") or [], metadata.get("resourceVersion", ""), metadata.get("continue")
        )

    def list_configmaps(self, namespace: str, *, label_selector: str = "") -> Page:
        """List the ConfigMaps of a namespace."""
        body = self._json(
            self._core.list_namespaced_config_map, namespace, label_selector=label_selector
        )
        metadata = body.get("metadata") or {}
        return Page(body.get("items") or [], metadata.get("resourceVersion", ""), None)

    def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a Secret, or None if it does not exist."""
        return self._json_or_none(self._core.read_namespaced_secret, name, namespace)

    def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a Secret; a 409 means someone created it first."""
        return self._json(self._core.create_namespaced_secret, namespace, body)

    def replace_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a Secret at the resourceVersion in `body`; a 409 means it changed."""
        name = body["metadata"]["name"]
        return self._json(self._core.replace_namespaced_secret, name, namespace, body)

    def get_webhook_configuration(self, kind: str, name: str) -> dict[str, Any] | None:
        """Return the Mutating- or ValidatingWebhookConfiguration `name`, or None."""
        read = (
            self._admission.read_mutating_webhook_configuration
            if kind == "mutating"
            else self._admission.read_validating_webhook_configuration
        )
        return self._json_or_none(read, name)

    def replace_webhook_configuration(self, kind: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a webhook configuration at its resourceVersion; a 409 means it changed."""
        replace = (
            self._admission.replace_mutating_webhook_configuration
            if kind == "mutating"
            else self._admission.replace_validating_webhook_configuration
        )
        return self._json(replace, body["metadata"]["name"], body)

    @classmethod
    def _json_or_none(cls, call: Any, *args: Any) -> dict[str, Any] | None:
        """Call a read; None when the object does not exist (404)."""
        try:
            return cls._json(call, *args)
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    @staticmethod
    def _json(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            response = call(*args, _preload_content=False, **kwargs)
        except ApiException as error:
            raise KubeError(error.status or 0, _reason(error)) from None
        except (OSError, urllib3.exceptions.HTTPError) as error:  # refused, reset, TLS failure
            raise KubeError(0, _unreachable(error)) from None
        data: dict[str, Any] = orjson.loads(response.data)
        return data


def _unreachable(error: Exception) -> str:
    """Say why the apiserver could not be reached, without urllib3's retry bookkeeping."""
    if isinstance(error, urllib3.exceptions.MaxRetryError):
        pool = error.pool
        where = f"{pool.scheme}://{pool.host}:{pool.port}" if pool is not None else "apiserver"
        cause = error.reason
        detail = str(cause)
        errno = getattr(cause, "__context__", None)
        if isinstance(errno, OSError) and errno.strerror:
            detail = errno.strerror
        elif "Errno" in detail and "]" in detail:
            detail = detail.rsplit("]", 1)[1].strip(" ')\"")
        return f"cannot reach the apiserver at {where}: {detail}"
    return f"cannot reach the apiserver: {error}"


def _reason(error: ApiException) -> str:
    return status_message(error.body, str(error.reason))
