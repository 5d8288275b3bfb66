"""Config files as the commands read them: loaded whole, or refused with every problem."""

from __future__ import annotations

from pathlib import Path

from policies import ConfigError
from webhook.cli.exits import CommandError
from webhook.config.file_source import read_snapshot
from webhook.config.snapshot import ConfigSnapshot


def load_config(policy: Path, quotas: Path | None) -> ConfigSnapshot:
    """Read the config files, or raise `CommandError` with every problem they have."""
    try:
        return read_snapshot(policy, quotas)
    except ConfigError as error:
        raise CommandError("invalid config:\n  " + "\n  ".join(error.problems)) from None
    except OSError as error:
        raise CommandError(f"cannot read config: {error}") from None
