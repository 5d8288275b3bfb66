"""`gpuadm certs show` verifies: the key pairs, the chain, the expiry, and that the
webhooks' caBundle vouches for what is served; exit 1 on any mismatch."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from certs import new_ca, new_serving_cert, service_dns_names
from certs.material import CertifiedKey
from tests.webhook.cli.apiserver import fake_apiserver
from webhook.cli import main

NOW = datetime.now(UTC)
NAMES = service_dns_names("gpuadm", "gpuadm-system")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secret(ca: CertifiedKey, serving: CertifiedKey) -> dict[str, object]:
    return {
        "kind": "Secret",
        "metadata": {"name": "gpuadm-tls", "namespace": "gpuadm-system"},
        "data": {
            "ca.crt": _b64(ca.cert_pem),
            "ca.key": _b64(ca.key_pem),
            "tls.crt": _b64(serving.cert_pem),
            "tls.key": _b64(serving.key_pem),
        },
    }


def _webhooks(kind: str, bundle: bytes) -> dict[str, object]:
    return {
        "kind": kind,
        "metadata": {"name": "gpuadm"},
        "webhooks": [{"name": "x.gpuadm.io", "clientConfig": {"caBundle": _b64(bundle)}}],
    }


def _show(tmp_path: Path, secret: dict[str, object], bundle: bytes) -> int:
    with fake_apiserver() as apiserver:
        base = "/apis/admissionregistration.k8s.io/v1"
        apiserver.objects.update(
            {
                "/api/v1/namespaces/gpuadm-system/secrets/gpuadm-tls": secret,
                f"{base}/mutatingwebhookconfigurations/gpuadm": _webhooks(
                    "MutatingWebhookConfiguration", bundle
                ),
                f"{base}/validatingwebhookconfigurations/gpuadm": _webhooks(
                    "ValidatingWebhookConfiguration", bundle
                ),
            }
        )
        kubeconfig = apiserver.kubeconfig(tmp_path / "kubeconfig")
        return main(["certs", "show", "--kubeconfig", str(kubeconfig)])


def test_a_matching_secret_and_cabundle_are_ok(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca = new_ca(now=NOW)
    serving = new_serving_cert(ca, dns_names=NAMES, now=NOW)
    code = _show(tmp_path, _secret(ca, serving), ca.cert_pem)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ok: the key pairs match, the CA signed the serving certificate" in out


@pytest.mark.parametrize(
    "broken",
    ["cabundle-of-another-ca", "serving-not-signed-by-the-ca", "key-not-the-certificates"],
)
def test_a_mismatch_is_a_problem_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], broken: str
) -> None:
    ca, other = new_ca(now=NOW), new_ca(now=NOW)
    serving = new_serving_cert(ca, dns_names=NAMES, now=NOW)
    bundle = ca.cert_pem
    if broken == "cabundle-of-another-ca":
        bundle = other.cert_pem
        expected = "webhook x.gpuadm.io: its caBundle does not vouch for the serving certificate"
    elif broken == "serving-not-signed-by-the-ca":
        serving = new_serving_cert(other, dns_names=NAMES, now=NOW)
        expected = "problem: ca.crt does not vouch for the serving certificate"
    else:
        stranger = new_serving_cert(ca, dns_names=NAMES, now=NOW)
        serving = CertifiedKey(cert_pem=serving.cert_pem, key_pem=stranger.key_pem)
        expected = "problem: serving: tls.crt and tls.key: the private key does not match"
    code = _show(tmp_path, _secret(ca, serving), bundle)
    out = capsys.readouterr().out
    assert code == 1, out
    assert expected in out
    assert "ok:" not in out


def test_an_expired_serving_certificate_is_a_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    past = NOW - timedelta(days=800)
    ca = new_ca(now=past)
    serving = new_serving_cert(ca, dns_names=NAMES, now=past)
    code = _show(tmp_path, _secret(ca, serving), ca.cert_pem)
    out = capsys.readouterr().out
    assert code == 1
    assert "problem: serving: expired at" in out


def test_files_are_checked_the_same_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["certs", "generate", "--out", str(tmp_path / "a")]) == 0
    assert main(["certs", "generate", "--out", str(tmp_path / "b")]) == 0
    assert main(["certs", "show", "--dir", str(tmp_path / "a")]) == 0
    (tmp_path / "a" / "ca.crt").write_bytes((tmp_path / "b" / "ca.crt").read_bytes())
    capsys.readouterr()
    assert main(["certs", "show", "--dir", str(tmp_path / "a")]) == 1
    assert "problem: ca.crt does not vouch for the serving certificate" in capsys.readouterr().out


def test_the_webhooks_are_listed_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    ca = new_ca(now=NOW)
    serving = new_serving_cert(ca, dns_names=NAMES, now=NOW)
    with fake_apiserver() as apiserver:
        base = "/apis/admissionregistration.k8s.io/v1"
        apiserver.objects.update(
            {
                "/api/v1/namespaces/gpuadm-system/secrets/gpuadm-tls": _secret(ca, serving),
                f"{base}/mutatingwebhookconfigurations/gpuadm": _webhooks(
                    "MutatingWebhookConfiguration", ca.cert_pem
                ),
                f"{base}/validatingwebhookconfigurations/gpuadm": _webhooks(
                    "ValidatingWebhookConfiguration", ca.cert_pem
                ),
            }
        )
        kubeconfig = apiserver.kubeconfig(tmp_path / "kubeconfig")
        assert main(["certs", "show", "--kubeconfig", str(kubeconfig), "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [w["caCertificates"] for w in result["webhooks"]] == [1, 1]
    assert result["valid"] is True
