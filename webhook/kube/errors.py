"""How a failed call to the apiserver is reported, whichever client made it."""

from __future__ import annotations


class KubeError(Exception):
    """A call to the apiserver failed; `status` is the HTTP status, 0 if none came back."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
