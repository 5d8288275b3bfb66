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
from webhook.config.snapshot import POLICY_PART, QUOTAS_PART, ConfigHolder, snapshot_from_text
from webhook.kube.client import USAGE_RECORD_LABEL, Kube, KubeError
from webhook.kube.retry import retry_forever
from webhook.kube.watch import Event, consume_watch

log = logging.getLogger("gpuadm.config")

POLICY_MAP, POLICY_KEY = POLICY_PART, "policy.yaml"
QUOTAS_MAP, QUOTAS_KEY = QUOTAS_PART, "quotas.yaml"
WATCHED = (POLICY_MAP, QUOTAS_MAP)
# The usage records live in the same namespace and are rewritten on every admission under
# quota; without this selector each write would reach every replica's config watch.
NOT_A_USAGE_RECORD = f"!{USAGE_RECORD_LABEL}"


class ConfigMapSource:
    """Watches `gpuadm-policy` and `gpuadm-quotas` and keeps the holder's snapshot current."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        holder: ConfigHolder,
        *,
        on_policy_change: Callable[[], None] = lambda: None,
        watch_seconds: int = 30,
    ) -> None:
        """Watch the ConfigMaps of `namespace`; call `on_policy_change` when the policy does.

        `watch_seconds` is how long one watch call stays open before it is renewed.
        """
        self.kube = kube
        self.namespace = namespace
        self.holder = holder
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
        await retry_forever(self._list_and_watch, what="ConfigMap watch", log=log)

    async def _list_and_watch(self, healthy: Callable[[], None]) -> None:
        page = await asyncio.to_thread(
            self.kube.list_configmaps, self.namespace, label_selector=NOT_A_USAGE_RECORD
        )
        self._maps = {
            m["metadata"]["name"]: m for m in page.items if m["metadata"]["name"] in WATCHED
        }
        self._apply()
        version = page.resource_version
        healthy()
        while True:
            version = await self._watch(version)

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
                self.namespace,
                resource_version=version,
                timeout_seconds=self.watch_seconds,
                label_selector=NOT_A_USAGE_RECORD,
            ),
            handle,
        )
        return latest

    def _apply(self) -> None:
        policy_map = self._maps.get(POLICY_MAP)
        if policy_map is None:
            self.holder.reject(POLICY_MAP, f"ConfigMap {self.namespace}/{POLICY_MAP} not found")
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
        previous = self.holder.current.policy_revision if self.holder.loaded else None
        if self.holder.offer(snapshot) and previous != snapshot.policy_revision:
            self.on_policy_change()

    def _reject(self, error: ConfigError, config_map: dict[str, Any] | None) -> None:
        name = POLICY_MAP if error.source.startswith(POLICY_MAP) else QUOTAS_MAP
        self.holder.reject(name, "; ".join(error.problems))
        metadata = (config_map or {}).get("metadata") or {}
        key = (name, str(metadata.get("resourceVersion")))
        if config_map is None or key in self._reported:
            return
        self._reported.add(key)
        message = "invalid, the last good config stays in force: " + "; ".join(error.problems)
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
