"""Merging CA certificates into the bundle the apiserver trusts."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from certs import CertifiedKey, ca_bundle, verify_chain
from tests.certs.factory import LOOPBACK, NOW, make_ca, make_serving

# The old CA was made long ago and runs out 30 days after NOW; the new one is fresh.
OLD = make_ca(now=NOW - timedelta(days=335), valid_for=timedelta(days=365))
NEW = make_ca()
AFTER_OLD_EXPIRY = NOW + timedelta(days=31)


@pytest.mark.parametrize(
    ("inputs", "now", "kept"),
    [
        pytest.param([OLD, NEW], NOW, [OLD, NEW], id="old-and-new-kept-during-overlap"),
        pytest.param([NEW, OLD], NOW, [NEW, OLD], id="order-of-arguments-kept"),
        pytest.param([OLD, NEW], AFTER_OLD_EXPIRY, [NEW], id="expired-old-ca-dropped"),
        pytest.param([OLD, NEW, OLD, NEW], NOW, [OLD, NEW], id="duplicates-kept-once"),
    ],
)
def test_bundle_keeps_each_unexpired_ca_once_in_order(
    inputs: list[CertifiedKey], now: datetime, kept: list[CertifiedKey]
) -> None:
    bundle = ca_bundle(*(ca.cert_pem for ca in inputs), now=now)

    assert bundle == b"".join(ca.cert_pem for ca in kept)


def test_bundle_accepts_an_existing_bundle_as_input() -> None:
    existing = ca_bundle(OLD.cert_pem, now=NOW)

    bundle = ca_bundle(existing, NEW.cert_pem, OLD.cert_pem, now=NOW)

    assert bundle == OLD.cert_pem + NEW.cert_pem


def test_bundle_trusts_leaves_of_both_cas_during_rotation() -> None:
    bundle = ca_bundle(OLD.cert_pem, NEW.cert_pem, now=NOW)

    for ca in (OLD, NEW):
        verify_chain(make_serving(ca).cert_pem, bundle, hostname_or_ip=LOOPBACK, now=NOW)


def test_bundle_with_every_ca_expired_is_refused() -> None:
    with pytest.raises(ValueError, match="no unexpired CA"):
        ca_bundle(OLD.cert_pem, now=AFTER_OLD_EXPIRY)
