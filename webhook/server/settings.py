"""Settings of one gpuadm process, as the command line gives them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# A pod is at most about 1.5 MiB (etcd's default request limit); an UPDATE review carries it
# twice (object and oldObject), and JSON escaping can grow it further. 7 MiB admits every
# review the apiserver can send and refuses anything larger before it is parsed.
MAX_REVIEW_BYTES = 7 * 1024 * 1024
# Who kube-controller-manager's resourceclaim controller is: its own service account with
# --use-service-account-credentials (kubeadm's default), else the controller manager's user.
CLAIM_CONTROLLERS = (
    "system:serviceaccount:kube-system:resource-claim-controller",
    "system:kube-controller-manager",
)


@dataclass(frozen=True, slots=True)
class Settings:
    """How this process serves: addresses, files, and the identity it trusts."""

    host: str = "0.0.0.0"
    """The address to listen on."""
    port: int = 8443
    """The HTTPS port."""
    cert_file: Path | None = None
    """The serving certificate (PEM); reloaded when the file changes."""
    key_file: Path | None = None
    """The key of the serving certificate (PEM)."""
    client_ca_file: Path | None = None
    """When set, /mutate and /validate answer only callers whose certificate this CA signed."""
    policy_file: Path | None = None
    """Standalone: the policy file, reloaded when it changes. None in a cluster."""
    quotas_file: Path | None = None
    """Standalone: the quota file, if any."""
    namespace: str = "gpuadm-system"
    """gpuadm's own namespace, where its ConfigMaps and usage records live."""
    trusted_user: str = "system:serviceaccount:gpuadm-system:gpuadm"
    """The only user allowed to change gpuadm's own labels and annotations on a pod, and to
    write its ResourceClaimTemplates."""
    claim_controllers: tuple[str, ...] = CLAIM_CONTROLLERS
    """The users of Kubernetes' resourceclaim controller: they alone make GPU claims."""
    max_review_bytes: int = MAX_REVIEW_BYTES
    """The largest request body read; larger ones get a 413 before parsing."""
    reload_seconds: float = 1.0
    """How often the config and certificate files are checked for changes."""
    lease_seconds: float = 15.0
    """How long the Lease of the replica that releases waiting pods lasts unrenewed: how
    long waiting pods may wait for a new leader when the leader dies."""
    gpu_hours_checkpoint_seconds: float = 60.0
    """How often the leader counts GPU pods' running time into the GPU-hour records, and
    every replica reads them (`webhook.gpu_hours.ledger`)."""
    gpu_hours_bucket_seconds: int = 3600
    """The width of the GPU-hour records' buckets: the grain of a budget's window."""
    identity: str = ""
    """This replica's name in the Lease and its Events (default: host name and a suffix)."""
