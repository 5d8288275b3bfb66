"""gpuadm installed as users install it: its image on a real node, by its Helm chart.

`Installation` drives `helm` against a control plane that a `KubeletNode` has joined, reads
gpuadm's own pods, and creates tenant pods from many threads at once, each answer sorted into
what the apiserver said: created, refused by gpuadm, or a webhook that could not be called.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e.cluster import ControlPlane
from tests.e2e.conftest import _sigterm_as_interrupt
from tests.e2e.kubelet import (
    NODE_LABEL,
    REAL_NODE_CONTROLLERS,
    KubeletNode,
    node_prerequisites,
)
from tests.e2e.patience import spent
from tests.support import ROOT

CHART = ROOT / "deploy" / "helm" / "gpuadm"
# The example policy and quotas, under each test's values: the chart's defaults hold no class.
EXAMPLE_VALUES = ROOT / "examples" / "values-example.yaml"
IMAGE_SCRIPT = ROOT / "image" / "build.sh"
RELEASE = "gpuadm"
NAMESPACE = "gpuadm-system"
POD_SELECTOR = "app.kubernetes.io/name=gpuadm"
# Short, so that a leader's death is seen in seconds; the bound the test holds it to.
LEASE_SECONDS = 3
# Never pulled: the tenant pods ask for GPUs, which the real node does not have, so they
# stay Pending, stored and charged, and never run.
TENANT_IMAGE = "registry.invalid/app:1"
GPU_CLASS = "gpuadm.io/h100"
# How gpuadm's refusals that a retry may turn around end (docs/troubleshooting.md).
RETRY_ASKED = re.compile(r"retry( the request| in a few seconds| then)?\.?$")
RETRIED = ("unreachable", "retry")
# The commit of release 0.1.0: its chart and, built from its own Dockerfile, its image.
RELEASE_0_1_0 = "30e64139f707ffb77167563c37c800ca2283c096"
CACHE_ROOT = Path(os.environ.get("GPUADM_CACHE", Path.home() / ".cache" / "gpuadm"))


@dataclass(frozen=True)
class Image:
    """An image archive to load into the node, and the name it is loaded under."""

    archive: Path
    name: str

    @property
    def repository(self) -> str:
        return self.name.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.name.rsplit(":", 1)[1]


def helm_binary() -> Path:
    """helm, built from its Go module by deploy/tools/install.sh if not yet cached."""
    result = subprocess.run(
        ["bash", str(ROOT / "deploy" / "tools" / "install.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"deploy/tools/install.sh exited {result.returncode}:\n{result.stderr}"
        )
    for directory in result.stdout.strip().splitlines()[-1].split(os.pathsep):
        if (Path(directory) / "helm").is_file():
            return Path(directory) / "helm"
    raise AssertionError(f"deploy/tools/install.sh built no helm: {result.stdout}")


def build_image() -> Image:
    """Build gpuadm's image from the Dockerfile (cached), as `make image` does."""
    result = subprocess.run(
        ["bash", str(IMAGE_SCRIPT)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise AssertionError(f"{IMAGE_SCRIPT} exited {result.returncode}:\n{result.stderr}")
    archive, name = result.stdout.split()[-2:]
    return Image(Path(archive), name)


def released_tree(commit: str) -> Path:
    """The repository's tree at `commit`, exported once from git history (`git archive`) into
    the cache: the sources an earlier release's image is built from, and its chart."""
    directory = CACHE_ROOT / "releases" / commit
    if (directory / "Dockerfile").is_file():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    partial = directory.with_name(f"{commit}.partial.{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", commit],
            capture_output=True,
            check=False,
        )
        if archive.returncode != 0:
            raise AssertionError(
                f"git archive {commit} exited {archive.returncode} (a shallow clone lacks "
                f"the release's commit: fetch it, or clone with history):\n"
                f"{archive.stderr.decode(errors='replace')}"
            )
        subprocess.run(["tar", "-x", "-C", str(partial)], input=archive.stdout, check=True)
        try:
            partial.rename(directory)
        except OSError:
            # Another session exported it meanwhile: the same commit, the same tree.
            shutil.rmtree(partial, ignore_errors=True)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return directory


def released_chart(commit: str) -> Path:
    """The Helm chart as it was at `commit`."""
    return released_tree(commit) / "deploy" / "helm" / "gpuadm"


def build_released_image(commit: str) -> Image:
    """The image of the release at `commit`, built from that tree's own Dockerfile by this
    tree's image/build.sh on the same Debian base, and cached as the current image is."""
    result = subprocess.run(
        ["bash", str(IMAGE_SCRIPT), str(released_tree(commit))],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "GPUADM_REVISION": commit},
    )
    if result.returncode != 0:
        raise AssertionError(f"{IMAGE_SCRIPT} exited {result.returncode}:\n{result.stderr}")
    archive, name = result.stdout.split()[-2:]
    return Image(Path(archive), name)


@dataclass
class Outcomes:
    """What the apiserver answered a batch of creates, sorted."""

    created: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    # "failed calling webhook": the apiserver could not reach gpuadm; with the validating
    # webhook's failurePolicy Fail this refuses the create, which the client may retry.
    unreachable: list[str] = field(default_factory=list)
    # A refusal that asks to retry: the mutating call failed (failurePolicy Ignore) and the
    # validating webhook saw an unrewritten pod, or a replica was not yet able to judge.
    retry: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    # Every answer that was retried, whatever the retry's own answer was.
    retried: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, message: str) -> None:
        with self.lock:
            getattr(self, kind).append(message)

    def merge(self, other: Outcomes) -> None:
        """Add the answers of another batch to this one's."""
        with self.lock:
            for kind in ("created", "refused", "unreachable", "retry", "other", "retried"):
                getattr(self, kind).extend(getattr(other, kind))


class Installation:
    """gpuadm's chart installed on a control plane with a real node."""

    def __init__(self, plane: ControlPlane, node: KubeletNode, helm: Path, image: Image) -> None:
        self.plane = plane
        self.node = node
        self.helm_binary = helm
        self.image = image
        self.api = plane.api_client()
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.values_dir = Path(plane.workdir) / "values"
        self.values_dir.mkdir(exist_ok=True)

    # -- helm ---------------------------------------------------------------

    def helm(self, *args: str, timeout: float = 300) -> str:
        result = subprocess.run(
            [str(self.helm_binary), "--kubeconfig", str(self.plane.kubeconfig_path), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env={**os.environ, "HELM_CACHE_HOME": str(self.values_dir / "helm-cache")},
        )
        if result.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}\n"
                f"{self.describe()}"
            )
        return result.stdout

    def values(self, image: Image, quotas: dict[str, Any], **more: Any) -> dict[str, Any]:
        """The values a test installs with: this image, on the real node, these quotas. They
        go over examples/values-example.yaml, whose policy and quotas Helm merges them into."""
        return {
            "image": {"repository": image.repository, "tag": image.tag, "pullPolicy": "Never"},
            "nodeSelector": {NODE_LABEL: "true"},
            "extraArgs": [f"--lease-seconds={LEASE_SECONDS}"],
            "quotas": quotas,
            **more,
        }

    def install(
        self, values: dict[str, Any], chart: Path = CHART, examples: Path | None = EXAMPLE_VALUES
    ) -> None:
        """`helm install` of `chart` (this tree's by default) with `values` over `examples`;
        an earlier release's chart, whose defaults held example classes, takes None."""
        self._helm_apply("install", values, chart, examples)

    def upgrade(
        self, values: dict[str, Any], chart: Path = CHART, examples: Path | None = EXAMPLE_VALUES
    ) -> None:
        self._helm_apply("upgrade", values, chart, examples)

    def _helm_apply(
        self, verb: str, values: dict[str, Any], chart: Path, examples: Path | None
    ) -> None:
        path = self.values_dir / f"{verb}-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(values))
        self.helm(
            verb,
            RELEASE,
            str(chart),
            "--namespace",
            NAMESPACE,
            *(["--create-namespace"] if verb == "install" else []),
            *(["--values", str(examples)] if examples is not None else []),
            "--values",
            str(path),
            "--wait",
            "--timeout",
            "240s",
        )

    # -- gpuadm's pods --------------------------------------------------------

    def gpuadm_pods(self) -> list[kubernetes.client.V1Pod]:
        pods = self.core.list_namespaced_pod(NAMESPACE, label_selector=POD_SELECTOR).items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def all_pods_are(self, image: str) -> bool:
        """Whether every gpuadm pod, terminating ones included, runs `image`."""
        pods = self.core.list_namespaced_pod(NAMESPACE, label_selector=POD_SELECTOR).items
        return bool(pods) and all(p.spec.containers[0].image == image for p in pods)

    def ready_pods(self) -> list[kubernetes.client.V1Pod]:
        def ready(pod: kubernetes.client.V1Pod) -> bool:
            conditions = pod.status.conditions or []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        return [p for p in self.gpuadm_pods() if ready(p)]

    def kill(self, pod_name: str) -> None:
        """Kill one of gpuadm's pods outright: no grace, as a node failure or an OOM kill."""
        self.core.delete_namespaced_pod(pod_name, NAMESPACE, grace_period_seconds=0)

    def leader(self) -> str:
        """The name of the pod whose replica holds the queue's Lease."""
        lease = kubernetes.client.CoordinationV1Api(self.api).read_namespaced_lease(
            "gpuadm-leader", NAMESPACE
        )
        holder: str = lease.spec.holder_identity or ""
        # A replica's identity is its host name (the pod's name) and a random suffix.
        return holder.rsplit("_", 1)[0]

    def describe(self) -> str:
        """gpuadm's pods, their containers' states and the node's logs, for a failure."""
        lines = []
        try:
            for pod in self.core.list_namespaced_pod(NAMESPACE).items:
                states = [
                    f"{s.name} ready={s.ready} restarts={s.restart_count} state={s.state}"
                    for s in pod.status.container_statuses or []
                ]
                lines.append(f"{pod.metadata.name} {pod.status.phase} {states}")
                for status in pod.status.container_statuses or []:
                    if status.restart_count or not status.ready:
                        lines.append(self.pod_log(pod.metadata.name, previous=True))
        except ApiException as error:
            lines.append(f"(cannot list pods: {error.reason})")
        lines.append(self.node.log_tail("kubelet", 20))
        return "\n".join(lines)

    def describe_all(self, lines: int = 1000) -> str:
        """The last `lines` lines of every gpuadm container's log, the dead ones' too (the
        kubelet removes a deleted pod's logs with it)."""
        directory = self.node.workdir / "kubelet" / "pod-logs"
        return "\n".join(
            f"--- {path} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            for path in sorted(directory.glob(f"{NAMESPACE}_*/gpuadm/*.log"))
        )

    def pod_log(self, name: str, previous: bool = False) -> str:
        """The last lines gpuadm's container in pod `name` wrote, from the kubelet's logs."""
        directory = self.node.workdir / "kubelet" / "pod-logs"
        files = sorted(directory.glob(f"{NAMESPACE}_{name}_*/gpuadm/*.log"))
        if not files:
            return f"(no log of {name})"
        text = files[-2 if previous and len(files) > 1 else -1].read_text(errors="replace")
        return f"--- {name} ---\n" + "\n".join(text.splitlines()[-15:])

    # -- tenants ----------------------------------------------------------------

    def make_namespace(self, name: str) -> None:
        self.core.create_namespace({"metadata": {"name": name}})

        def has_default_account() -> bool:
            try:
                self.core.read_namespaced_service_account("default", name)
            except ApiException:
                return False
            return True

        wait_for(has_default_account, f"the default ServiceAccount of {name}")

    def create_gpu_pod(self, namespace: str, gpus: str = "1") -> dict[str, Any]:
        """Create a pod asking for the h100 class; return the pod as stored."""
        response = self.core.create_namespaced_pod(namespace, gpu_pod(gpus), _preload_content=False)
        stored: dict[str, Any] = json.loads(response.data)
        return stored

    def create_many(
        self,
        namespace: str,
        count: int,
        *,
        threads: int = 16,
        retries: int = 5,
        midway: Callable[[], None] | None = None,
    ) -> Outcomes:
        """Create `count` GPU pods from `threads` threads; sort each final answer.

        A create the apiserver could not send to gpuadm, or that gpuadm refused asking for a
        retry, is retried, as a client (a Job controller, kubectl in a script) would, up to
        `retries` times. `midway` runs once,
        from the calling thread, when about a quarter of the creates have been answered.
        """
        outcomes = Outcomes()
        answered = threading.Semaphore(0)

        def one(_: int) -> None:
            client = self.plane.api_client()
            core = kubernetes.client.CoreV1Api(client)
            try:
                for attempt in range(retries + 1):
                    kind, message = classify(lambda: create(core, namespace))
                    if kind not in RETRIED or attempt == retries:
                        outcomes.add(kind, message)
                        return
                    outcomes.add("retried", message)
                    time.sleep(0.2)
            finally:
                client.close()
                answered.release()

        with ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(one, i) for i in range(count)]
            if midway is not None:
                for _ in range(count // 4):
                    answered.acquire()
                midway()
            for future in futures:
                future.result()
        return outcomes


def gpu_pod(gpus: str = "1") -> dict[str, Any]:
    """A tenant pod asking for `gpus` of the h100 class."""
    container = {"name": "main", "image": TENANT_IMAGE, "resources": {"limits": {GPU_CLASS: gpus}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "gpu-"},
        "spec": {"containers": [container]},
    }


def create(core: kubernetes.client.CoreV1Api, namespace: str) -> str:
    """Create one one-GPU pod; return its name."""
    name: str = core.create_namespaced_pod(namespace, gpu_pod()).metadata.name
    return name


def classify(call: Callable[[], str]) -> tuple[str, str]:
    """Run one create; say whether it was created, refused by gpuadm, or not sent to it."""
    try:
        return "created", call()
    except ApiException as error:
        try:
            message = json.loads(error.body or "{}").get("message", "")
        except ValueError:
            message = str(error.body)
        if "failed calling webhook" in message:
            return "unreachable", message
        if error.status == 403 and "denied the request" in message:
            return "retry" if RETRY_ASKED.search(message) else "refused", message
        return "other", f"{error.status}: {message}"


@dataclass
class Stream:
    """Creates GPU pods one after another until stopped; keeps every failure."""

    installation: Installation
    namespace: str
    created: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Stream:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        client = self.installation.plane.api_client()
        core = kubernetes.client.CoreV1Api(client)
        try:
            while not self._stop.is_set():
                kind, message = classify(lambda: create(core, self.namespace))
                if kind == "created":
                    self.created += 1
                else:
                    self.failures.append(f"{kind}: {message}")
                self._stop.wait(0.05)
        finally:
            client.close()


@contextmanager
def on_a_real_node(image: Image, *more: Image) -> Iterator[Installation]:
    """A control plane with the controllers a Deployment needs, a real node with `image`
    (and `more`, e.g. an earlier release's) loaded, and the `Installation` that will put
    gpuadm there; all stopped at the end."""
    problem = node_prerequisites()
    if problem:
        pytest.fail(f"the real node cannot run here: {problem}", pytrace=False)
    with _sigterm_as_interrupt(), ControlPlane.for_real_node() as plane:
        plane.start_scheduler(["default-scheduler"])
        plane.start_controller_manager(REAL_NODE_CONTROLLERS)
        with KubeletNode(plane) as node:
            for each in (image, *more):
                node.load_image(each.archive)
            yield Installation(plane, node, helm_binary(), image)


def wait_for(check: Callable[[], bool], what: str, seconds: float = 120) -> float:
    """Wait until `check()` holds; return how long it took; fail after `seconds`, stretched by
    the machine's load (`tests.e2e.patience`)."""
    start = time.monotonic()
    while not check():
        if spent(time.monotonic() - start, seconds):
            elapsed = time.monotonic() - start
            raise AssertionError(f"timed out after {elapsed:.0f} s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - start
