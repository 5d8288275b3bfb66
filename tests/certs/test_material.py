"""Making CA and serving certificates, and checking chains against them."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs import (
    CLOCK_SKEW_ALLOWANCE,
    CertifiedKey,
    ChainError,
    KeyMismatchError,
    KeyType,
    load_certified_key,
    new_ca,
    new_serving_cert,
    service_dns_names,
    verify_chain,
)
from tests.certs.factory import LOOPBACK, NOW, SERVICE_NAMES, make_ca, make_serving

KEY_TYPES = [pytest.param("ecdsa", id="ecdsa"), pytest.param("rsa", id="rsa")]


def test_service_dns_names_lists_every_form_the_apiserver_may_dial() -> None:
    assert service_dns_names("gpuadm", "gpu-system") == [
        "gpuadm",
        "gpuadm.gpu-system",
        "gpuadm.gpu-system.svc",
        "gpuadm.gpu-system.svc.cluster.local",
    ]


@pytest.mark.parametrize("key_type", KEY_TYPES)
@pytest.mark.parametrize("host", [pytest.param(h, id=h) for h in [*SERVICE_NAMES, LOOPBACK]])
def test_chain_verifies_for_every_name_the_apiserver_may_use(host: str, key_type: KeyType) -> None:
    ca = new_ca(now=NOW, key_type=key_type)
    serving = make_serving(ca, key_type=key_type)

    verify_chain(serving.cert_pem, ca.cert_pem, hostname_or_ip=host, now=NOW)


@pytest.mark.parametrize(
    "host",
    [
        pytest.param("webhook.gpu-system.svc", id="other-service"),
        pytest.param("gpuadm.other-namespace.svc", id="same-service-other-namespace"),
        pytest.param("evil.gpuadm.gpu-system.svc", id="subdomain-of-a-san"),
        pytest.param("10.0.0.1", id="ip-not-in-sans"),
        pytest.param("::1", id="ipv6-loopback-not-in-sans"),
    ],
)
def test_chain_is_refused_for_a_name_not_in_the_sans(host: str) -> None:
    ca = make_ca()
    serving = make_serving(ca)

    with pytest.raises(ChainError, match=f"not trusted for '{re.escape(host)}'.*subjectAltName"):
        verify_chain(serving.cert_pem, ca.cert_pem, hostname_or_ip=host, now=NOW)


@pytest.mark.parametrize(
    "common_name",
    [
        pytest.param("gpuadm-ca", id="impostor-with-the-same-name"),
        pytest.param("someone-else", id="unrelated-ca"),
    ],
)
def test_chain_is_refused_when_the_leaf_is_signed_by_another_ca(common_name: str) -> None:
    trusted = make_ca()
    other = new_ca(now=NOW, common_name=common_name)
    serving = make_serving(other)

    with pytest.raises(ChainError, match="not trusted"):
        verify_chain(serving.cert_pem, trusted.cert_pem, hostname_or_ip=SERVICE_NAMES[0], now=NOW)


def test_chain_verifies_against_a_bundle_holding_the_issuer_among_others() -> None:
    issuer, unrelated = make_ca(), make_ca()
    serving = make_serving(issuer)

    verify_chain(
        serving.cert_pem,
        unrelated.cert_pem + issuer.cert_pem,
        hostname_or_ip=SERVICE_NAMES[-1],
        now=NOW,
    )


@pytest.mark.parametrize(
    "at",
    [
        pytest.param(NOW - CLOCK_SKEW_ALLOWANCE - timedelta(seconds=1), id="before-not-before"),
        pytest.param(NOW + timedelta(days=30, seconds=1), id="after-not-after"),
    ],
)
def test_chain_is_refused_outside_the_leaf_validity(at: datetime) -> None:
    ca = make_ca()
    serving = make_serving(ca, valid_for=timedelta(days=30))

    with pytest.raises(ChainError, match=r"is valid from .* to .*, not at"):
        verify_chain(serving.cert_pem, ca.cert_pem, hostname_or_ip=LOOPBACK, now=at)


def test_chain_error_on_unreadable_bundle_says_so() -> None:
    serving = make_serving(make_ca())

    with pytest.raises(ChainError, match="unreadable PEM"):
        verify_chain(serving.cert_pem, b"", hostname_or_ip=LOOPBACK, now=NOW)


def test_serving_cert_without_any_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one DNS name or IP address"):
        new_serving_cert(make_ca(), dns_names=[], now=NOW)


@pytest.mark.parametrize(
    ("dns_names", "ips", "expected"),
    [
        pytest.param(SERVICE_NAMES, [LOOPBACK], SERVICE_NAMES[0], id="first-dns-name"),
        pytest.param([], ["10.1.2.3", LOOPBACK], "10.1.2.3", id="first-ip-when-no-dns"),
    ],
)
def test_serving_cert_common_name_is_its_first_name(
    dns_names: list[str], ips: list[str], expected: str
) -> None:
    serving = new_serving_cert(make_ca(), dns_names=dns_names, ip_addresses=ips, now=NOW)

    [cn] = serving.certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert cn.value == expected


def test_serving_cert_names_every_dns_name_and_ip() -> None:
    serving = make_serving(make_ca())

    san = serving.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.value.get_values_for_type(x509.DNSName) == SERVICE_NAMES
    assert [str(ip) for ip in san.value.get_values_for_type(x509.IPAddress)] == [LOOPBACK]


@pytest.mark.parametrize(
    ("key_type", "key_encipherment"),
    [pytest.param("ecdsa", False, id="ecdsa"), pytest.param("rsa", True, id="rsa")],
)
def test_serving_cert_is_for_tls_servers_only(key_type: KeyType, key_encipherment: bool) -> None:
    cert = make_serving(make_ca(), key_type=key_type).certificate

    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature
    assert usage.key_encipherment is key_encipherment
    assert not usage.key_cert_sign
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_ca_may_sign_leaf_certificates_only() -> None:
    cert = make_ca().certificate

    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca
    assert constraints.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign
    assert usage.crl_sign
    assert cert.issuer == cert.subject


def test_leaf_names_its_issuer_key() -> None:
    ca = make_ca()
    serving = make_serving(ca)

    ski = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    aki = serving.certificate.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
    assert aki.value.key_identifier == ski.digest


def test_leaf_of_a_ca_without_key_identifier_still_verifies() -> None:
    ours = make_ca()
    key = serialization.load_pem_private_key(ours.key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    ca_cert = ours.certificate
    # The same CA as made elsewhere, by a tool that adds no SubjectKeyIdentifier.
    bare = (
        x509.CertificateBuilder()
        .subject_name(ca_cert.subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(ca_cert.serial_number)
        .not_valid_before(ca_cert.not_valid_before_utc)
        .not_valid_after(ca_cert.not_valid_after_utc)
        .add_extension(
            ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value, critical=True
        )
        .add_extension(
            ca_cert.extensions.get_extension_for_class(x509.KeyUsage).value, critical=True
        )
        .sign(key, hashes.SHA256())
    )
    external = CertifiedKey(
        cert_pem=bare.public_bytes(serialization.Encoding.PEM), key_pem=ours.key_pem
    )

    serving = make_serving(external)

    verify_chain(serving.cert_pem, external.cert_pem, hostname_or_ip=LOOPBACK, now=NOW)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: make_ca(valid_for=timedelta(days=10)), id="ca"),
        pytest.param(lambda: make_serving(make_ca(), valid_for=timedelta(days=10)), id="serving"),
    ],
)
def test_validity_starts_early_to_allow_for_clock_skew(
    make: Callable[[], CertifiedKey],
) -> None:
    made = make()

    assert made.not_before == NOW - CLOCK_SKEW_ALLOWANCE
    assert made.not_after == NOW + timedelta(days=10)


def test_serving_cert_does_not_outlive_its_ca() -> None:
    ca = make_ca(valid_for=timedelta(days=30))

    serving = make_serving(ca, valid_for=timedelta(days=365))

    assert serving.not_after == ca.not_after


def test_expired_ca_cannot_sign() -> None:
    ca = make_ca(valid_for=timedelta(days=1))

    with pytest.raises(ValueError, match="the CA expired"):
        make_serving(ca, now=NOW + timedelta(days=2))


def test_naive_clock_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        new_ca(now=NOW.replace(tzinfo=None))


def test_load_certified_key_accepts_a_matching_pair() -> None:
    serving = make_serving(make_ca())

    assert load_certified_key(serving.cert_pem, serving.key_pem) == serving


def test_load_certified_key_refuses_the_key_of_another_certificate() -> None:
    ca = make_ca()
    serving = make_serving(ca)

    with pytest.raises(KeyMismatchError, match="does not match the certificate"):
        load_certified_key(serving.cert_pem, ca.key_pem)


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        pytest.param("cert", "not a valid PEM certificate", id="cert-not-pem"),
        pytest.param("key", "not a valid unencrypted PEM private key", id="key-not-pem"),
    ],
)
def test_load_certified_key_explains_unreadable_input(damage: str, match: str) -> None:
    serving = make_serving(make_ca())
    cert_pem = b"garbage" if damage == "cert" else serving.cert_pem
    key_pem = b"garbage" if damage == "key" else serving.key_pem

    with pytest.raises(ValueError, match=match):
        load_certified_key(cert_pem, key_pem)
