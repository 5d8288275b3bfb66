"""Creation, loading and checking of the webhook's CA and serving certificates.

Everything here is pure: no files, no cluster, no clock. Callers pass ``now``
(a timezone-aware UTC datetime) so the same code serves production and tests.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, TypeAlias

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KeyType: TypeAlias = Literal["ecdsa", "rsa"]
IPAddr: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address
_SigningKey: TypeAlias = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

# Certificates are backdated so that a peer whose clock runs a little behind
# ours (the apiserver, another replica) does not reject a certificate made a
# moment ago as "not yet valid".
CLOCK_SKEW_ALLOWANCE = timedelta(minutes=5)


class KeyMismatchError(ValueError):
    """The private key does not belong to the certificate it was paired with."""


class ChainError(ValueError):
    """A serving certificate is not trusted for a name at a given time."""


@dataclass(frozen=True)
class CertifiedKey:
    """A PEM certificate together with the PEM private key it certifies."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        """Return the parsed certificate."""
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def not_before(self) -> datetime:
        """Return the start of the validity period as an aware UTC datetime."""
        return self.certificate.not_valid_before_utc

    @property
    def not_after(self) -> datetime:
        """Return the end of the validity period as an aware UTC datetime."""
        return self.certificate.not_valid_after_utc


def new_ca(
    *,
    now: datetime,
    common_name: str = "gpuadm-ca",
    valid_for: timedelta = timedelta(days=3650),
    key_type: KeyType = "ecdsa",
) -> CertifiedKey:
    """Create a self-signed CA that may sign serving certificates only."""
    now = _aware(now)
    key = _new_key(key_type)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW_ALLOWANCE)
        .not_valid_after(now + valid_for)
        # path_length=0: this CA signs leaves, never intermediate CAs.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _certified(cert, key)


def service_dns_names(service: str, namespace: str) -> list[str]:
    """Return every DNS name under which the apiserver may reach a Service."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def new_serving_cert(
    ca: CertifiedKey,
    *,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str | IPAddr] = (),
    now: datetime,
    valid_for: timedelta = timedelta(days=365),
    key_type: KeyType = "ecdsa",
) -> CertifiedKey:
    """Create a TLS server certificate for the given names, signed by ``ca``.

    The validity is cut short at the CA's own expiry: a leaf that outlives its
    issuer cannot be verified, and a shorter lifetime makes ``renewal_due``
    fire before the CA runs out.
    """
    now = _aware(now)
    ips = [ipaddress.ip_address(ip) for ip in ip_addresses]
    if not dns_names and not ips:
        raise ValueError(
            "a serving certificate needs at least one DNS name or IP address: "
            "clients match the host they dialled against the SubjectAlternativeName"
        )
    ca_cert = ca.certificate
    if ca_cert.not_valid_after_utc <= now:
        raise ValueError(f"the CA expired at {ca_cert.not_valid_after_utc.isoformat()}")
    ca_key = _signing_key(ca.key_pem)
    key = _new_key(key_type)
    common_name = dns_names[0] if dns_names else str(ips[0])
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW_ALLOWANCE)
        .not_valid_after(min(now + valid_for, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # RSA key exchange (TLS 1.2 without ECDHE) encrypts with the server key;
        # ECDSA keys only ever sign.
        .add_extension(
            _key_usage(digital_signature=True, key_encipherment=key_type == "rsa"),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(_authority_key_id(ca_cert, ca_key), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return _certified(cert, key)


def load_certified_key(cert_pem: bytes, key_pem: bytes) -> CertifiedKey:
    """Parse a certificate and private key, and check that they belong together.

    Raises ``KeyMismatchError`` if the key is not the certificate's, and
    ``ValueError`` if either is not valid PEM.
    """
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise ValueError(f"the certificate is not a valid PEM certificate: {exc}") from exc
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"the key is not a valid unencrypted PEM private key: {exc}") from exc
    if _spki(key.public_key()) != _spki(cert.public_key()):
        raise KeyMismatchError(
            "the private key does not match the certificate's public key "
            f"(certificate subject {cert.subject.rfc4514_string()!r})"
        )
    return CertifiedKey(cert_pem=cert_pem, key_pem=key_pem)


def renewal_due(cert_pem: bytes, *, now: datetime, renew_before: float = 1 / 3) -> bool:
    """Tell whether a certificate should be replaced at ``now``.

    True once less than ``renew_before`` of its lifetime remains, and whenever
    it is expired or not yet valid.
    """
    if not 0 < renew_before <= 1:
        raise ValueError(f"renew_before must be in (0, 1], got {renew_before}")
    now = _aware(now)
    cert = x509.load_pem_x509_certificate(cert_pem)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if not start <= now < end:
        return True
    return end - now < (end - start) * renew_before


def ca_bundle(*ca_pems: bytes, now: datetime) -> bytes:
    """Merge CA certificates into one PEM bundle for a webhook's ``caBundle``.

    During a CA rotation the old and the new CA must both be trusted until no
    served certificate is signed by the old one. Each argument may hold several
    certificates. Duplicates (same SHA-256 fingerprint) are kept once, in order
    of first appearance, and expired CAs are dropped. Raises ``ValueError`` if
    no valid CA is left, because an empty bundle would make every call fail.
    """
    now = _aware(now)
    seen: set[bytes] = set()
    kept: list[bytes] = []
    for cert in _parse_all(ca_pems):
        fingerprint = cert.fingerprint(hashes.SHA256())
        if fingerprint in seen or cert.not_valid_after_utc <= now:
            continue
        seen.add(fingerprint)
        kept.append(cert.public_bytes(serialization.Encoding.PEM))
    if not kept:
        raise ValueError("no unexpired CA certificate left for the bundle")
    return b"".join(kept)


def verify_chain(serving: bytes, ca_bundle: bytes, *, hostname_or_ip: str, now: datetime) -> None:
    """Check that a client trusting ``ca_bundle`` accepts ``serving`` for a host.

    Raises ``ChainError`` saying why if the certificate is outside its
    validity at ``now``, is not signed by a CA of the bundle, or does not name
    ``hostname_or_ip`` in its SubjectAlternativeName.
    """
    now = _aware(now)
    try:
        leaf = x509.load_pem_x509_certificate(serving)
        anchors = x509.load_pem_x509_certificates(ca_bundle)
    except ValueError as exc:
        raise ChainError(f"unreadable PEM input: {exc}") from exc
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
        raise ChainError(
            f"the serving certificate is valid from {leaf.not_valid_before_utc.isoformat()} "
            f"to {leaf.not_valid_after_utc.isoformat()}, not at {now.isoformat()}"
        )
    verifier = (
        verification.PolicyBuilder()
        .store(verification.Store(anchors))
        .time(now)
        .build_server_verifier(_subject(hostname_or_ip))
    )
    try:
        verifier.verify(leaf, [])
    except verification.VerificationError as exc:
        raise ChainError(
            f"the serving certificate is not trusted for {hostname_or_ip!r} by the CA bundle: {exc}"
        ) from exc


def _aware(now: datetime) -> datetime:
    # A naive datetime would be read as UTC by cryptography but as local time
    # by whoever made it; refuse it rather than shift validity silently.
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be a timezone-aware datetime")
    return now


def _new_key(key_type: KeyType) -> _SigningKey:
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def _signing_key(key_pem: bytes) -> _SigningKey:
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"unsupported CA key type {type(key).__name__}")
    return key


def _authority_key_id(
    ca_cert: x509.Certificate, ca_key: _SigningKey
) -> x509.AuthorityKeyIdentifier:
    # Verifiers match a leaf to its issuer through this identifier, so it must
    # repeat the CA's own SubjectKeyIdentifier when the CA has one; a CA made
    # elsewhere may have computed it differently from the public key.
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski.value)


def _key_usage(
    *,
    digital_signature: bool = False,
    key_encipherment: bool = False,
    key_cert_sign: bool = False,
    crl_sign: bool = False,
) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=crl_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _certified(cert: x509.Certificate, key: _SigningKey) -> CertifiedKey:
    return CertifiedKey(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def _spki(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _parse_all(pems: Iterable[bytes]) -> Iterable[x509.Certificate]:
    for pem in pems:
        yield from x509.load_pem_x509_certificates(pem)


def _subject(hostname_or_ip: str) -> verification.Subject:
    try:
        return x509.IPAddress(ipaddress.ip_address(hostname_or_ip))
    except ValueError:
        return x509.DNSName(hostname_or_ip)


def describe(material: CertifiedKey) -> str:
    """Say whom a certificate names and when it expires, for a person to read."""
    certificate = material.certificate
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        sans = [*names.get_values_for_type(x509.DNSName)] + [
            str(ip) for ip in names.get_values_for_type(x509.IPAddress)
        ]
    except x509.ExtensionNotFound:
        sans = []
    listed = f"; names {', '.join(sans)}" if sans else ""
    return (
        f"{certificate.subject.rfc4514_string()}{listed}; expires {material.not_after.isoformat()}"
    )
