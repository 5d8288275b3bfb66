"""A running aiohttp server moves to a new certificate without failing a request."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from certs import CertificateReloader, ca_bundle, server_ssl_context
from tests.certs.factory import make_ca, make_serving
from tests.certs.live_server import get_over_new_connection, https_server, recording_session
from tests.certs.secret_volume import publish

ROUNDS = 12
SWAP_ROUND = 5
REQUESTS_PER_ROUND = 4


async def test_secret_swap_reaches_new_handshakes_and_spares_open_connections(
    tmp_path: Path,
) -> None:
    now = datetime.now(UTC)
    old_ca, fresh_ca = make_ca(now=now), make_ca(now=now)
    old, new = make_serving(old_ca, now=now), make_serving(fresh_ca, now=now)
    trusted = ca_bundle(old_ca.cert_pem, fresh_ca.cert_pem, now=now)
    volume = tmp_path / "secret"
    publish(volume, ca=old_ca, serving=old)
    context = server_ssl_context(volume / "tls.crt", volume / "tls.key")
    reloader = CertificateReloader(context, volume / "tls.crt", volume / "tls.key")

    reloaded: list[bool] = []
    presented: list[list[bytes | BaseException]] = []
    async with (
        https_server(context) as url,
        recording_session(trusted, force_close=False) as (kept_open, kept_open_handshakes),
    ):
        async with kept_open.get(url) as response:
            await response.read()
        for round_ in range(ROUNDS):
            batch = [
                asyncio.create_task(get_over_new_connection(url, trusted))
                for _ in range(REQUESTS_PER_ROUND)
            ]
            # Let the batch start connecting, so the swap lands mid-flight.
            await asyncio.sleep(0)
            if round_ == SWAP_ROUND:
                publish(volume, ca=fresh_ca, serving=new)
            # What the server's periodic task does.
            reloaded.append(reloader.check())
            presented.append(list(await asyncio.gather(*batch, return_exceptions=True)))
        async with kept_open.get(url) as response:
            await response.read()

    failures = [r for batch in presented for r in batch if isinstance(r, BaseException)]
    assert failures == []
    assert reloaded == [i == SWAP_ROUND for i in range(ROUNDS)]
    before, during, after = (
        presented[:SWAP_ROUND],
        presented[SWAP_ROUND],
        presented[SWAP_ROUND + 1 :],
    )
    assert {cert for batch in before for cert in batch} == {old.cert_pem}
    assert set(during) <= {old.cert_pem, new.cert_pem}
    assert {cert for batch in after for cert in batch} == {new.cert_pem}
    assert kept_open_handshakes == [old.cert_pem], "the open connection kept its certificate"
    assert reloader.not_after == new.not_after
