"""Leaving without failing a call: a replica told to stop first drains, then stops.

In a cluster the kubelet sends SIGTERM when a replica's pod is deleted (a rollout, a drain, a
scale-down), while the Service still lists the pod: the endpoint controller, and then each
apiserver, learn of it a moment later. A replica that stopped listening at once would refuse
the calls sent in that moment, and the validating webhook fails closed, so each refusal is a
failed pod create. The apiserver also keeps connections to a replica open and reuses them,
and a request on a connection the replica has just closed fails the same way.

So for `--shutdown-delay-seconds` after SIGTERM a replica keeps serving, but fails /readyz
(its endpoint leaves the Service) and closes each connection after its answer (the caller
dials again and reaches a replica that stays). Then it stops listening and finishes what is
in flight. SIGINT, a person at a terminal, skips the delay, and so does a second signal.
"""

from __future__ import annotations

import time

from aiohttp import web


class Drain:
    """Whether this replica is on its way out, and since when."""

    __slots__ = ("_since",)

    def __init__(self) -> None:
        self._since: float | None = None

    @property
    def draining(self) -> bool:
        return self._since is not None

    def begin(self) -> None:
        """Start draining; later calls keep the first start."""
        if self._since is None:
            self._since = time.monotonic()

    def not_ready_reason(self) -> str | None:
        """The readiness check: a draining replica takes no new traffic."""
        return "shutting down" if self._since is not None else None

    async def close_after_answer(self, request: web.Request, response: web.StreamResponse) -> None:
        """`on_response_prepare`: while draining, no connection is kept for another call."""
        if self._since is not None:
            # The hook runs after aiohttp has written its own Connection header, so the
            # header that tells the caller is set here too.
            response.force_close()
            response.headers["Connection"] = "close"
