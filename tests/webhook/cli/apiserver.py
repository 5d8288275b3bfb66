"""A small HTTP server that answers the Kubernetes API calls the CLI makes, from a table.

The CLI's client speaks to it as to an apiserver: real HTTP, real JSON, the apiserver's
Status objects for errors. It serves what a test puts in `objects` (path to object), and
answers 401 to every call when `token` is set and the caller does not present it.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class FakeApiserver:
    """What the server answers, and where it listens."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Paths the caller may not read: answered 403, as RBAC answers them.
    forbidden: set[str] = field(default_factory=set)
    token: str | None = None
    url: str = ""

    def kubeconfig(self, path: Path, *, token: str = "") -> Path:
        """Write a kubeconfig that reaches this server; return its path."""
        return write_kubeconfig(path, self.url, token=token)


def write_kubeconfig(path: Path, server: str, *, token: str = "", context: str = "test") -> Path:
    """Write a kubeconfig with one cluster, user and context; return its path."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": server}}],
        "users": [{"name": context, "user": {"token": token or "none"}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
    }
    path.write_text(json.dumps(config))
    return path


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _item_of(objects: dict[str, Any], path: str) -> Any:
    """The object named by the last segment of `path` in the list held at its collection."""
    collection, _, name = path.rpartition("/")
    for item in (objects.get(collection) or {}).get("items", []):
        if (item.get("metadata") or {}).get("name") == name:
            return item
    return None


@contextmanager
def fake_apiserver() -> Iterator[FakeApiserver]:
    """Run the server on a loopback port for the length of the block."""
    state = FakeApiserver()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            authorization = self.headers.get("Authorization")
            if state.token is not None and authorization != f"Bearer {state.token}":
                self._answer(401, _status(401, "Unauthorized", "Unauthorized"))
                return
            url = urllib.parse.urlsplit(self.path)
            path = url.path
            selector = (urllib.parse.parse_qs(url.query).get("labelSelector") or [""])[0]
            if path in state.forbidden:
                message = f'configmaps "{path.rsplit("/", 1)[-1]}" is forbidden'
                self._answer(403, _status(403, "Forbidden", message))
            elif path in state.objects:
                found = state.objects[path]
                if selector and "items" in found:
                    # Only the "has this label" selectors gpuadm sends.
                    items = [
                        item
                        for item in found["items"]
                        if selector in ((item.get("metadata") or {}).get("labels") or {})
                    ]
                    found = {**found, "items": items}
                self._answer(200, found)
            elif (item := _item_of(state.objects, path)) is not None:
                # An object read by name, from the list of its collection, as the apiserver does.
                self._answer(200, item)
            elif path.endswith(("/configmaps", "/pods")):
                self._answer(200, {"kind": "List", "metadata": {}, "items": []})
            else:
                name = path.rsplit("/", 1)[-1]
                self._answer(404, _status(404, "NotFound", f'"{name}" not found'))

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
