"""Certificates for the tests, made at a fixed or a real clock."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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


def make_client(ca: CertifiedKey, common_name: str, *, now: datetime | None = None) -> CertifiedKey:
    """Return a client certificate (clientAuth) for `common_name`, signed by `ca`.

    gpuadm never issues client certificates; the apiserver's come from the cluster's own
    PKI. The tests make one the way such a PKI would.
    """
    now = now or datetime.now(UTC)
    issuer = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return CertifiedKey(cert.public_bytes(serialization.Encoding.PEM), key_pem)


@dataclass(frozen=True)
class CallerFiles:
    """The files of a caller with a client certificate: the CA gpuadm is told to trust
    (`--client-ca-file`), and the caller's certificate and key."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def write_caller(directory: Path, common_name: str = "kube-apiserver") -> CallerFiles:
    """Make a CA and a client certificate it signed, as the apiserver's, in `directory`."""
    callers = make_ca(now=datetime.now(UTC))
    caller = make_client(callers, common_name)
    files = CallerFiles(
        directory / "callers.crt", directory / "caller.crt", directory / "caller.key"
    )
    files.ca_file.write_bytes(callers.cert_pem)
    files.cert_file.write_bytes(caller.cert_pem)
    files.key_file.write_bytes(caller.key_pem)
    return files
