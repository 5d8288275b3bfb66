"""Record stores for tests whose writes fail as they are told to."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Literal

from webhook.kube.errors import KubeError
from webhook.quota.reservations import (
    NO_MARK,
    Allowance,
    Mark,
    MemoryStore,
    RecordFull,
    Reservation,
)

# What becomes of a write: stored and answered (None), refused before it lands (503), refused
# as too large (`RecordFull`), or stored and then unanswered (504).
Fate = Literal["refused", "full", "unanswered"] | None


class FailingStore(MemoryStore):
    """A store whose writes each meet the fate `fate` gives them, after `delay` seconds."""

    def __init__(
        self, fate: Callable[[], Fate] = lambda: None, delay: Callable[[], float] = lambda: 0.0
    ) -> None:
        super().__init__()
        self.fate = fate
        self.delay = delay

    async def write(
        self,
        namespace: str,
        reservations: dict[str, Reservation],
        version: str | None,
        mark: Mark = NO_MARK,
        allowances: Mapping[str, Allowance] | None = None,
    ) -> str:
        fate = self.fate()
        await asyncio.sleep(self.delay())
        if fate == "refused":
            raise KubeError(503, "refused before it landed")
        if fate == "full":
            raise RecordFull(namespace, len(reservations), 1)
        stored = await super().write(namespace, reservations, version, mark, allowances)
        if fate == "unanswered":
            raise KubeError(504, "the apiserver timed out after it stored the write")
        return stored
