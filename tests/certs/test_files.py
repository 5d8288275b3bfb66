"""Writing the TLS directory and building the server context from it."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path

import pytest

from certs import load_certified_key, server_ssl_context, write_tls_dir
from tests.certs.factory import make_ca, make_serving, wall_clock_pair, write_caller
from tests.certs.handshake import client_context, handshake, peer_certificate


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        pytest.param("tls.key", 0o600, id="key-readable-by-owner-only"),
        pytest.param("tls.crt", 0o644, id="certificate-world-readable"),
        pytest.param("ca.crt", 0o644, id="ca-world-readable"),
    ],
)
def test_write_tls_dir_sets_file_modes(tmp_path: Path, name: str, mode: int) -> None:
    ca = make_ca()

    write_tls_dir(tmp_path / "tls", ca=ca, serving=make_serving(ca))

    assert stat.S_IMODE((tmp_path / "tls" / name).stat().st_mode) == mode


def test_write_tls_dir_writes_a_loadable_pair_and_the_ca(tmp_path: Path) -> None:
    ca = make_ca()
    serving = make_serving(ca)

    paths = write_tls_dir(tmp_path, ca=ca, serving=serving)

    assert paths.ca_file.read_bytes() == ca.cert_pem
    assert load_certified_key(paths.cert_file.read_bytes(), paths.key_file.read_bytes()) == serving
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]


def test_write_tls_dir_replaces_files_and_tightens_a_loose_key(tmp_path: Path) -> None:
    ca = make_ca()
    (tmp_path / "tls.key").write_bytes(b"old")
    (tmp_path / "tls.key").chmod(0o644)
    serving = make_serving(ca)

    paths = write_tls_dir(tmp_path, ca=ca, serving=serving)

    assert paths.key_file.read_bytes() == serving.key_pem
    assert stat.S_IMODE(paths.key_file.stat().st_mode) == 0o600


def test_server_context_refuses_protocols_older_than_tls_1_2(tmp_path: Path) -> None:
    ca, serving = wall_clock_pair()
    paths = write_tls_dir(tmp_path, ca=ca, serving=serving)

    context = server_ssl_context(paths.cert_file, paths.key_file)

    assert context.minimum_version is ssl.TLSVersion.TLSv1_2


@pytest.mark.parametrize(
    "client_max",
    [
        pytest.param(ssl.TLSVersion.TLSv1_2, id="tls-1.2"),
        pytest.param(ssl.TLSVersion.TLSv1_3, id="tls-1.3"),
    ],
)
def test_server_context_presents_its_certificate_and_speaks_http_1_1_only(
    tmp_path: Path, client_max: ssl.TLSVersion
) -> None:
    ca, serving = wall_clock_pair()
    paths = write_tls_dir(tmp_path, ca=ca, serving=serving)
    server = server_ssl_context(paths.cert_file, paths.key_file)
    client = client_context(ca.cert_pem)
    client.maximum_version = client_max
    # As the apiserver's webhook client offers them: HTTP/2 first, which gpuadm never serves.
    client.set_alpn_protocols(["h2", "http/1.1"])

    client_end = handshake(server, client)

    assert client_end.selected_alpn_protocol() == "http/1.1"
    assert peer_certificate(client_end) == serving.cert_pem


@pytest.mark.parametrize(
    "client_max",
    [
        pytest.param(ssl.TLSVersion.TLSv1_2, id="tls-1.2"),
        pytest.param(ssl.TLSVersion.TLSv1_3, id="tls-1.3"),
    ],
)
@pytest.mark.parametrize("client_certificate", [False, True], ids=["anonymous", "client-cert"])
def test_server_context_gives_no_session_ticket(
    tmp_path: Path, client_max: ssl.TLSVersion, client_certificate: bool
) -> None:
    ca, serving = wall_clock_pair()
    paths = write_tls_dir(tmp_path, ca=ca, serving=serving)
    client = client_context(ca.cert_pem)
    client.maximum_version = client_max
    client_ca_file = None
    if client_certificate:  # as the apiserver calls gpuadm with --client-ca-file
        caller = write_caller(tmp_path)
        client_ca_file = caller.ca_file
        client.load_cert_chain(caller.cert_file, caller.key_file)
    server = server_ssl_context(paths.cert_file, paths.key_file, client_ca_file=client_ca_file)

    client_end = handshake(server, client)
    with pytest.raises(ssl.SSLWantReadError):  # reads what followed the handshake
        client_end.read(1)

    assert client_end.session is not None
    assert not client_end.session.has_ticket


def test_server_context_refuses_a_key_of_another_certificate(tmp_path: Path) -> None:
    ca, serving = wall_clock_pair()
    paths = write_tls_dir(tmp_path, ca=ca, serving=serving)
    paths.key_file.write_bytes(ca.key_pem)

    with pytest.raises(ssl.SSLError):
        server_ssl_context(paths.cert_file, paths.key_file)
