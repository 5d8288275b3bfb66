"""Every call gpuadm makes to the apiserver, straight from the event loop.

A quota admission reads and writes the namespace's usage record, and asks whether the
namespace exists, while the apiserver waits for the answer. The official client is
synchronous: every call would hop to a worker thread and through its object machinery.
These calls go over one keep-alive aiohttp session instead, with the server, CA, client
certificate and token that the kubeconfig names (the token re-read on each call, so rotated
tokens are used). The rest of what a replica reads and writes (the pod watch, the config's
ConfigMaps, Leases, Events, the TLS Secret and caBundles) shares the session, and the
one-shot commands make the same calls from an event loop of their own.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson

from webhook.kube.endpoint import LIST_PAGE_SIZE, RESOURCE_API, Endpoint
from webhook.kube.errors import KubeError, status_message
from webhook.kube.objects import EVENT_MESSAGE_MAX, Page

# Connections kept open to the apiserver: enough for a burst's record writes and namespace
# checks to overlap, few enough not to matter to the apiserver.
MAX_CONNECTIONS = 8
# An admission must be answered within the webhook timeout (5 s in the shipped
# configurations); a call that takes longer has failed for that admission anyway.
CALL_TIMEOUT_SECONDS = 4.0
# The watches held open at once (pods, the config's ConfigMaps), each on a connection of its
# own beside those of the admission path.
WATCHES = 2
# A watch ends when the apiserver closes it at its `timeoutSeconds`; one silent for this much
# longer has lost the apiserver, and fails.
WATCH_GRACE_SECONDS = 30.0

# One event of a watch: its `type` (ADDED, MODIFIED, DELETED, BOOKMARK, ERROR) and `object`.
WatchEvent = dict[str, Any]


ADMISSION_API = "/apis/admissionregistration.k8s.io/v1"
COORDINATION_API = "/apis/coordination.k8s.io/v1"
CORE_API = "/api/v1"
BATCH_API = "/apis/batch/v1"
# The API each form of PodGroup is served under (policies.workloads.gangs names the forms).
POD_GROUP_APIS = {
    "coscheduling": "/apis/scheduling.x-k8s.io/v1alpha1",
    "volcano": "/apis/scheduling.volcano.sh/v1beta1",
    "kai": "/apis/scheduling.run.ai/v2alpha2",
}
# gpuadm's own API: the GPUQuota objects that show tenants their quota (deploy/base/crd.yaml).
GPUADM_API = "/apis/gpuadm.io/v1alpha1"
JSON_PATCH = "application/json-patch+json"
# gpuadm's two webhook configurations, by the kind the TLS keeper names them with.
WEBHOOK_CONFIGURATIONS = {
    "mutating": "mutatingwebhookconfigurations",
    "validating": "validatingwebhookconfigurations",
}


class AsyncApi:
    """The calls of the admission path and of the leader's work (releasing waiting pods,
    their Events, the GPUQuota objects), over one session opened on first use."""

    def __init__(self, endpoint: Endpoint) -> None:
        """Call the apiserver at `endpoint`."""
        self.endpoint = endpoint
        self._session: aiohttp.ClientSession | None = None

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a ConfigMap, or None if it does not exist."""
        return await self._call_or_none("GET", _configmap_path(namespace, name))

    async def create_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a ConfigMap; a 409 means someone created it first."""
        return await self._call("POST", _configmap_path(namespace), body)

    async def replace_configmap(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a ConfigMap at the resourceVersion in `body`; a 409 means it changed."""
        path = _configmap_path(namespace, body["metadata"]["name"])
        return await self._call("PUT", path, body)

    async def delete_configmap(self, namespace: str, name: str, *, resource_version: str) -> None:
        """Delete a ConfigMap if it is still at `resource_version`; a 409 means it changed."""
        precondition = {"preconditions": {"resourceVersion": resource_version}}
        await self._call("DELETE", _configmap_path(namespace, name), precondition)

    async def list_configmaps(self, namespace: str, label_selector: str) -> Page:
        """Return the ConfigMaps of a namespace with the labels, at the version of the list."""
        items: list[dict[str, Any]] = []
        version = ""
        async for page in self.list_pages(_configmap_path(namespace), label_selector):
            items += page.items
            version = version or page.resource_version
        return Page(items, version, None)

    def watch_configmaps(
        self, namespace: str, *, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncGenerator[WatchEvent]:
        """Watch the ConfigMaps of a namespace with the labels (see `watch`)."""
        return self.watch(
            _configmap_path(namespace),
            label_selector=label_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
        )

    def list_pods(
        self, label_selector: str = "", *, namespace: str | None = None
    ) -> AsyncGenerator[Page]:
        """Yield the pods of every namespace (or of one) with the labels, page by page; the
        first page's version is the list's."""
        path = f"{CORE_API}/pods" if namespace is None else _namespaced(CORE_API, namespace, "pods")
        return self.list_pages(path, label_selector)

    def watch_pods(
        self, *, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncGenerator[WatchEvent]:
        """Watch the pods of every namespace with the labels (see `watch`)."""
        return self.watch(
            f"{CORE_API}/pods",
            label_selector=label_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
        )

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a Secret, or None if it does not exist."""
        return await self._call_or_none("GET", _namespaced(CORE_API, namespace, "secrets", name))

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a Secret; a 409 means someone created it first."""
        return await self._call("POST", _namespaced(CORE_API, namespace, "secrets"), body)

    async def replace_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a Secret at the resourceVersion in `body`; a 409 means it changed."""
        path = _namespaced(CORE_API, namespace, "secrets", body["metadata"]["name"])
        return await self._call("PUT", path, body)

    async def get_webhook_configuration(self, kind: str, name: str) -> dict[str, Any] | None:
        """Return the Mutating- (`kind` "mutating") or ValidatingWebhookConfiguration
        `name`, or None if it does not exist."""
        return await self._call_or_none("GET", _webhook_configuration_path(kind, name))

    async def replace_webhook_configuration(
        self, kind: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Replace a webhook configuration at its resourceVersion; a 409 means it changed."""
        path = _webhook_configuration_path(kind, body["metadata"]["name"])
        return await self._call("PUT", path, body)

    async def delete_webhook_configuration(self, kind: str, name: str) -> bool:
        """Delete a webhook configuration (`kind` "mutating" or "validating"); return False
        if there was none of that name (already gone is no error)."""
        try:
            await self._call("DELETE", _webhook_configuration_path(kind, name))
        except KubeError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def get_namespace(self, name: str) -> dict[str, Any] | None:
        """Return a Namespace, or None if it does not exist."""
        return await self._call_or_none("GET", f"/api/v1/namespaces/{quote(name, safe='')}")

    async def create_claim_template(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a ResourceClaimTemplate; a 409 means it exists."""
        return await self._call(
            "POST", _namespaced(RESOURCE_API, namespace, "resourceclaimtemplates"), body
        )

    async def get_claim_template(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a ResourceClaimTemplate, or None if it does not exist."""
        path = _namespaced(RESOURCE_API, namespace, "resourceclaimtemplates", name)
        return await self._call_or_none("GET", path)

    async def delete_claim_template(self, namespace: str, name: str, uid: str) -> None:
        """Delete a ResourceClaimTemplate if it is still the object `uid`; 404 and 409 are
        raised as `KubeError`."""
        path = _namespaced(RESOURCE_API, namespace, "resourceclaimtemplates", name)
        await self._call("DELETE", path, {"preconditions": {"uid": uid}})

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a ResourceClaim, or None if it does not exist."""
        return await self._call_or_none(
            "GET", _namespaced(RESOURCE_API, namespace, "resourceclaims", name)
        )

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a Lease, or None if it does not exist."""
        return await self._call_or_none(
            "GET", _namespaced(COORDINATION_API, namespace, "leases", name)
        )

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a Lease; a 409 means someone created it first."""
        return await self._call("POST", _namespaced(COORDINATION_API, namespace, "leases"), body)

    async def replace_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a Lease at the resourceVersion in `body`; a 409 means it changed."""
        path = _namespaced(COORDINATION_API, namespace, "leases", body["metadata"]["name"])
        return await self._call("PUT", path, body)

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a Job, or None if it does not exist."""
        return await self._call_or_none("GET", _namespaced(BATCH_API, namespace, "jobs", name))

    async def get_pod_group(self, form: str, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a PodGroup of a form of `POD_GROUP_APIS`, or None if it does not exist (or
        its API is not served)."""
        path = _namespaced(POD_GROUP_APIS[form], namespace, "podgroups", name)
        return await self._call_or_none("GET", path)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a Pod, or None if it does not exist."""
        return await self._call_or_none("GET", _namespaced(CORE_API, namespace, "pods", name))

    async def patch_pod(
        self, namespace: str, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Apply a JSON patch to a Pod; a failed `test` operation is a 422."""
        path = _namespaced(CORE_API, namespace, "pods", name)
        return await self._call("PATCH", path, patch, content_type=JSON_PATCH)

    async def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """Ask the apiserver to evict a Pod, as `kubectl drain` does: it honours the pod's
        PodDisruptionBudgets, refusing with 429 while one allows no disruption. The uid is
        a precondition, so a pod made again under the same name is never evicted."""
        path = _namespaced(CORE_API, namespace, "pods", name) + "/eviction"
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        await self._call("POST", path, body)

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a core/v1 Event; a 409 means one of that name exists."""
        return await self._call("POST", _namespaced(CORE_API, namespace, "events"), body)

    async def get_event(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a core/v1 Event, or None if it does not exist (or expired)."""
        return await self._call_or_none("GET", _namespaced(CORE_API, namespace, "events", name))

    async def replace_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a core/v1 Event at the resourceVersion in `body`."""
        path = _namespaced(CORE_API, namespace, "events", body["metadata"]["name"])
        return await self._call("PUT", path, body)

    async def record_event(
        self,
        *,
        namespace: str,
        kind: str,
        name: str,
        uid: str,
        reason: str,
        message: str,
        warning: bool,
    ) -> None:
        """Record a core/v1 Event about an object, for `kubectl describe` to show."""
        now = datetime.now(UTC).isoformat()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": kind,
                "name": name,
                "namespace": namespace,
                "uid": uid,
            },
            "reason": reason,
            "message": message[:EVENT_MESSAGE_MAX],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "gpuadm"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self.create_event(namespace, body)

    async def create_quota_status(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a GPUQuota object; a 409 means one of that name exists."""
        return await self._call("POST", _namespaced(GPUADM_API, namespace, "gpuquotas"), body)

    async def serves_quota_api(self) -> bool:
        """Tell whether the apiserver serves the GPUQuota API, that is, its CRD is installed
        (discovery, which every authenticated user may read)."""
        return await self._call_or_none("GET", GPUADM_API) is not None

    async def get_quota_status(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Return a GPUQuota object, or None if it does not exist."""
        return await self._call_or_none(
            "GET", _namespaced(GPUADM_API, namespace, "gpuquotas", name)
        )

    async def replace_quota_status(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a GPUQuota object at the resourceVersion in `body`."""
        path = _namespaced(GPUADM_API, namespace, "gpuquotas", body["metadata"]["name"])
        return await self._call("PUT", path, body)

    async def delete_quota_status(self, namespace: str, name: str) -> None:
        """Delete a GPUQuota object; one already gone is no error."""
        try:
            await self._call("DELETE", _namespaced(GPUADM_API, namespace, "gpuquotas", name))
        except KubeError as error:
            if error.status != 404:
                raise

    async def list_all(self, path: str, label_selector: str) -> list[dict[str, Any]]:
        """Return every object of a collection (e.g. `/api/v1/pods`) with the labels, page by
        page."""
        items: list[dict[str, Any]] = []
        async for page in self.list_pages(path, label_selector):
            items += page.items
        return items

    async def list_pages(self, path: str, label_selector: str = "") -> AsyncGenerator[Page]:
        """Yield a collection's objects with the labels, `LIST_PAGE_SIZE` at a time, each page
        with its version and the token of the next (None on the last)."""
        token = ""
        while True:
            query = {"labelSelector": label_selector, "limit": str(LIST_PAGE_SIZE)}
            if token:
                query["continue"] = token
            body = await self._call("GET", f"{path}?{urlencode(query)}")
            metadata = body.get("metadata") or {}
            token = metadata.get("continue") or ""
            yield Page(body.get("items") or [], metadata.get("resourceVersion", ""), token or None)
            if not token:
                return

    async def watch(
        self, path: str, *, label_selector: str, resource_version: str, timeout_seconds: int
    ) -> AsyncGenerator[WatchEvent]:
        """Yield the events of one watch call on a collection from `resource_version`, with
        bookmarks, until the apiserver ends it at `timeout_seconds`.

        An expired version comes as an ERROR event with code 410, for the caller to list
        again; a refused call is raised as `KubeError`. Close the iterator (`aclosing`) to
        stop early and free the connection.
        """
        query = urlencode(
            {
                "watch": "1",
                "labelSelector": label_selector,
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(timeout_seconds),
            }
        )
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=CALL_TIMEOUT_SECONDS,
            sock_read=timeout_seconds + WATCH_GRACE_SECONDS,
        )
        try:
            async with self._open().get(
                f"{self.endpoint.host}{path}?{query}", headers=self._headers(), timeout=timeout
            ) as response:
                if response.status >= 400:
                    payload = await response.read()
                    raise KubeError(
                        response.status, status_message(payload, f"HTTP {response.status}")
                    )
                async for line in _lines(response.content):
                    yield orjson.loads(line)
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise KubeError(0, f"watch {path}: {error or type(error).__name__}") from None

    async def hold_open(self, progress: Callable[[], None] = lambda: None) -> None:
        """Keep the session for the life of the app; close it when cancelled."""
        progress()
        try:
            await asyncio.Event().wait()
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the session, if one is open."""
        if self._session is not None:
            await self._session.close()

    async def _call_or_none(self, method: str, path: str) -> dict[str, Any] | None:
        try:
            return await self._call(method, path)
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | list[dict[str, Any]] | None = None,
        *,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        headers = self._headers()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = orjson.dumps(body)
        try:
            async with self._open().request(
                method, self.endpoint.host + path, data=data, headers=headers
            ) as response:
                payload = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            # The cause stays attached, for a command to say why no answer came (`plainly`).
            raise KubeError(0, f"{method} {path}: {error or type(error).__name__}") from error
        if status >= 400:
            raise KubeError(status, status_message(payload, f"HTTP {status}"))
        result: dict[str, Any] = orjson.loads(payload)
        return result

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if (authorization := self.endpoint.authorization()) is not None:
            headers["Authorization"] = authorization
        return headers

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                ssl=self.endpoint.ssl_context(), limit=MAX_CONNECTIONS + WATCHES
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_SECONDS),
                trust_env=False,
            )
        return self._session


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Yield the non-empty lines of a stream, however long (a watch event holds a whole
    object, a ConfigMap of up to 1 MiB), however the chunks fall."""
    pending: list[bytes] = []
    async for chunk in stream.iter_any():
        if b"\n" not in chunk:
            pending.append(chunk)
            continue
        *lines, rest = (b"".join(pending) + chunk).split(b"\n")
        pending = [rest]
        for line in lines:
            if line.strip():
                yield line
    if (last := b"".join(pending)).strip():
        yield last


def plainly(error: KubeError, endpoint: Endpoint) -> KubeError:
    """Return a failed call as a command tells its user: the apiserver's answer as it came,
    or, when none came, where the apiserver was and why it could not be reached
    (`cannot reach the apiserver at https://10.0.0.1:6443: Connection refused`)."""
    cause = error.__cause__
    if error.status or cause is None:
        return error
    return KubeError(0, f"cannot reach the apiserver at {endpoint.host}: {_why(cause)}")


def _why(error: BaseException) -> str:
    """Say why a connection failed as the system says it, without aiohttp's wrapping (which
    names the connection's SSL context object)."""
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        return str(error.certificate_error)
    reason = error.os_error if isinstance(error, aiohttp.ClientConnectorError) else error
    if isinstance(reason, OSError) and not isinstance(reason, ssl.SSLError):
        if reason.errno and reason.errno > 0:
            return os.strerror(reason.errno)  # "Connection refused", not the call that failed
        if reason.strerror:
            return reason.strerror  # a resolver's error: "Name or service not known"
    return str(reason) or type(reason).__name__


def _webhook_configuration_path(kind: str, name: str) -> str:
    return f"{ADMISSION_API}/{WEBHOOK_CONFIGURATIONS[kind]}/{quote(name, safe='')}"


def _namespaced(api: str, namespace: str, resource: str, name: str | None = None) -> str:
    path = f"{api}/namespaces/{quote(namespace, safe='')}/{resource}"
    return path if name is None else f"{path}/{quote(name, safe='')}"


def _configmap_path(namespace: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/configmaps"
    return path if name is None else f"{path}/{quote(name, safe='')}"
