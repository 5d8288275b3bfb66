"""The record's watermark (`Mark`): reservations of pods the watch has shown leave the record
at the next write, and no replica judges with a record before its own view of pods has
reached the mark they left behind (`webhook.quota.book`)."""

from __future__ import annotations

from collections.abc import Callable

from webhook.kube.errors import KubeError
from webhook.quota.reservations import Mark, Record, Reservation
from webhook.quota.usage import UsageIndex

# How long a judgement waits for this replica's pod watch to reach a record's mark: the
# event it waits for has reached every watcher at once, so a healthy watch takes
# milliseconds; then the request is refused with "retry".
CATCH_UP_SECONDS = 2.0
NOT_IN_SYNC = "gpuadm's view of GPU usage is not in sync with the cluster yet; retry"


class NotInSync(KubeError):
    """This replica's view of pods has not reached a record's mark in time."""

    def __init__(self, namespace: str, mark: Mark) -> None:
        self.detail = (
            f"the pod view has not reached the mark {mark.version} of the quota record of "
            f'namespace "{namespace}"'
        )
        super().__init__(503, self.detail)


class Watermark:
    """What leaves a record as its pods are shown, and the wait for a record's mark, by one
    replica's view of pods."""

    def __init__(
        self,
        usage: UsageIndex,
        *,
        pods_visible: bool,
        clock: Callable[[], float],
        within: float = CATCH_UP_SECONDS,
        relist: Callable[[], None] = lambda: None,
    ) -> None:
        """Judge by `usage`, which shows pods when `pods_visible` (in a cluster; standalone,
        nothing leaves and there is no mark to wait for). Wait `within` seconds at most for
        the view to reach a mark; `relist` asks the pod watch for a full list, the one way
        to reach a mark made by a watch of another label."""
        self.usage = usage
        self.pods_visible = pods_visible
        self.clock = clock
        self.within = within
        self._relist = relist

    def dropping(
        self, reservations: dict[str, Reservation], mark: Mark
    ) -> tuple[dict[str, Reservation], Mark]:
        """Return the reservations a write keeps and the record's mark after it.

        Only the reservations of pods shown by a watch of the label the mark is for go, or
        of any label while the mark is unset: a replica that watches another label would
        not have seen them."""
        usage = self.usage
        if not self.pods_visible or (mark.version and mark.label != usage.label):
            return reservations, mark
        kept: dict[str, Reservation] = {}
        top = 0
        for uid, reservation in reservations.items():
            shown = usage.shown_in(uid)
            if shown is None:
                kept[uid] = reservation
            elif shown > top:
                top = shown
        if len(kept) == len(reservations):
            return reservations, mark
        return kept, Mark(max(mark.version, top), usage.label, self.clock())

    async def catch_up(self, namespace: str, record: Record) -> None:
        """Return once this replica's view of pods has reached the record's mark, so that
        it counts every pod whose reservation left the record; raise `NotInSync` if it has
        not within `within` seconds."""
        mark = record.mark
        if not mark.version or not self.pods_visible:
            return
        usage = self.usage
        if mark.label == usage.label:
            if await usage.reach(mark.version, within=self.within):
                return
        elif usage.listed_version >= mark.version:
            return
        else:  # only a full list, at or after the mark, holds the pods of the other label
            self._relist()
        raise NotInSync(namespace, mark)
