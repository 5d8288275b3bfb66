"""Claims: a lender's pods refused in enforce mode ask the leader for their quota back.

A member of a cohort whose `reclaim` allows it, refused a pod within its nominal quota
because borrowers hold the room it lends, writes a claim into its cohort's record in the
same write as the batch it was judged in. The leader reads the claims of each cohort's
record, and evicts borrowed pods for them as for a waiting pod (`webhook.leader.reclaim`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from webhook.quota.reservations import Reservation

CLAIM_PREFIX = "reclaim:"
# A claim is written again at most this often while its pods are refused.
CLAIM_REFRESH_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class Claim:
    """A lender's refused pod asking the leader for its quota back (enforce mode)."""

    namespace: str
    class_name: str
    charge: Fraction
    priority: int


def claim_key(namespace: str, class_name: str) -> str:
    """Return the key of a namespace's claim of a class in its cohort's record."""
    return f"{CLAIM_PREFIX}{namespace}/{class_name}"


def claims_in(reservations: Mapping[str, Reservation]) -> list[Claim]:
    """Return the claims a cohort's record holds (unexpired, as its reservations are).

    A claim rides in the record as a reservation of nothing, keyed `reclaim:<ns>/<class>`,
    with the refused pod's charge and priority as its `pod`: so it is stored, bounded and
    expired as every reservation is, and counts for nothing."""
    found = []
    for key, reservation in reservations.items():
        if not key.startswith(CLAIM_PREFIX) or reservation.charge:
            continue
        charge, _, priority = reservation.pod.partition("@")
        try:
            found.append(
                Claim(reservation.namespace, reservation.class_name, _amount(charge), int(priority))
            )
        except ValueError:
            continue  # not one gpuadm wrote: ignored
    return found


def _amount(text: str) -> Fraction:
    if not text.replace("/", "", 1).isdigit() or len(text) > 40:
        raise ValueError(text)
    return Fraction(text)
