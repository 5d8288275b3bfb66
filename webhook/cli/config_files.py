"""Config files as the commands read them: loaded whole, or refused with every problem."""

from __future__ import annotations

from pathlib import Path

from policies import ConfigError
from webhook.cli.exits import CommandError
from webhook.config.file_source import read_snapshot
from webhook.config.read_budget import read_within_blocking
from webhook.config.snapshot import ConfigSnapshot


def load_config(policy: Path, quotas: Path | None) -> ConfigSnapshot:
    """Read the config files within the read budget, or raise `CommandError` with every
    problem they have."""
    try:
        return read_within_blocking(
            lambda: read_snapshot(policy, quotas), source=f"{policy} and {quotas or 'no quotas'}"
        )
    except ConfigError as error:
        raise CommandError("invalid config:\n  " + "\n  ".join(error.problems)) from None
    except OSError as error:
        raise CommandError(f"cannot read config: {error}") from None
