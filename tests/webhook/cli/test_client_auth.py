"""`gpuadm serve --client-ca-file`: reviews only from callers the CA vouches for."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from certs import CertifiedKey
from tests.builders import POLICY_YAML, QUOTAS_YAML, pod, review
from tests.certs.factory import make_ca, make_client
from tests.support import ServeProcess


@pytest.fixture
def client_ca() -> CertifiedKey:
    return make_ca(now=datetime.now(UTC))


@pytest.fixture
def server(tmp_path: Path, client_ca: CertifiedKey) -> Iterator[ServeProcess]:
    policy, quotas, ca_file = tmp_path / "policy.yaml", tmp_path / "quotas.yaml", tmp_path / "ca"
    policy.write_text(POLICY_YAML)
    quotas.write_text(QUOTAS_YAML)
    ca_file.write_bytes(client_ca.cert_pem)
    running = ServeProcess(tmp_path, policy, quotas, "--client-ca-file", str(ca_file))
    yield running
    running.stop()


def context_with(
    server: ServeProcess, tmp_path: Path, client: CertifiedKey | None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=server.tls_dir / "ca.crt")
    if client is not None:
        cert, key = tmp_path / "client.crt", tmp_path / "client.key"
        cert.write_bytes(client.cert_pem)
        key.write_bytes(client.key_pem)
        context.load_cert_chain(cert, key)
    return context


def call(server: ServeProcess, method: str, path: str, context: ssl.SSLContext) -> tuple[int, str]:
    """Call gpuadm once over a fresh connection; a review of a GPU pod for POST."""

    async def go() -> tuple[int, str]:
        async with aiohttp.ClientSession() as session:
            url = f"https://localhost:{server.port}{path}"
            body = review(pod({"gpuadm.io/h100": "1"}), uid="with-or-without")
            kwargs: dict[str, Any] = {"json": body} if method == "POST" else {}
            async with session.request(method, url, ssl=context, **kwargs) as response:
                return response.status, await response.text()

    return asyncio.run(go())


def test_a_caller_with_a_certificate_of_the_ca_is_answered(
    server: ServeProcess, client_ca: CertifiedKey, tmp_path: Path
) -> None:
    context = context_with(server, tmp_path, make_client(client_ca, "kube-apiserver"))
    for path in ("/mutate", "/validate"):
        status, body = call(server, "POST", path, context)
        assert status == 200, body
        assert '"uid":"with-or-without"' in body


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_caller_without_a_certificate_gets_401(
    server: ServeProcess, tmp_path: Path, path: str
) -> None:
    status, body = call(server, "POST", path, context_with(server, tmp_path, None))
    assert status == 401
    assert "client certificate signed by gpuadm's --client-ca-file is required" in body


def test_a_certificate_of_another_ca_fails_the_handshake(
    server: ServeProcess, tmp_path: Path
) -> None:
    stranger = make_client(make_ca(now=datetime.now(UTC)), "not-the-apiserver")
    with pytest.raises(aiohttp.ClientError):
        call(server, "POST", "/validate", context_with(server, tmp_path, stranger))


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_probes_and_metrics_need_no_certificate(
    server: ServeProcess, tmp_path: Path, path: str
) -> None:
    status, _ = call(server, "GET", path, context_with(server, tmp_path, None))
    assert status == 200
