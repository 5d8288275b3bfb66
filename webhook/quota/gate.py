"""The seam between validation and quota: what `/validate` asks of the quota ledger."""

from __future__ import annotations

from typing import Protocol

from policies import Plan
from policies.quota.judge import QuotaVerdict
from webhook.config.snapshot import ConfigSnapshot
from webhook.reviews.request import AdmissionRequest


class QuotaGate(Protocol):
    """Charges an admitted pod against its namespace's quota, or refuses it; and in queue
    mode, tells a pod being created whether it gets the gate that may hold it in line."""

    def should_gate(
        self, namespace: str, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        """Say whether a pod being created gets gpuadm's scheduling gate (`queued`), is
        refused because it could never fit (not `allowed`), or neither (None)."""
        ...

    async def admit(
        self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        """Judge the pod's demand and reserve it unless the request is a dry run.

        None means no limit applies to the pod: nothing was judged or charged.
        """
        ...


class Unlimited:
    """A gate that admits everything: used until a quota ledger is configured."""

    def should_gate(
        self, namespace: str, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        """Nothing waits."""
        return None

    async def admit(
        self, request: AdmissionRequest, plan: Plan, config: ConfigSnapshot
    ) -> QuotaVerdict | None:
        """Admit without charging anything."""
        return None
