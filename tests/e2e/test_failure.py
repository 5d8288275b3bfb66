"""What the shipped failure policies do when gpuadm cannot be reached."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.fixtures import Deployment
from tests.e2e.gpuadm import register_webhooks
from tests.support import free_port


@pytest.fixture
def restore_routing(gpuadm: Deployment) -> Iterator[None]:
    yield
    gpuadm.route(len(gpuadm.processes))
    register_webhooks(
        gpuadm.api,
        gpuadm.ca_file,
        mutate_url=f"{gpuadm.url}/mutate",
        validate_url=f"{gpuadm.url}/validate",
    )


@pytest.mark.usefixtures("restore_routing")
def test_when_only_mutation_fails_the_gpu_pod_is_sent_back_to_retry(
    gpuadm: Deployment, namespace: str
) -> None:
    nowhere = f"https://127.0.0.1:{free_port()}/mutate"
    register_webhooks(
        gpuadm.api, gpuadm.ca_file, mutate_url=nowhere, validate_url=f"{gpuadm.url}/validate"
    )
    message = gpuadm.refusal(namespace, {"gpuadm.io/a100": "1"})
    assert 'admission webhook "validate.gpuadm.io" denied the request' in message
    assert "not processed by gpuadm's mutating webhook" in message
    assert "retry the request" in message
    gpuadm.create_pod(namespace, {"cpu": "100m"})
    # A share is not an integer: the apiserver's own validation, which runs before any
    # validating webhook, refuses it with its own words.
    share = gpuadm.refusal(namespace, {"gpuadm.io/a100": "0.5"})
    assert "must be an integer" in share


@pytest.mark.usefixtures("restore_routing")
def test_when_gpuadm_is_down_gpu_pods_are_refused_and_plain_pods_are_created(
    gpuadm: Deployment, namespace: str
) -> None:
    gpuadm.route(0)
    message = gpuadm.refusal(namespace, {"gpuadm.io/h100": "1"})
    assert 'failed calling webhook "validate.gpuadm.io"' in message
    untyped = gpuadm.refusal(namespace, {"nvidia.com/gpu": "1"})
    assert 'failed calling webhook "validate.gpuadm.io"' in untyped
    plain = gpuadm.create_pod(namespace, {"cpu": "100m"})
    assert "gpuadm.io/class" not in (plain["metadata"].get("labels") or {})
