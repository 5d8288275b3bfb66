"""How a failed call to the apiserver is reported, whichever client made it."""

from __future__ import annotations

import contextlib

import orjson


class KubeError(Exception):
    """A call to the apiserver failed; `status` is the HTTP status, 0 if none came back."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status


def status_message(body: bytes | str | None, fallback: str) -> str:
    """Return the message of the Status object the apiserver sent with an error, or `fallback`."""
    with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError):
        message = orjson.loads(body or b"").get("message")
        if message:
            return str(message)
    return fallback
