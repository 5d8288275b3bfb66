"""One admission waiting to be judged with the others of its record (a group commit)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from policies import Plan
from policies.quota.cohorts import Cohort
from policies.quota.judge import QuotaVerdict
from policies.quota.quotas import Terms
from webhook.config.snapshot import ConfigSnapshot
from webhook.quota.gang_room import Member
from webhook.reviews.request import AdmissionRequest


@dataclass(frozen=True, slots=True)
class Pending:
    """One admission waiting to be judged with the others of its namespace."""

    request: AdmissionRequest
    plan: Plan
    config: ConfigSnapshot
    # The namespace's limits and mode, looked up once for the admission.
    terms: Terms
    # Created behind gpuadm's gate: charged now if it is first in line and fits, else left
    # waiting in line, uncharged.
    gated: bool
    # The gang it is in, in enforce mode (judged whole at its first pod), or None.
    member: Member | None = None
    # The cohort it shares idle quota with, whose record holds its reservations, or None.
    cohort: Cohort | None = None
    # When it began to wait (monotonic seconds), for room other replicas hold aside.
    since: float = field(default_factory=time.monotonic)
    verdict: asyncio.Future[QuotaVerdict] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
