"""Generic fixtures for end-to-end tests against a real kube-apiserver.

Every test under this directory gets the ``e2e`` marker, so ``-m "not e2e"``
deselects the suite on machines without Go. Project-specific fixtures belong
in their own module, not here.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import ControlPlane

if TYPE_CHECKING:
    from tests.e2e.installed import Image

E2E_DIR = Path(__file__).resolve().parent
TEST_LABEL = "gpuadm.test/e2e"
TEST_ANNOTATION = "gpuadm.test/test-id"
# The most of a fixture's logs a failed test's report carries.
LOGS_KEPT = 200_000


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``e2e`` marker."""
    config.addinivalue_line(
        "markers",
        "e2e: runs against a local kube-apiserver and etcd built from source (needs Go)",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test collected from this directory as ``e2e``."""
    # This hook sees the whole session's items, not just this directory's.
    for item in items:
        if item.path.is_relative_to(E2E_DIR):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach to a failed test the logs of what it ran on: each of its fixtures that can
    describe itself (a `describe_all()` method, as a gpuadm installation has) is asked.

    A failure on a real node is often a race seen once in many runs: the logs written
    then are the only account of it, and the node and its logs are gone after the run."""
    report = yield
    if report.failed and call.when == "call":
        for name, value in getattr(item, "funcargs", {}).items():
            describe = getattr(value, "describe_all", None)
            if callable(describe):
                try:
                    text = str(describe())
                    if len(text) > LOGS_KEPT:  # the end: what led to the failure
                        text = f"(the last {LOGS_KEPT} characters)\n{text[-LOGS_KEPT:]}"
                    report.sections.append((f"logs of {name}", text))
                except Exception as error:  # the report must not fail for its logs
                    report.sections.append((f"logs of {name}", f"(cannot read: {error!r})"))
    return report


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """Yield a running control plane shared by the session; always stopped at the end."""
    with _sigterm_as_interrupt(), ControlPlane() as plane:
        yield plane


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> Iterator[kubernetes.client.ApiClient]:
    """Yield an admin ``ApiClient`` for the session's control plane."""
    with control_plane.api_client() as client:
        yield client


@pytest.fixture(scope="session")
def core_v1(api_client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    """Return a ``CoreV1Api`` acting as admin."""
    return kubernetes.client.CoreV1Api(api_client)


@pytest.fixture
def namespace(
    request: pytest.FixtureRequest, core_v1: kubernetes.client.CoreV1Api
) -> Iterator[str]:
    """Create a fresh, labelled namespace for one test and yield its name.

    With no kube-controller-manager running, nothing ever finalizes a deleted
    namespace: it stays ``Terminating`` (refusing new objects) until the
    control plane is thrown away at the end of the session. That is enough to
    keep tests apart, once its pods are gone: they are deleted at once after it.
    """
    name = f"e2e-{uuid.uuid4().hex[:12]}"
    body = kubernetes.client.V1Namespace(
        metadata=kubernetes.client.V1ObjectMeta(
            name=name,
            labels={TEST_LABEL: "true"},
            annotations={TEST_ANNOTATION: request.node.nodeid},
        )
    )
    core_v1.create_namespace(body)
    try:
        yield name
    finally:
        _delete_namespace(core_v1, name)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Make SIGTERM unwind like Ctrl-C, so fixtures still tear down.

    CI runners stop a job that overruns its time limit with SIGTERM, which by
    default ends Python without running any cleanup and would leave the
    control plane's temporary directory behind.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _delete_namespace(core_v1: kubernetes.client.CoreV1Api, name: str) -> None:
    """Delete a test's namespace, then its pods, at once.

    A pod left pending in a namespace being deleted (and one that is never finalized, when
    no controller-manager runs) would be bound by the scheduler to the first node that fits
    it, and a later test's nodes would find their GPUs taken by another test's pods. The
    namespace goes first: once it is terminating, no controller makes pods in it again."""
    try:
        core_v1.delete_namespace(name)
    except ApiException as error:
        if error.status != 404:
            raise
    core_v1.delete_collection_namespaced_pod(name, grace_period_seconds=0)


@pytest.fixture(scope="session")
def image() -> Image:
    """This tree's image, for the modules that install gpuadm's chart on a real node."""
    # Imported here: tests.e2e.installed imports this module (`make dev-cluster` loads it
    # first, without pytest).
    from tests.e2e.installed import build_image

    return build_image()


# gpuadm's own fixtures live beside the generic ones; importing them here makes pytest see them.
from tests.e2e.fixtures import controller_manager, gpuadm, scheduler  # noqa: E402, F401
