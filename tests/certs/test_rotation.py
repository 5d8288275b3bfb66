"""Issue, renew and rotate with a controlled clock; the bundle always trusts what is served."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from certs import ca_bundle, new_serving_cert, service_dns_names, verify_chain
from certs.rotation import issue, renewed, rotate_ca

START = datetime(2026, 1, 1, tzinfo=UTC)
NAMES = service_dns_names("gpuadm", "gpuadm-system")


def test_a_fresh_state_needs_nothing() -> None:
    state = issue(dns_names=NAMES, now=START)
    assert renewed(state, dns_names=NAMES, now=START + timedelta(days=30)) is None


def test_the_serving_certificate_is_reissued_in_its_last_third_by_the_same_ca() -> None:
    state = issue(dns_names=NAMES, now=START)
    later = START + timedelta(days=250)
    after = renewed(state, dns_names=NAMES, now=later)
    assert after is not None
    assert after.ca == state.ca
    assert after.serving.not_after > state.serving.not_after
    verify_chain(after.serving.cert_pem, after.ca.cert_pem, hostname_or_ip=NAMES[2], now=later)


def test_a_new_address_gets_a_new_certificate_at_once() -> None:
    state = issue(dns_names=NAMES, now=START)
    after = renewed(state, dns_names=NAMES, ip_addresses=["10.0.0.7"], now=START)
    assert after is not None
    verify_chain(after.serving.cert_pem, after.ca.cert_pem, hostname_or_ip="10.0.0.7", now=START)


@pytest.mark.parametrize("days", [2500, 3000, 3640], ids=["ca-in-last-third", "later", "eve"])
def test_the_ca_rotates_in_its_last_third_and_the_old_one_stays_trusted(days: int) -> None:
    state = issue(dns_names=NAMES, now=START)
    now = START + timedelta(days=days)
    after = renewed(state, dns_names=NAMES, now=now)
    assert after is not None
    assert after.ca != state.ca
    assert after.previous_ca == state.ca.cert_pem
    bundle = ca_bundle(*after.trusted(), now=now)
    # The certificate served until now (reissued by the old CA lately, as renewals do) and
    # the one served from now on both verify against the bundle.
    served_before = new_serving_cert(state.ca, dns_names=NAMES, now=now - timedelta(days=1))
    verify_chain(served_before.cert_pem, bundle, hostname_or_ip=NAMES[2], now=now)
    verify_chain(after.serving.cert_pem, bundle, hostname_or_ip=NAMES[2], now=now)


def test_rotating_now_keeps_the_old_ca_until_it_expires() -> None:
    state = issue(dns_names=NAMES, now=START)
    rotated_at = START + timedelta(days=1000)
    after = rotate_ca(state, dns_names=NAMES, now=rotated_at)
    both = ca_bundle(*after.trusted(), now=rotated_at)
    assert both.count(b"BEGIN CERTIFICATE") == 2
    old_expired = START + timedelta(days=3651)
    assert ca_bundle(*after.trusted(), now=old_expired) == ca_bundle(
        after.ca.cert_pem, now=old_expired
    )
