"""The config in force: one immutable snapshot of policy and quotas, swapped whole on reload.

Both sources (files when standalone, ConfigMaps in a cluster) hand what they read to
`ConfigHolder.offer` or `ConfigHolder.reject`, so a reload is logged, counted and exported
the same way whatever it came from. The `config` label of the metrics names the part by
its ConfigMap, `gpuadm-policy` or `gpuadm-quotas`, for files too.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from policies import Plan, Policy, QuotaConfig, load_policy, load_quotas, policy_warnings
from webhook.config.plan_memo import PlanMemo
from webhook.observe.metrics import MemoReading, Metrics
from webhook.reviews.in_turn import in_turn

log = logging.getLogger("gpuadm.config")

POLICY_PART = "gpuadm-policy"
QUOTAS_PART = "gpuadm-quotas"
PARTS = (POLICY_PART, QUOTAS_PART)


class Revisions(NamedTuple):
    """Content digests of the policy and quotas that judged, as audit records name them."""

    policy: str
    quotas: str


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

    @property
    def revisions(self) -> Revisions:
        """Return the revisions of both parts."""
        return Revisions(self.policy_revision, self.quotas_revision)

    def plan(self, pod: Mapping[str, Any], namespace: str) -> Plan:
        """Return the plan of a pod in a namespace under this config, or raise `Denial`."""
        default_class = self.quotas.default_class_for(namespace)
        return self.plans.plan(pod, namespace_default_class=default_class)

    async def plan_in_turn(self, pod: Mapping[str, Any], namespace: str, *, size: int) -> Plan:
        """Like `plan`, for a review of `size` bytes: a large pod is planned in a thread."""
        return await in_turn(size, self.plan, pod, namespace)


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

    def __init__(
        self, snapshot: ConfigSnapshot | None = None, *, metrics: Metrics | None = None
    ) -> None:
        """Start with `snapshot` in force (or none); report reloads to `metrics`."""
        self._snapshot = snapshot
        self._metrics = metrics if metrics is not None else Metrics()
        # Evictions of the memos of snapshots no longer in force, so the counter only grows.
        self._evictions_before = 0
        self._metrics.watch_plan_memo(self._memo_reading)
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after each new snapshot is put in force (a limit may have grown)."""
        self._listeners.append(listener)

    def _memo_reading(self) -> MemoReading:
        snapshot = self._snapshot
        if snapshot is None:
            return MemoReading(0, 0, self._evictions_before)
        stats = snapshot.plans.stats()
        return MemoReading(
            stats.entries, stats.weight_bytes, self._evictions_before + stats.evictions
        )

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

    def offer(self, snapshot: ConfigSnapshot) -> bool:
        """Put a valid snapshot in force unless it is the one in force; tell which it was."""
        for part in PARTS:
            self._metrics.config_valid.labels(part).set(1)
        current = self._snapshot
        if current is not None and current.revisions == snapshot.revisions:
            return False
        for part, changed in (
            (POLICY_PART, current is None or current.policy_revision != snapshot.policy_revision),
            (QUOTAS_PART, current is None or current.quotas_revision != snapshot.quotas_revision),
        ):
            if changed:
                self._metrics.config_reloads.labels(part, "applied").inc()
        if current is not None:
            self._evictions_before += current.plans.stats().evictions
        self._snapshot = snapshot
        self._metrics.config_in_force(snapshot.policy_revision, snapshot.quotas_revision)
        if current is None or current.policy_revision != snapshot.policy_revision:
            for warning in policy_warnings(snapshot.policy):
                log.warning("%s: %s", POLICY_PART, warning)
        for problem in snapshot.quotas.unknown_classes(snapshot.policy):
            log.warning("%s: %s", QUOTAS_PART, problem)
        log.info(
            "config in force: policy %s, quotas %s",
            snapshot.policy_revision,
            snapshot.quotas_revision,
        )
        for listener in self._listeners:
            listener()
        return True

    def reject(self, part: str, reason: str) -> None:
        """Record that a new version of `part` is invalid; the config in force stays."""
        self._metrics.config_valid.labels(part).set(0)
        self._metrics.config_reloads.labels(part, "rejected").inc()
        log.error("config not reloaded, the last good one stays in force: %s: %s", part, reason)
