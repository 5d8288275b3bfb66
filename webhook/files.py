"""Standalone config: the policy and quota files, reloaded when their content changes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from policies import ConfigError
from webhook.config import ConfigHolder, ConfigSnapshot, snapshot_from_text
from webhook.keys import CONFIG, METRICS, SETTINGS
from webhook.metrics import Metrics

log = logging.getLogger("gpuadm.config")


def read_snapshot(policy_file: Path, quotas_file: Path | None) -> ConfigSnapshot:
    """Read and validate both files; raise `ConfigError` or `OSError` naming the file."""
    quotas_text = quotas_file.read_text() if quotas_file is not None else ""
    return snapshot_from_text(
        policy_file.read_text(),
        quotas_text,
        policy_source=str(policy_file),
        quotas_source=str(quotas_file or "quotas"),
    )


def reload_once(
    holder: ConfigHolder, metrics: Metrics, policy_file: Path, quotas_file: Path | None
) -> bool:
    """Reload the files if they changed; keep the config in force when they are invalid.

    Content is compared, not mtimes: a mounted ConfigMap changes by a symlink swap that
    leaves the link's own mtime alone.
    """
    try:
        snapshot = read_snapshot(policy_file, quotas_file)
    except (ConfigError, OSError) as error:
        log.error("config not reloaded, the last good one stays in force: %s", error)
        metrics.config_valid.labels("files").set(0)
        metrics.config_reloads.labels("files", "rejected").inc()
        return False
    metrics.config_valid.labels("files").set(1)
    current = holder.current
    if (snapshot.policy_revision, snapshot.quotas_revision) == (
        current.policy_revision,
        current.quotas_revision,
    ):
        return False
    holder.replace(snapshot)
    metrics.config_reloads.labels("files", "applied").inc()
    metrics.config_in_force(snapshot.policy_revision, snapshot.quotas_revision)
    log.info(
        "config reloaded: policy %s, quotas %s",
        snapshot.policy_revision,
        snapshot.quotas_revision,
    )
    return True


async def watch_files(app: web.Application) -> AsyncIterator[None]:
    """Poll the config files for the life of the application."""
    settings = app[SETTINGS]
    policy_file = settings.policy_file
    if policy_file is None:
        yield
        return

    holder, metrics = app[CONFIG], app[METRICS]
    current = holder.current
    metrics.config_in_force(current.policy_revision, current.quotas_revision)

    async def poll() -> None:
        while True:
            await asyncio.sleep(settings.reload_seconds)
            await asyncio.to_thread(reload_once, holder, metrics, policy_file, settings.quotas_file)

    task = asyncio.create_task(poll())
    yield
    task.cancel()
