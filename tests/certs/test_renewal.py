"""When a certificate is due for renewal, on a clock the test controls."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from certs import renewal_due
from tests.certs.factory import NOW, make_ca, make_serving

SERVING = make_serving(make_ca(), valid_for=timedelta(days=90))
START, END = SERVING.not_before, SERVING.not_after
LIFETIME = END - START
# Where less than a third of the lifetime starts to remain.
BOUNDARY = END - LIFETIME * (1 / 3)


@pytest.mark.parametrize(
    ("at", "due"),
    [
        pytest.param(NOW, False, id="just-issued"),
        pytest.param(START, False, id="first-valid-instant"),
        pytest.param(START + LIFETIME / 2, False, id="halfway"),
        pytest.param(BOUNDARY + timedelta(days=1), True, id="in-the-last-third"),
        pytest.param(END - timedelta(seconds=1), True, id="one-second-before-expiry"),
        pytest.param(END, True, id="at-expiry"),
        pytest.param(END + timedelta(days=1), True, id="expired"),
        pytest.param(START - timedelta(seconds=1), True, id="not-yet-valid"),
    ],
)
def test_renewal_is_due_in_the_last_third_and_outside_validity(at: datetime, due: bool) -> None:
    assert renewal_due(SERVING.cert_pem, now=at) is due


def test_renewal_becomes_due_exactly_past_the_boundary() -> None:
    step = timedelta(microseconds=1)

    flips = [renewal_due(SERVING.cert_pem, now=BOUNDARY + d) for d in (-step, timedelta(0), step)]

    assert flips == [False, False, True]


@pytest.mark.parametrize(
    ("renew_before", "due_halfway"),
    [
        pytest.param(0.25, False, id="last-quarter"),
        pytest.param(0.75, True, id="last-three-quarters"),
    ],
)
def test_renew_before_sets_the_share_of_lifetime(renew_before: float, due_halfway: bool) -> None:
    halfway = START + LIFETIME / 2

    assert renewal_due(SERVING.cert_pem, now=halfway, renew_before=renew_before) is due_halfway


@pytest.mark.parametrize(
    "renew_before",
    [
        pytest.param(0.0, id="zero"),
        pytest.param(-0.1, id="negative"),
        pytest.param(1.5, id="over-one"),
    ],
)
def test_renew_before_outside_zero_to_one_is_refused(renew_before: float) -> None:
    with pytest.raises(ValueError, match="renew_before"):
        renewal_due(SERVING.cert_pem, now=NOW, renew_before=renew_before)
