"""Config files as the commands read them: loaded whole, or refused with every problem.

`serve` reads its files as they are, as it polls them afterwards. `review` reads them as
`check-config` does, so that a tenant can give the ConfigMap manifests an admin hands out.
"""

from __future__ import annotations

from pathlib import Path

from policies import ConfigError
from webhook.cli.exits import CommandError
from webhook.config.file_source import read_snapshot
from webhook.config.read_budget import read_within_blocking
from webhook.config.snapshot import ConfigSnapshot, snapshot_from_text


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


def load_documents(policy: Path, quotas: Path | None) -> ConfigSnapshot:
    """Read the policy and quotas as `check-config` finds them in a file (the config
    itself, or the ConfigMap manifest `gpuadm-policy` or `gpuadm-quotas` holding it) within
    the read budget; raise `CommandError` with every problem they have."""
    from webhook.cli.check_config import Part, part_of

    policy_part = part_of(str(policy), "policy")
    quotas_part: Part | None = part_of(str(quotas), "quotas") if quotas is not None else None

    def read() -> ConfigSnapshot:
        return snapshot_from_text(
            policy_part.text,
            None if quotas_part is None else quotas_part.text,
            policy_source=policy_part.source,
            quotas_source=str(quotas),
            policy_first_line=policy_part.first_line,
            quotas_first_line=1 if quotas_part is None else quotas_part.first_line,
        )

    try:
        return read_within_blocking(read, source=f"{policy} and {quotas or 'no quotas'}")
    except ConfigError as error:
        raise CommandError("invalid config:\n  " + "\n  ".join(error.problems)) from None
