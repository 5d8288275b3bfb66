"""The seam between validation and GPU-hour budgets: what `/validate` asks of them."""

from __future__ import annotations

from typing import Protocol

from policies.quota.judge import QuotaVerdict
from webhook.config.snapshot import ConfigSnapshot


class BudgetGate(Protocol):
    """Judges a new pod of a class against its namespace's GPU-hour budgets."""

    def judge(self, namespace: str, class_name: str, config: ConfigSnapshot) -> QuotaVerdict | None:
        """Refuse (not `allowed`) a pod whose class's budget is spent, admit it with warnings
        near it, or None where no budget applies. Queue mode is judged as enforce: the
        caller holds in line what is refused."""
        ...


class NoBudgets:
    """A gate that judges no budget: `gpuadm review`, and apps built without a ledger."""

    def judge(self, namespace: str, class_name: str, config: ConfigSnapshot) -> QuotaVerdict | None:
        """No budget applies."""
        return None


NO_BUDGETS = NoBudgets()
