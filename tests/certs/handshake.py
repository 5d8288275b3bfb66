"""TLS handshakes run in memory, to see what a server context presents."""

from __future__ import annotations

import ssl

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from tests.certs.factory import LOOPBACK


def client_context(trusted_pem: bytes) -> ssl.SSLContext:
    """Return a client context that trusts only the given CA certificates."""
    return ssl.create_default_context(cadata=trusted_pem.decode("ascii"))


def handshake(
    server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str = LOOPBACK
) -> ssl.SSLObject:
    """Complete a handshake between two contexts and return the client's end."""
    # Each BIO is one direction of the wire: what one end writes, the other reads.
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_end = client.wrap_bio(to_client, to_server, server_hostname=server_hostname)
    server_end = server.wrap_bio(to_server, to_client, server_side=True)
    pending = [client_end, server_end]
    for _ in range(10):
        for end in list(pending):
            try:
                end.do_handshake()
            except ssl.SSLWantReadError:
                continue
            pending.remove(end)
        if not pending:
            return client_end
    raise AssertionError("the TLS handshake did not complete")


def peer_certificate(end: ssl.SSLObject) -> bytes:
    """Return, as PEM, the certificate the other end presented."""
    der = end.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).public_bytes(Encoding.PEM)


def presented_certificate(server: ssl.SSLContext, trusted_pem: bytes) -> bytes:
    """Return, as PEM, the certificate a new connection to ``server`` is shown."""
    return peer_certificate(handshake(server, client_context(trusted_pem)))
