"""Certificates for the tests, made at a fixed or a real clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from certs import CertifiedKey, KeyType, new_ca, new_serving_cert, service_dns_names

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
SERVICE_NAMES = service_dns_names("gpuadm", "gpu-system")
LOOPBACK = "127.0.0.1"


def make_ca(*, now: datetime = NOW, valid_for: timedelta = timedelta(days=3650)) -> CertifiedKey:
    """Return a fresh CA."""
    return new_ca(now=now, valid_for=valid_for)


def make_serving(
    ca: CertifiedKey,
    *,
    now: datetime = NOW,
    valid_for: timedelta = timedelta(days=365),
    key_type: KeyType = "ecdsa",
) -> CertifiedKey:
    """Return a serving certificate for the webhook Service and the loopback address."""
    return new_serving_cert(
        ca,
        dns_names=SERVICE_NAMES,
        ip_addresses=[LOOPBACK],
        now=now,
        valid_for=valid_for,
        key_type=key_type,
    )


def wall_clock_pair() -> tuple[CertifiedKey, CertifiedKey]:
    """Return a CA and a serving certificate valid now, for real TLS handshakes."""
    now = datetime.now(UTC)
    ca = make_ca(now=now)
    return ca, make_serving(ca, now=now)
