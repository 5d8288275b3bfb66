"""TLS material for the webhook: make, check, write and hot-reload certificates.

This package knows nothing of admission or of the cluster API; whoever keeps
the certificates in a Secret calls these functions.
"""

from certs.files import (
    CertificateReloader,
    TLSPaths,
    peer_certificate_verified,
    server_ssl_context,
    write_tls_dir,
)
from certs.material import (
    CLOCK_SKEW_ALLOWANCE,
    CertifiedKey,
    ChainError,
    KeyMismatchError,
    KeyType,
    ca_bundle,
    describe,
    load_certified_key,
    new_ca,
    new_serving_cert,
    renewal_due,
    service_dns_names,
    verify_chain,
)

__all__ = [
    "CLOCK_SKEW_ALLOWANCE",
    "CertificateReloader",
    "CertifiedKey",
    "ChainError",
    "KeyMismatchError",
    "KeyType",
    "TLSPaths",
    "ca_bundle",
    "describe",
    "load_certified_key",
    "new_ca",
    "new_serving_cert",
    "peer_certificate_verified",
    "renewal_due",
    "server_ssl_context",
    "service_dns_names",
    "verify_chain",
    "write_tls_dir",
]
