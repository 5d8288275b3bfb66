"""A gang's pods at admission: which gang a pod is in, and, in enforce mode, the room its first
pod sets aside for the rest of it.

In enforce mode the first pod of a gang is admitted only if the whole gang fits at once
(`policies.quota.judge.judge_gang`). In the same record write it sets aside the room the
gang's other pods will take: a reservation under the key `gang:<form>/<name>`, of the first
pod's class, of (size - 1) times its charge. Each later pod of the gang that fits in what is
left is charged against that room, which shrinks by as much in the same write. The room is a
reservation like any other: it counts in what the namespace holds on every replica, is
compare-and-swapped with the record, and expires `RESERVATION_TTL` (90 s) after the first
pod's admission. A gang's pods that come later than that, or a pod of a gang whose pods hold
GPUs already (a worker replaced), are judged one by one, as any pod.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING

from policies.quantity import format_amount
from policies.quota.judge import QuotaVerdict, judge_gang, never_fits
from policies.quota.quotas import Terms
from policies.workloads import Gang, GangError, pod_gang
from webhook.quota.book import ReservationBook
from webhook.quota.reservations import Reservation
from webhook.reviews.request import AdmissionRequest

if TYPE_CHECKING:
    from policies import Plan

# What a reservation key of room set aside for a gang starts with (a pod's is its uid).
ROOM_PREFIX = "gang:"

# Reads a gang's size from what sizes it: the size, or why it cannot be known.
GangSize = Callable[[str, Gang], Awaitable[int | str]]


async def sized_on_pods(namespace: str, gang: Gang) -> int:
    """The size only the pods themselves carry, without an apiserver (serving from files,
    `gpuadm review`): a gang its owner sizes (a Job, a PodGroup) is then judged pod by pod,
    as a gang of one, since nothing says more."""
    return gang.size if gang.size is not None else 1


@dataclass(frozen=True, slots=True)
class Member:
    """A pod of a gang of more than one pod, with the gang's size."""

    gang: Gang
    size: int

    @property
    def room_key(self) -> str:
        """Return the key of the room its gang's first pod sets aside."""
        return f"{ROOM_PREFIX}{self.gang.key}"


async def member_of(
    request: AdmissionRequest,
    gang_size: GangSize,
    plan: Plan,
    limits: Mapping[str, Fraction],
    *,
    in_line: bool,
) -> Member | QuotaVerdict | None:
    """Return the gang a pod is in (None: none, or a gang of one), or a refusal: a pod that
    names its gang in a way that cannot be read, or whose gang's size cannot be read now.

    `in_line`: the pod waits in a queue namespace's line, where the leader reads the size
    again and decides; it is refused here only if its gang could never fit (its size times
    this pod's charge above a whole limit), and a size not known now refuses nothing."""
    try:
        gang = pod_gang(request.object.get("metadata") or {})
    except GangError as error:
        return QuotaVerdict(False, f"pod {request.pod_name!r}: {error}")
    if gang is None:
        return None
    size = gang.size if gang.size is not None else await gang_size(request.namespace, gang)
    if isinstance(size, str):
        if in_line:
            return None
        return QuotaVerdict(
            False,
            f"pod {request.pod_name!r} is in the {gang.describe()}, whose size gpuadm cannot "
            f"read: {size}; retry",
        )
    if size <= 1:
        return None
    member = Member(replace(gang, size=size), size)
    if in_line and plan.class_name is not None:
        whole = plan.charge * size
        never = never_fits(
            namespace=request.namespace, class_name=plan.class_name, requested=whole, limits=limits
        )
        if never is not None:
            return QuotaVerdict(
                False,
                f"{never.replace('the pod could', 'the gang could')} (the "
                f"{member.gang.describe()}: {size} pods of {format_amount(plan.charge)} at once)",
            )
    return member


def judge_member(
    book: ReservationBook,
    namespace: str,
    member: Member | None,
    terms: Terms,
    plan: Plan,
    in_use: Mapping[str, Fraction],
    reservations: MutableMapping[str, Reservation],
    *,
    retried: bool,
    dry_run: bool,
    record: str | None = None,
) -> tuple[QuotaVerdict, Fraction] | None:
    """Judge a pod of a gang in enforce mode: against its gang's room if there is enough of
    it, else as its gang's first pod if none of the gang holds GPUs. None: it is judged
    alone (no gang, another mode, a retried request, whose reservation is its own, or a gang
    whose pods run already, or whose room is too small).

    Return the verdict and how much the gang's room grew (its first pod) or shrank (a later
    one), which `reservations` already shows unless this is a dry run. `record` is the key
    of the record `reservations` come from: a cohort's holds its members' gangs' rooms, each
    named after its namespace too."""
    if member is None or terms.mode != "enforce" or retried:
        return None
    class_name, charge, limits = plan.class_name, plan.charge, terms.limits
    assert class_name is not None
    shared = record is not None and record != namespace
    room_key = f"{member.room_key}@{namespace}" if shared else member.room_key
    room = reservations.get(room_key)
    if room is not None and room.class_name == class_name and room.charge >= charge:
        if not dry_run:
            left = room.charge - charge
            if left:
                reservations[room_key] = replace(room, charge=left)
            else:
                del reservations[room_key]
        return QuotaVerdict(True, limit=limits.get(class_name)), -charge
    if room is not None or book.usage.gang_running(namespace).get(member.gang.key, 0):
        return None
    verdict = judge_gang(
        namespace=namespace,
        gang=member.gang.describe(),
        size=member.size,
        requested=charge,
        in_use=in_use,
        limits=limits,
        class_name=class_name,
    )
    if not verdict.allowed:
        return verdict, Fraction(0)
    grown = charge * (member.size - 1)
    if not dry_run:
        reservations[room_key] = Reservation(
            class_name,
            grown,
            book.clock(),
            f"room for the {member.gang.describe()}",
            namespace=namespace if shared else "",
        )
    return verdict, grown
