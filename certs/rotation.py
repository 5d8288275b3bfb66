"""The lifecycle of a webhook's own TLS material: issue, renew the serving certificate, rotate
the CA. Pure: the clock is an argument, and storing the result is the caller's business.

The one rule that keeps the apiserver trusting the webhook through a rotation: a CA goes into
the webhook configurations' `caBundle` *before* any certificate it signed is served. Callers
therefore merge `TLSState.trusted()` into the bundle first and store the state second; CAs
leave the bundle only when they expire.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from ipaddress import ip_address

from cryptography import x509

from certs.material import CertifiedKey, new_ca, new_serving_cert, renewal_due

CA_LIFETIME = timedelta(days=3650)
SERVING_LIFETIME = timedelta(days=365)


@dataclass(frozen=True)
class TLSState:
    """The CA that signs, the certificate served, and the CA before the last rotation."""

    ca: CertifiedKey
    serving: CertifiedKey
    previous_ca: bytes | None = None

    def trusted(self) -> tuple[bytes, ...]:
        """Return every CA certificate the apiserver must trust for this state."""
        return (
            (self.ca.cert_pem,)
            if self.previous_ca is None
            else (
                self.ca.cert_pem,
                self.previous_ca,
            )
        )


def issue(*, dns_names: Sequence[str], ip_addresses: Sequence[str] = (), now: datetime) -> TLSState:
    """Make a new CA and a serving certificate signed by it."""
    ca = new_ca(now=now, valid_for=CA_LIFETIME)
    serving = new_serving_cert(
        ca, dns_names=dns_names, ip_addresses=ip_addresses, now=now, valid_for=SERVING_LIFETIME
    )
    return TLSState(ca, serving)


def rotate_ca(
    state: TLSState, *, dns_names: Sequence[str], ip_addresses: Sequence[str] = (), now: datetime
) -> TLSState:
    """Replace the CA now; the old one stays trusted until it expires."""
    fresh = issue(dns_names=dns_names, ip_addresses=ip_addresses, now=now)
    return replace(fresh, previous_ca=state.ca.cert_pem)


def renewed(
    state: TLSState, *, dns_names: Sequence[str], ip_addresses: Sequence[str] = (), now: datetime
) -> TLSState | None:
    """Return the state after whatever renewal is due, or None when nothing is.

    The CA is rotated in the last third of its life; the serving certificate is reissued in
    the last third of its own, or when it no longer names every address the apiserver uses.
    """
    if renewal_due(state.ca.cert_pem, now=now):
        return rotate_ca(state, dns_names=dns_names, ip_addresses=ip_addresses, now=now)
    if renewal_due(state.serving.cert_pem, now=now) or not _covers(
        state.serving, dns_names, ip_addresses
    ):
        serving = new_serving_cert(
            state.ca,
            dns_names=dns_names,
            ip_addresses=ip_addresses,
            now=now,
            valid_for=SERVING_LIFETIME,
        )
        return replace(state, serving=serving)
    return None


def _covers(serving: CertifiedKey, dns_names: Sequence[str], ip_addresses: Sequence[str]) -> bool:
    try:
        names = serving.certificate.extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        ).value
    except x509.ExtensionNotFound:
        return False
    have_dns = set(names.get_values_for_type(x509.DNSName))
    have_ips = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    want_ips = {str(ip_address(ip)) for ip in ip_addresses}
    return set(dns_names) <= have_dns and want_ips <= have_ips
