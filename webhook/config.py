"""The config in force: one immutable snapshot of policy and quotas, swapped whole on reload."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policies import Plan, Policy, QuotaConfig, load_policy, load_quotas
from webhook.plans import PlanMemo


@dataclass(frozen=True, slots=True)
class ConfigSnapshot:
    """A policy and quota config that were valid together, with the revision of each."""

    policy: Policy
    quotas: QuotaConfig
    policy_revision: str
    quotas_revision: str
    plans: PlanMemo = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plans", PlanMemo(self.policy))

    def plan(self, pod: Mapping[str, Any], namespace: str) -> Plan:
        """Return the plan of a pod in a namespace under this config, or raise `Denial`."""
        default_class = self.quotas.default_class_for(namespace)
        return self.plans.plan(pod, namespace_default_class=default_class)


def revision_of(text: str) -> str:
    """Return a short content digest, so audit records can name the config that judged."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def snapshot_from_text(
    policy_text: str, quotas_text: str, *, policy_source: str, quotas_source: str
) -> ConfigSnapshot:
    """Parse both configs; raise `policies.ConfigError` naming the file and line when invalid."""
    policy = load_policy(policy_text, source=policy_source)
    quotas = load_quotas(quotas_text, source=quotas_source)
    return ConfigSnapshot(policy, quotas, revision_of(policy_text), revision_of(quotas_text))


class NoConfig(Exception):
    """No valid config has been loaded yet (in a cluster: the ConfigMaps are missing or bad)."""


class ConfigHolder:
    """Holds the snapshot in force; readers take `current` once per request."""

    def __init__(self, snapshot: ConfigSnapshot | None = None) -> None:
        self._snapshot = snapshot

    @property
    def loaded(self) -> bool:
        """Tell whether a valid config is in force."""
        return self._snapshot is not None

    @property
    def current(self) -> ConfigSnapshot:
        """Return the snapshot in force, or raise `NoConfig`."""
        if self._snapshot is None:
            raise NoConfig("gpuadm has not loaded a valid policy yet")
        return self._snapshot

    def replace(self, snapshot: ConfigSnapshot) -> None:
        """Put a new, already validated snapshot in force."""
        self._snapshot = snapshot
