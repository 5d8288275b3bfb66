"""Standalone config: the policy and quota files, reloaded when their content changes."""

from __future__ import annotations

import asyncio
from pathlib import Path

from policies import ConfigError
from webhook.config.snapshot import (
    POLICY_PART,
    QUOTAS_PART,
    ConfigHolder,
    ConfigSnapshot,
    snapshot_from_text,
)


def read_snapshot(policy_file: Path, quotas_file: Path | None) -> ConfigSnapshot:
    """Read and validate both files; raise `ConfigError` or `OSError` naming the file."""
    quotas_text = quotas_file.read_text() if quotas_file is not None else ""
    return snapshot_from_text(
        policy_file.read_text(),
        quotas_text,
        policy_source=str(policy_file),
        quotas_source=str(quotas_file or "quotas"),
    )


class FileSource:
    """Polls the policy and quota files and offers what they hold to the holder."""

    def __init__(
        self,
        holder: ConfigHolder,
        policy_file: Path,
        quotas_file: Path | None,
        *,
        every_seconds: float,
    ) -> None:
        """Watch `policy_file` and `quotas_file` (if any), reading them every `every_seconds`."""
        self.holder = holder
        self.policy_file = policy_file
        self.quotas_file = quotas_file
        self.every_seconds = every_seconds

    async def run(self) -> None:
        """Poll the files until cancelled."""
        while True:
            await asyncio.sleep(self.every_seconds)
            await self.reload_once()

    async def reload_once(self) -> bool:
        """Reload the files if they changed; keep the config in force when they are invalid.

        Content is compared, not mtimes: a mounted ConfigMap changes by a symlink swap that
        leaves the link's own mtime alone.
        """
        try:
            snapshot = await asyncio.to_thread(read_snapshot, self.policy_file, self.quotas_file)
        except ConfigError as error:
            self.holder.reject(self._part_of(error.source), "; ".join(error.problems))
            return False
        except OSError as error:
            self.holder.reject(self._part_of(str(error.filename)), str(error))
            return False
        return self.holder.offer(snapshot)

    def _part_of(self, source: str) -> str:
        return POLICY_PART if source == str(self.policy_file) else QUOTAS_PART
