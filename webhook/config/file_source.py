"""Standalone config: the policy and quota files, reloaded when their content changes.

A file is read whole and applied only once two reads one poll apart agree, so a file caught
while an editor or a script rewrites it in place (empty, or cut short where it still parses)
never applies. Writing a new file and renaming it over the old, as editors and the kubelet's
ConfigMap volumes do, is seen at the next poll but one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from webhook.config.snapshot import (
    NO_QUOTAS,
    ConfigHolder,
    ConfigSnapshot,
    Missing,
    PartText,
    snapshot_from_text,
)


def read_snapshot(policy_file: Path, quotas_file: Path | None) -> ConfigSnapshot:
    """Read and validate both files; raise `ConfigError` or `OSError` naming the file.

    With no `quotas_file`, there are no quotas. A file that is not UTF-8 raises `OSError`.
    """
    return snapshot_from_text(
        _read_text(policy_file),
        _read_text(quotas_file) if quotas_file is not None else None,
        policy_source=str(policy_file),
        quotas_source=str(quotas_file or "quotas"),
    )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise OSError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None


def read_part(path: Path) -> PartText:
    """Read one config file as a part: its text, or why it cannot be read."""
    try:
        return PartText(_read_text(path), str(path))
    except OSError as error:
        return PartText(Missing(f"cannot read {path}: {error.strerror or error}"), str(path))


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
        """Watch `policy_file` and `quotas_file` (if any), reading them every `every_seconds`.

        With no `quotas_file` there are no quotas, as the command line said.
        """
        self.holder = holder
        self.policy_file = policy_file
        self.quotas_file = quotas_file
        self.every_seconds = every_seconds
        self._last_read: tuple[PartText, PartText] | None = None

    async def run(self, progress: Callable[[], None] = lambda: None) -> None:
        """Poll the files until cancelled; call `progress` after each poll."""
        while True:
            await asyncio.sleep(self.every_seconds)
            await self.reload_once()
            progress()

    async def reload_once(self) -> bool:
        """Read the files; apply them if they read the same as at the previous poll.

        Content is compared, not mtimes: a mounted ConfigMap changes by a symlink swap that
        leaves the link's own mtime alone. Return whether a new config went in force.
        """
        read = await asyncio.to_thread(self._read)
        settled = read == self._last_read
        self._last_read = read
        if not settled:
            return False
        return (await self.holder.reload(*read)).applied

    def _read(self) -> tuple[PartText, PartText]:
        quotas = read_part(self.quotas_file) if self.quotas_file is not None else NO_QUOTAS
        return read_part(self.policy_file), quotas
