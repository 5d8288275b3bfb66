"""gpuadm for real in the end-to-end suite: `gpuadm serve` processes, registered with the
apiserver through the webhook configurations shipped in deploy/, behind a TCP balancer."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import re
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import kubernetes.client
import yaml
from kubernetes.client.exceptions import ApiException

from certs import TLSPaths, new_ca, new_serving_cert, write_tls_dir
from tests.e2e.cluster import GPUADM_USER, ControlPlane
from tests.e2e.patience import spent
from tests.support import ROOT, free_port, spawn_serve, wait_until_listening
from webhook.config.snapshot import revision_of

DEPLOY_BASE = ROOT / "deploy" / "base"
NAMESPACE = "gpuadm-system"
LEASE_SECONDS = 3
# Every scheduler a backend sends pods to; one kube-scheduler serves them all as profiles.
SCHEDULER_NAMES = ("default-scheduler", "hami-scheduler", "volcano", "kai-scheduler")


def make_tls(directory: Path) -> TLSPaths:
    """Make a CA and a serving certificate for 127.0.0.1 with the project's own certs code."""
    now = datetime.now(UTC)
    ca = new_ca(now=now)
    serving = new_serving_cert(ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"], now=now)
    return write_tls_dir(directory, ca=ca, serving=serving)


class GpuadmProcess:
    """One `gpuadm serve` in cluster mode, talking to the control plane as admin."""

    def __init__(
        self,
        plane: ControlPlane,
        tls: TLSPaths,
        workdir: Path,
        index: int,
        *,
        extra_args: Sequence[str] = (),
        client_ca: bool = True,
    ) -> None:
        """Run replica `index`; `extra_args` go after the suite's own arguments. `client_ca`:
        take reviews only from callers with a certificate of the apiserver's, as docs/deploy.md
        sets it up; without it, from any caller, as the chart does by default."""
        self.port = free_port()
        self._client_ca = client_ca
        self._extra_args = tuple(extra_args)
        self.log_path = workdir / f"gpuadm-{index}.log"
        self._tls = tls
        self._plane = plane
        self._context = ssl.create_default_context(cafile=tls.ca_file)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the process and wait until it is listening."""
        with self.log_path.open("ab") as log:
            self.process = spawn_serve(
                self.port,
                "--gpuadm-namespace",
                NAMESPACE,
                "--kubeconfig",
                # As its own user, the one it trusts by default (its service account's name).
                str(self._plane.kubeconfig_of(GPUADM_USER)),
                "--cert-file",
                str(self._tls.cert_file),
                "--key-file",
                str(self._tls.key_file),
                # Reviews from the apiserver only, as docs/deploy.md sets it up.
                *(
                    ("--client-ca-file", str(self._plane.webhook_client_ca_file))
                    if self._client_ca
                    else ()
                ),
                # A dead leader's Lease runs out in 3 s rather than 15, to keep tests short.
                "--lease-seconds",
                str(LEASE_SECONDS),
                *self._extra_args,
                log=log,
            )
        wait_until_listening(self.process, self.port, self.log_tail)
        wait_until(
            lambda: self._get("/healthz")[0] == 200, f"gpuadm on port {self.port}", self.log_tail
        )

    def restart(self, extra_args: Sequence[str]) -> None:
        """Stop the process and start it again with `extra_args` after the suite's own."""
        self.stop()
        self._extra_args = tuple(extra_args)
        self.start()

    def kill(self) -> None:
        """Kill the process at once (SIGKILL), as a node failure would: no clean shutdown."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def leading(self) -> bool:
        """Tell whether this replica holds the Lease (it says so in its metrics)."""
        return self.metric("gpuadm_queue_leader") == 1

    def stop(self) -> None:
        """Stop the process."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def ready(self) -> bool:
        """Tell whether /readyz answers 200."""
        return self._get("/readyz")[0] == 200

    def metrics(self) -> str:
        """Return the /metrics text."""
        return self._get("/metrics")[1]

    def metric(self, name: str, **labels: str) -> float:
        """Return the sum of a metric's samples whose labels include `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            match = re.match(r"^([a-zA-Z_:]+)(\{(.*)\})? (\S+)$", line)
            if not match or match[1] != name:
                continue
            found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match[3] or ""))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(match[4])
        return total

    def log_tail(self) -> str:
        """Return the end of the process's log."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-4000:]

    def _get(self, path: str) -> tuple[int, str]:
        url = f"https://127.0.0.1:{self.port}{path}"
        try:
            with urllib.request.urlopen(url, context=self._context, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except OSError:
            return 0, ""


class Routing(Protocol):
    """What a deployment asks of what is in front of its replicas."""

    port: int

    def route_to(self, ports: list[int]) -> None: ...


class Balancer:
    """A TCP round-robin balancer on loopback: one address in front of several gpuadm processes,
    as a Service is in front of a Deployment's replicas. TLS passes through untouched."""

    def __init__(self) -> None:
        self.port = free_port()
        self.backends: list[int] = []
        self._cycle: Iterator[int] = iter(())
        self._server: asyncio.Server
        self._open: dict[int, set[asyncio.StreamWriter]] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def route_to(self, ports: list[int]) -> None:
        """Send new connections to these ports, in turn; cut open ones to any other port."""
        self.backends = list(ports)
        self._cycle = itertools.cycle(self.backends) if self.backends else iter(())
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._cut_all_but(set(ports)), self._loop).result(
                timeout=10
            )

    async def _cut_all_but(self, ports: set[int]) -> None:
        for backend, writers in list(self._open.items()):
            if backend not in ports:
                for writer in writers:
                    writer.close()
                writers.clear()

    def start(self) -> None:
        """Listen in a background thread."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)

    def stop(self) -> None:
        """Stop listening and close every connection it carries."""
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _close(self) -> None:
        self._server.close()
        current = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend = next(self._cycle, None)
        if backend is None:
            writer.close()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", backend)
        except OSError:
            writer.close()
            return
        open_here = self._open.setdefault(backend, set())
        open_here.update((writer, upstream_writer))
        try:
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        finally:
            open_here.difference_update((writer, upstream_writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError):
        writer.close()


def shipped_webhook_configurations() -> list[dict[str, Any]]:
    """Return the two webhook configurations exactly as deploy/base ships them."""
    found = []
    for path in sorted(DEPLOY_BASE.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if isinstance(document, dict) and document.get("kind") in (
                "MutatingWebhookConfiguration",
                "ValidatingWebhookConfiguration",
            ):
                found.append(document)
    assert len(found) == 2, f"expected two webhook configurations in {DEPLOY_BASE}, got {found}"
    return found


def install_quota_view(api: kubernetes.client.ApiClient) -> None:
    """Create the GPUQuota CRD and its aggregated viewer role as deploy/base ships them, and
    wait until the CRD is served."""
    documents = [
        *yaml.safe_load_all((DEPLOY_BASE / "crd.yaml").read_text()),
        *yaml.safe_load_all((DEPLOY_BASE / "clusterrole.yaml").read_text()),
    ]
    extensions = kubernetes.client.ApiextensionsV1Api(api)
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    for document in documents:
        if document["kind"] == "CustomResourceDefinition":
            with contextlib.suppress(ApiException):
                extensions.create_custom_resource_definition(document)
        elif document["metadata"]["name"] == "gpuadm-quota-view":
            with contextlib.suppress(ApiException):
                rbac.create_cluster_role(document)

    def established() -> bool:
        crd = extensions.read_custom_resource_definition("gpuquotas.gpuadm.io")
        return any(
            c.type == "Established" and c.status == "True" for c in crd.status.conditions or ()
        )

    wait_until(established, "the GPUQuota CRD to be established")


def register_webhooks(
    api: kubernetes.client.ApiClient,
    ca_file: Path,
    *,
    mutate_url: str,
    validate_url: str,
) -> None:
    """Create (or replace) the shipped webhook configurations, pointed at loopback URLs."""
    admission = kubernetes.client.AdmissionregistrationV1Api(api)
    ca_bundle = base64.b64encode(ca_file.read_bytes()).decode()
    for configuration in shipped_webhook_configurations():
        for webhook in configuration["webhooks"]:
            url = mutate_url if configuration["kind"].startswith("Mutating") else validate_url
            webhook["clientConfig"] = {"url": url, "caBundle": ca_bundle}
        name = configuration["metadata"]["name"]
        mutating = configuration["kind"].startswith("Mutating")
        delete = (
            admission.delete_mutating_webhook_configuration
            if mutating
            else admission.delete_validating_webhook_configuration
        )
        create = (
            admission.create_mutating_webhook_configuration
            if mutating
            else admission.create_validating_webhook_configuration
        )
        with contextlib.suppress(ApiException):
            delete(name)
        create(configuration)


def put_configmap(core: kubernetes.client.CoreV1Api, name: str, key: str, text: str) -> None:
    """Create or replace one of gpuadm's ConfigMaps."""
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {key: text},
    }
    try:
        core.replace_namespaced_config_map(name, NAMESPACE, body)
    except ApiException as error:
        if error.status != 404:
            raise
        core.create_namespaced_config_map(NAMESPACE, body)


def wait_for_policy(processes: list[GpuadmProcess], policy_text: str) -> None:
    """Wait until every process has the given policy in force."""
    _wait_for_revision(processes, "policy", policy_text)


def wait_for_quotas(processes: list[GpuadmProcess], quotas_text: str) -> None:
    """Wait until every process has the given quotas in force."""
    _wait_for_revision(processes, "quotas", quotas_text)


def _wait_for_revision(processes: list[GpuadmProcess], config: str, text: str) -> None:
    revision = revision_of(text)
    for process in processes:
        wait_until(
            lambda p=process: p.metric("gpuadm_config_revision_info", **{config: revision}) == 1,
            f"{config} {revision} in force on port {process.port}",
            process.log_tail,
        )


def wait_until(check: Any, what: str, details: Any = lambda: "", seconds: float = 60) -> None:
    """Poll `check` until it is true; fail naming `what` once `seconds` have passed, stretched
    by the machine's load (`tests.e2e.patience`)."""
    start = time.monotonic()
    while not spent(time.monotonic() - start, seconds):
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(
        f"timed out after {time.monotonic() - start:.0f} s waiting for {what}\n{details()}"
    )
