"""In a cluster, the config comes from two ConfigMaps in gpuadm's namespace, watched live.

A valid edit is in force as soon as the watch shows it. An invalid edit is refused: the last
good config stays, and the reason goes to the log, to `gpuadm_config_valid`, and to a
Warning Event on the ConfigMap, where `kubectl describe configmap` shows it. A ConfigMap
deleted, a key renamed or an empty value is an invalid edit too, never "no config": the
Event of a deleted ConfigMap names it, and `kubectl get events` shows it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

from webhook.config.snapshot import POLICY_PART, QUOTAS_PART, ConfigHolder, Missing, PartText
from webhook.kube.errors import KubeError
from webhook.kube.objects import USAGE_RECORD_LABEL
from webhook.kube.rest import AsyncApi, WatchEvent

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
        api: AsyncApi,
        namespace: str,
        holder: ConfigHolder,
        *,
        on_policy_change: Callable[[], None] = lambda: None,
        watch_seconds: int = 30,
    ) -> None:
        """Watch the ConfigMaps of `namespace`; call `on_policy_change` when the policy does.

        `watch_seconds` is how long one watch call stays open before it is renewed.
        """
        self.api = api
        self.namespace = namespace
        self.holder = holder
        self.on_policy_change = on_policy_change
        self.watch_seconds = watch_seconds
        self._maps: dict[str, dict[str, Any]] = {}
        # The version of each ConfigMap last reported in an Event ("deleted" when gone).
        self._reported: dict[str, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def not_ready_reason(self) -> str | None:
        """Say why no config is in force, or None."""
        if self.holder.loaded:
            return None
        return f"no valid ConfigMap {POLICY_MAP} in namespace {self.namespace}"

    async def run(self, progress: Callable[[], None] = lambda: None) -> None:
        """List, then watch the ConfigMaps, renewing the watch, until cancelled or an
        apiserver error (raised, for the supervisor to retry). `progress` is called after
        the list and after each watch call that ended normally."""
        page = await self.api.list_configmaps(self.namespace, NOT_A_USAGE_RECORD)
        self._maps = {
            m["metadata"]["name"]: m for m in page.items if m["metadata"]["name"] in WATCHED
        }
        await self._apply()
        version = page.resource_version
        progress()
        while True:
            version = await self._watch(version, progress)
            if self.holder.read_pending:
                # A text left unread for lack of time: no event may come to offer it again.
                await self._apply()
            progress()

    async def _watch(self, version: str, progress: Callable[[], None]) -> str:
        latest = version
        watch = self.api.watch_configmaps(
            self.namespace,
            label_selector=NOT_A_USAGE_RECORD,
            resource_version=version,
            timeout_seconds=self.watch_seconds,
        )
        async with aclosing(watch) as events:
            async for event in events:
                latest = await self._handle(event) or latest
                progress()  # an event read within its budget is progress, however slow
        return latest

    async def _handle(self, event: WatchEvent) -> str | None:
        """Apply one watch event; return the version it carries."""
        obj = event.get("object") or {}
        if event.get("type") == "ERROR":
            raise KubeError(int(obj.get("code") or 0), str(obj.get("message")))
        metadata = obj.get("metadata") or {}
        name = metadata.get("name")
        if name in WATCHED:
            if event.get("type") == "DELETED":
                self._maps.pop(name, None)
            else:
                self._maps[name] = obj
            await self._apply()
        version = metadata.get("resourceVersion")
        return str(version) if version else None

    async def _apply(self) -> None:
        update = await self.holder.reload(
            self._part(POLICY_MAP, POLICY_KEY), self._part(QUOTAS_MAP, QUOTAS_KEY)
        )
        for name in WATCHED:
            if name in update.rejected:
                self._report(name, update.rejected[name])
            else:
                self._reported.pop(name, None)  # valid again: its next slip is news
        if update.applied and POLICY_PART not in update.rejected:
            self.on_policy_change()

    def _part(self, name: str, key: str) -> PartText:
        """Read one part from its ConfigMap: its text, or why there is none."""
        source = f"{name}[{key}]"
        config_map = self._maps.get(name)
        if config_map is None:
            return PartText(Missing(f"ConfigMap {self.namespace}/{name} not found"), source)
        data = config_map.get("data") or {}
        if key not in data:
            keys = ", ".join(sorted(map(str, data))) or "none"
            return PartText(
                Missing(f"ConfigMap {self.namespace}/{name} has no key {key} (its keys: {keys})"),
                source,
            )
        return PartText(str(data[key]), source)

    def _report(self, name: str, reason: str) -> None:
        """Record a Warning Event on the ConfigMap, once per version of it."""
        config_map = self._maps.get(name)
        metadata = (config_map or {}).get("metadata") or {}
        version = str(metadata.get("resourceVersion")) if config_map else "deleted"
        if self._reported.get(name) == version:
            return
        self._reported[name] = version
        message = "invalid, the last good config stays in force: " + reason
        task = asyncio.get_running_loop().create_task(
            self._record_event(name, str(metadata.get("uid", "")), message)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _record_event(self, name: str, uid: str, message: str) -> None:
        try:
            await self.api.record_event(
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
