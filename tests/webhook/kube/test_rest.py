"""Lists and watches over the async client, against a small server that speaks as the
apiserver does: pages with `continue` tokens, watches streamed a line per event, the TLS
keeper's objects, and failures as a command says them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from webhook.kube.endpoint import LIST_PAGE_SIZE, Endpoint
from webhook.kube.errors import KubeError
from webhook.kube.rest import AsyncApi, WatchEvent, plainly

MakeServer = Callable[[web.Application], Awaitable[TestServer]]


def pod(name: str, version: str, *, padding: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team-a", "uid": name, "resourceVersion": version},
        "spec": {"padding": "x" * padding},
    }


@contextlib.asynccontextmanager
async def api_on(make_server: MakeServer, app: web.Application) -> AsyncIterator[AsyncApi]:
    server = await make_server(app)
    api = AsyncApi(
        Endpoint(str(server.make_url("")).rstrip("/"), None, None, None, False, lambda: "Bearer t")
    )
    try:
        yield api
    finally:
        await api.close()


async def test_pods_are_listed_page_by_page_with_the_first_pages_version(
    aiohttp_server: MakeServer,
) -> None:
    queries: list[dict[str, str]] = []
    pages = {"": ("a", "7"), "t1": ("b", "8"), "t2": ("c", "9")}
    following = {"": "t1", "t1": "t2", "t2": ""}

    async def list_pods(request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == "Bearer t"
        queries.append(dict(request.query))
        token = request.query.get("continue", "")
        name, version = pages[token]
        metadata = {"resourceVersion": version, "continue": following[token]}
        return web.json_response({"items": [pod(name, version)], "metadata": metadata})

    app = web.Application()
    app.router.add_get("/api/v1/pods", list_pods)
    async with api_on(aiohttp_server, app) as api:
        listed = [page async for page in api.list_pods("gpuadm.io/class")]
    assert [[p["metadata"]["name"] for p in page.items] for page in listed] == [["a"], ["b"], ["c"]]
    assert [page.resource_version for page in listed] == ["7", "8", "9"]
    assert [page.next_token for page in listed] == ["t1", "t2", None]
    assert [q.get("continue") for q in queries] == [None, "t1", "t2"]
    assert {q["limit"] for q in queries} == {str(LIST_PAGE_SIZE)}
    assert {q["labelSelector"] for q in queries} == {"gpuadm.io/class"}


def watch_app(
    lines: list[bytes], queries: list[dict[str, str]], *, status: int = 200
) -> web.Application:
    """An apiserver whose watches send `lines`, each write a chunk, then close."""

    async def watch(request: web.Request) -> web.StreamResponse:
        queries.append(dict(request.query))
        if status != 200:
            body = {"kind": "Status", "message": "pods is forbidden", "code": status}
            return web.json_response(body, status=status)
        response = web.StreamResponse()
        await response.prepare(request)
        for chunk in lines:
            await response.write(chunk)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/api/v1/pods", watch)
    app.router.add_get("/api/v1/namespaces/gpuadm-system/configmaps", watch)
    return app


def line(kind: str, obj: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": kind, "object": obj}) + b"\n"


async def test_a_watch_streams_events_and_bookmarks_however_the_lines_are_cut(
    aiohttp_server: MakeServer,
) -> None:
    large = line("MODIFIED", pod("b", "12", padding=300_000))  # longer than a read buffer
    bookmark = line("BOOKMARK", {"metadata": {"resourceVersion": "13"}})
    lines = [
        line("ADDED", pod("a", "11")),
        large[:1000],
        large[1000:200_000],
        large[200_000:] + bookmark[:5],
        bookmark[5:] + b"\n",  # a blank line is no event
        line("DELETED", pod("a", "14"))[:-1],  # the last line may come without its newline
    ]
    queries: list[dict[str, str]] = []
    async with api_on(aiohttp_server, watch_app(lines, queries)) as api:
        events = [
            event
            async for event in api.watch_pods(
                label_selector="gpuadm.io/class", resource_version="10", timeout_seconds=30
            )
        ]
    assert [(e["type"], e["object"]["metadata"]["resourceVersion"]) for e in events] == [
        ("ADDED", "11"),
        ("MODIFIED", "12"),
        ("BOOKMARK", "13"),
        ("DELETED", "14"),
    ]
    assert len(events[1]["object"]["spec"]["padding"]) == 300_000
    assert queries == [
        {
            "watch": "1",
            "labelSelector": "gpuadm.io/class",
            "resourceVersion": "10",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "30",
        }
    ]


async def test_an_expired_version_comes_as_an_error_event_and_closing_stops_the_watch(
    aiohttp_server: MakeServer,
) -> None:
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    lines = [line("ERROR", gone), line("ADDED", {"metadata": {"name": "gpuadm-policy"}})]
    queries: list[dict[str, str]] = []
    seen: list[WatchEvent] = []
    async with api_on(aiohttp_server, watch_app(lines, queries)) as api:
        watch = api.watch_configmaps(
            "gpuadm-system",
            label_selector="!gpuadm.io/usage-for",
            resource_version="5",
            timeout_seconds=30,
        )
        async with contextlib.aclosing(watch) as events:
            async for event in events:
                seen.append(event)
                if event["type"] == "ERROR":
                    break
    assert seen == [{"type": "ERROR", "object": gone}]
    assert queries[0]["labelSelector"] == "!gpuadm.io/usage-for"


async def test_a_refused_watch_is_a_kube_error_with_the_apiservers_message(
    aiohttp_server: MakeServer,
) -> None:
    queries: list[dict[str, str]] = []
    async with api_on(aiohttp_server, watch_app([], queries, status=403)) as api:
        with pytest.raises(KubeError) as refused:
            async for _ in api.watch_pods(
                label_selector="", resource_version="1", timeout_seconds=5
            ):
                pass
    assert refused.value.status == 403
    assert str(refused.value) == "403: pods is forbidden"


async def test_an_unreachable_apiserver_is_a_kube_error_without_status() -> None:
    api = AsyncApi(Endpoint("http://127.0.0.1:9", None, None, None, False, lambda: None))
    try:
        with pytest.raises(KubeError) as unreachable:
            async for _ in api.watch_pods(
                label_selector="", resource_version="1", timeout_seconds=5
            ):
                pass
        assert unreachable.value.status == 0
    finally:
        await api.close()


async def test_the_tls_secret_and_webhook_configurations_are_read_and_written_at_their_paths(
    aiohttp_server: MakeServer,
) -> None:
    stored: dict[str, dict[str, Any]] = {}
    calls: list[tuple[str, str]] = []

    async def handle(request: web.Request) -> web.Response:
        calls.append((request.method, request.path))
        if request.method == "GET":
            if request.path not in stored:
                status = {"kind": "Status", "message": "not found", "code": 404}
                return web.json_response(status, status=404)
            return web.json_response(stored[request.path])
        body = await request.json()
        path = (
            request.path
            if request.method == "PUT"
            else f"{request.path}/{body['metadata']['name']}"
        )
        stored[path] = body
        return web.json_response(body, status=201 if request.method == "POST" else 200)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    secret = {"metadata": {"name": "gpuadm-tls", "namespace": "gpuadm-system"}, "data": {}}
    configuration = {"metadata": {"name": "gpuadm"}, "webhooks": []}
    stored["/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/gpuadm"] = (
        configuration
    )
    async with api_on(aiohttp_server, app) as api:
        assert await api.get_secret("gpuadm-system", "gpuadm-tls") is None
        await api.create_secret("gpuadm-system", secret)
        await api.replace_secret("gpuadm-system", secret)
        assert await api.get_secret("gpuadm-system", "gpuadm-tls") == secret
        assert await api.get_webhook_configuration("mutating", "gpuadm") is None
        found = await api.get_webhook_configuration("validating", "gpuadm")
        assert found == configuration
        await api.replace_webhook_configuration("validating", configuration)
    secrets = "/api/v1/namespaces/gpuadm-system/secrets"
    admission = "/apis/admissionregistration.k8s.io/v1"
    assert calls == [
        ("GET", f"{secrets}/gpuadm-tls"),
        ("POST", secrets),
        ("PUT", f"{secrets}/gpuadm-tls"),
        ("GET", f"{secrets}/gpuadm-tls"),
        ("GET", f"{admission}/mutatingwebhookconfigurations/gpuadm"),
        ("GET", f"{admission}/validatingwebhookconfigurations/gpuadm"),
        ("PUT", f"{admission}/validatingwebhookconfigurations/gpuadm"),
    ]


async def test_a_webhook_configuration_is_deleted_by_kind_and_name_and_one_gone_is_no_error(
    aiohttp_server: MakeServer,
) -> None:
    admission = "/apis/admissionregistration.k8s.io/v1"
    stored = {f"{admission}/mutatingwebhookconfigurations/gpuadm"}
    calls: list[tuple[str, str]] = []

    async def delete(request: web.Request) -> web.Response:
        calls.append((request.method, request.path))
        if request.path == f"{admission}/validatingwebhookconfigurations/forbidden":
            status = {"kind": "Status", "message": "forbidden here", "code": 403}
            return web.json_response(status, status=403)
        if request.path not in stored:
            status = {"kind": "Status", "message": "not found", "code": 404}
            return web.json_response(status, status=404)
        stored.remove(request.path)
        return web.json_response({"kind": "Status", "status": "Success"})

    app = web.Application()
    app.router.add_delete("/{tail:.*}", delete)
    async with api_on(aiohttp_server, app) as api:
        assert await api.delete_webhook_configuration("mutating", "gpuadm") is True
        assert await api.delete_webhook_configuration("mutating", "gpuadm") is False
        assert await api.delete_webhook_configuration("validating", "gpuadm") is False
        with pytest.raises(KubeError) as refused:
            await api.delete_webhook_configuration("validating", "forbidden")
    assert refused.value.status == 403
    assert str(refused.value) == "403: forbidden here"
    assert calls == [
        ("DELETE", f"{admission}/mutatingwebhookconfigurations/gpuadm"),
        ("DELETE", f"{admission}/mutatingwebhookconfigurations/gpuadm"),
        ("DELETE", f"{admission}/validatingwebhookconfigurations/gpuadm"),
        ("DELETE", f"{admission}/validatingwebhookconfigurations/forbidden"),
    ]


async def test_a_command_says_where_the_apiserver_was_not_found_and_why() -> None:
    api = AsyncApi(Endpoint("http://127.0.0.1:9", None, None, None, False, lambda: None))
    try:
        with pytest.raises(KubeError) as unreachable:
            await api.get_secret("gpuadm-system", "gpuadm-tls")
    finally:
        await api.close()
    said = plainly(unreachable.value, api.endpoint)
    assert said.status == 0
    assert str(said) == "cannot reach the apiserver at http://127.0.0.1:9: Connection refused"


async def test_a_command_passes_the_apiservers_answer_on_as_it_came(
    aiohttp_server: MakeServer,
) -> None:
    async def forbidden(request: web.Request) -> web.Response:
        status = {"kind": "Status", "message": "secrets is forbidden", "code": 403}
        return web.json_response(status, status=403)

    app = web.Application()
    app.router.add_get("/{tail:.*}", forbidden)
    async with api_on(aiohttp_server, app) as api:
        with pytest.raises(KubeError) as refused:
            await api.get_secret("gpuadm-system", "gpuadm-tls")
    said = plainly(refused.value, api.endpoint)
    assert said is refused.value
    assert str(said) == "403: secrets is forbidden"
