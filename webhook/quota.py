"""The seam between validation and quota: what `/validate` asks of the quota ledger."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from policies import Plan
from webhook.config import ConfigSnapshot
from webhook.review import AdmissionRequest


@dataclass(frozen=True, slots=True)
class QuotaOutcome:
    """The quota side of a verdict."""

    allowed: bool
    message: str | None = None
    warnings: tuple[str, ...] = ()
    in_use: Fraction | None = None
    limit: Fraction | None = None
    would_deny: bool = False


ADMITTED = QuotaOutcome(True)


class QuotaGate(Protocol):
    """Charges an admitted pod against its namespace's quota, or refuses it."""

    async def admit(
        self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
    ) -> QuotaOutcome:
        """Judge the pod's demand against quota; reserve it unless the request is a dry run."""
        ...


class Unlimited:
    """A gate that admits everything: used until a quota ledger is configured."""

    async def admit(
        self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
    ) -> QuotaOutcome:
        """Admit without charging anything."""
        return ADMITTED
