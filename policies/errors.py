"""The one error family of the pure core: the pod (or its update) is not acceptable."""

from __future__ import annotations


class Denial(Exception):
    """The object under review breaks a rule; `message` is what the user is shown."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
