"""Only the apiserver may call gpuadm: the suite runs it with `--client-ca-file`.

The control plane's admission configuration makes the apiserver present a client
certificate to every webhook (as docs/deploy.md sets it up), and every replica of the
suite requires it. Every pod create in the suite goes through that; these tests show it
directly, and show that a caller without the certificate is turned away.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import pytest

from tests.builders import pod, review
from tests.e2e.cluster import ControlPlane
from tests.e2e.fixtures import Deployment


def post_review(port: int, context: ssl.SSLContext) -> tuple[int, str]:
    """POST a review of a GPU pod to one replica's /validate; return status and body."""
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/validate",
        data=json.dumps(review(pod({"gpuadm.io/h100": "1"}))).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_apiservers_calls_are_answered(gpuadm: Deployment, namespace: str) -> None:
    before = gpuadm.reviews()
    stored = gpuadm.create_pod(namespace, {"gpuadm.io/h100": "1"})
    assert stored["metadata"]["labels"]["gpuadm.io/class"] == "h100"
    assert gpuadm.reviews() >= before + 2  # /mutate and /validate, both answered


@pytest.mark.parametrize("replica", [0, 1, 2])
def test_a_caller_without_the_client_certificate_is_refused(
    gpuadm: Deployment, replica: int
) -> None:
    context = ssl.create_default_context(cafile=gpuadm.ca_file)
    status, body = post_review(gpuadm.processes[replica].port, context)
    assert status == 401
    assert "client certificate" in body


def test_a_caller_with_the_apiservers_certificate_is_answered(
    gpuadm: Deployment, control_plane: ControlPlane
) -> None:
    context = ssl.create_default_context(cafile=gpuadm.ca_file)
    context.load_cert_chain(*control_plane.webhook_client_files)
    status, body = post_review(gpuadm.processes[0].port, context)
    assert status == 200
    assert '"uid":"0f1e2d3c"' in body
