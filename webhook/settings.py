"""Settings of one gpuadm process, as the command line gives them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# A pod is at most about 1.5 MiB (etcd's default request limit); an UPDATE review carries it
# twice (object and oldObject), and JSON escaping can grow it further. 7 MiB admits every
# review the apiserver can send and refuses anything larger before it is parsed.
MAX_REVIEW_BYTES = 7 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Settings:
    """How this process serves: addresses, files, and the identity it trusts."""

    host: str = "0.0.0.0"
    port: int = 8443
    cert_file: Path | None = None
    key_file: Path | None = None
    policy_file: Path | None = None
    quotas_file: Path | None = None
    namespace: str = "gpuadm-system"
    trusted_user: str = "system:serviceaccount:gpuadm-system:gpuadm"
    max_review_bytes: int = MAX_REVIEW_BYTES
    reload_seconds: float = 1.0
