"""In a cluster, the config comes from two ConfigMaps in gpuadm's namespace, watched live.

A valid edit is in force as soon as the watch shows it. An invalid edit is refused: the last
good config stays, and the reason goes to the log, to `gpuadm_config_valid`, and to a
Warning Event on the ConfigMap, where `kubectl describe configmap` shows it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from policies import ConfigError
from webhook.config import ConfigHolder, snapshot_from_text
from webhook.kube import Kube, KubeError
from webhook.metrics import Metrics
from webhook.watching import Event, consume_watch

log = logging.getLogger("gpuadm.config")

POLICY_MAP, POLICY_KEY = "gpuadm-policy", "policy.yaml"
QUOTAS_MAP, QUOTAS_KEY = "gpuadm-quotas", "quotas.yaml"
WATCHED = (POLICY_MAP, QUOTAS_MAP)


class ConfigMapSource:
    """Watches `gpuadm-policy` and `gpuadm-quotas` and keeps the holder's snapshot current."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        holder: ConfigHolder,
        metrics: Metrics,
        *,
        on_policy_change: Callable[[], None] = lambda: None,
        watch_seconds: int = 30,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.holder = holder
        self.metrics = metrics
        self.on_policy_change = on_policy_change
        self.watch_seconds = watch_seconds
        self._maps: dict[str, dict[str, Any]] = {}
        self._reported: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def not_ready_reason(self) -> str | None:
        """Say why no config is in force, or None."""
        if self.holder.loaded:
            return None
        return f"no valid ConfigMap {POLICY_MAP} in namespace {self.namespace}"

    async def run(self) -> None:
        """List and watch the ConfigMaps until cancelled."""
        backoff = 1.0
        while True:
            try:
                page = await asyncio.to_thread(self.kube.list_configmaps, self.namespace)
                self._maps = {
                    m["metadata"]["name"]: m for m in page.items if m["metadata"]["name"] in WATCHED
                }
                self._apply()
                version = page.resource_version
                backoff = 1.0
                while True:
                    version = await self._watch(version)
            except KubeError as error:
                log.warning("ConfigMap watch failed (retrying in %.0f s): %s", backoff, error)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    async def _watch(self, version: str) -> str:
        latest = version

        def handle(event: Event) -> None:
            nonlocal latest
            obj = event.get("object") or {}
            if event.get("type") == "ERROR":
                raise KubeError(int(obj.get("code") or 0), str(obj.get("message")))
            metadata = obj.get("metadata") or {}
            latest = metadata.get("resourceVersion") or latest
            name = metadata.get("name")
            if name not in WATCHED:
                return
            if event.get("type") == "DELETED":
                self._maps.pop(name, None)
            else:
                self._maps[name] = obj
            self._apply()

        await consume_watch(
            lambda: self.kube.watch_configmaps(
                self.namespace, resource_version=version, timeout_seconds=self.watch_seconds
            ),
            handle,
        )
        return latest

    def _apply(self) -> None:
        policy_map = self._maps.get(POLICY_MAP)
        if policy_map is None:
            self.metrics.config_valid.labels(POLICY_MAP).set(0)
            log.error(
                "ConfigMap %s/%s not found; keeping the config in force", self.namespace, POLICY_MAP
            )
            return
        quotas_map = self._maps.get(QUOTAS_MAP)
        try:
            snapshot = snapshot_from_text(
                _text(policy_map, POLICY_KEY),
                _text(quotas_map, QUOTAS_KEY) if quotas_map else "",
                policy_source=f"{POLICY_MAP}[{POLICY_KEY}]",
                quotas_source=f"{QUOTAS_MAP}[{QUOTAS_KEY}]",
            )
        except ConfigError as error:
            self._reject(error, policy_map if error.source.startswith(POLICY_MAP) else quotas_map)
            return
        for name in WATCHED:
            self.metrics.config_valid.labels(name).set(1)
        current = self.holder.current if self.holder.loaded else None
        if current and (current.policy_revision, current.quotas_revision) == (
            snapshot.policy_revision,
            snapshot.quotas_revision,
        ):
            return
        self.holder.replace(snapshot)
        self.metrics.config_reloads.labels("all", "applied").inc()
        self.metrics.config_in_force(snapshot.policy_revision, snapshot.quotas_revision)
        for problem in snapshot.quotas.unknown_classes(snapshot.policy):
            log.warning("%s: %s", QUOTAS_MAP, problem)
        log.info(
            "config in force: policy %s, quotas %s",
            snapshot.policy_revision,
            snapshot.quotas_revision,
        )
        if current is None or current.policy_revision != snapshot.policy_revision:
            self.on_policy_change()

    def _reject(self, error: ConfigError, config_map: dict[str, Any] | None) -> None:
        name = POLICY_MAP if error.source.startswith(POLICY_MAP) else QUOTAS_MAP
        self.metrics.config_valid.labels(name).set(0)
        self.metrics.config_reloads.labels(name, "rejected").inc()
        message = "invalid, the last good config stays in force: " + "; ".join(error.problems)
        log.error("ConfigMap %s/%s %s", self.namespace, name, message)
        metadata = (config_map or {}).get("metadata") or {}
        key = (name, str(metadata.get("resourceVersion")))
        if config_map is None or key in self._reported:
            return
        self._reported.add(key)
        task = asyncio.get_running_loop().create_task(
            self._record_event(name, str(metadata.get("uid", "")), message)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record_event(self, name: str, uid: str, message: str) -> None:
        try:
            await asyncio.to_thread(
                self.kube.record_event,
                namespace=self.namespace,
                kind="ConfigMap",
                name=name,
                uid=uid,
                reason="InvalidConfig",
                message=message,
                warning=True,
            )
        except KubeError as error:
            log.warning("could not record an Event on ConfigMap %s: %s", name, error)


def _text(config_map: dict[str, Any], key: str) -> str:
    return str((config_map.get("data") or {}).get(key, ""))
