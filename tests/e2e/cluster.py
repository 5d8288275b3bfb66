"""A throwaway Kubernetes control plane (etcd, kube-apiserver, kube-scheduler) for tests.

This plays the role controller-runtime's envtest plays for Go projects: the
real kube-apiserver, kube-scheduler, kube-controller-manager and etcd binaries,
built from their published Go modules by ``controlplane/build.sh``, run as
local processes on free loopback ports. The scheduler runs only once
``start_scheduler()`` is called, and the controller manager, with the few
controllers the suite needs, once ``start_controller_manager()`` is. There
is no kubelet: pods are stored and admitted, and with the scheduler and nodes
created through the API they are bound to a node (``spec.nodeName``), but
they never run and stay ``Pending``.

Typical use::

    with ControlPlane() as cp:
        core = kubernetes.client.CoreV1Api(cp.api_client())
        cp.start_scheduler(["default-scheduler"])
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import http.client
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO

import kubernetes.client
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.certs.factory import make_ca, make_client

__all__ = ["ControlPlane", "ControlPlaneError", "ensure_binaries", "spawn_logged", "terminate"]

BUILD_SCRIPT = Path(__file__).resolve().parent / "controlplane" / "build.sh"
LOOPBACK = "127.0.0.1"
ADMIN_USER = "admin"
ADMIN_GROUP = "system:masters"
# The users gpuadm and kube-controller-manager run as, with their names in a real cluster
# (gpuadm's service account; the controller manager without service-account credentials):
# gpuadm trusts these names. Both are in the admin group; RBAC is not under test here.
GPUADM_USER = "system:serviceaccount:gpuadm-system:gpuadm"
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
# A tenant, in no group but system:authenticated: it may do only what RBAC grants it by name.
TENANT_USER = "tenant"
LOG_TAIL_LINES = 40
STOP_GRACE_SECONDS = 5.0
POLL_INTERVAL_SECONDS = 0.25
# Every process the control plane may run, in the order stop() ends them.
PROCESSES = ("kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd")
# The controllers start_controller_manager runs unless told otherwise.
CONTROLLERS = (
    "resourceclaim-controller",
    "job-controller",
    "clusterrole-aggregation-controller",
)
PR_SET_PDEATHSIG = 1
# Resolved now, not in the forked child, where loading a library could block
# on a lock some other thread of this process held at fork time.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


class ControlPlaneError(RuntimeError):
    """The control plane binaries could not be built or did not start."""


def ensure_binaries() -> Path:
    """Build the control plane's binaries if needed and return their directory.

    ``build.sh`` does nothing when the binaries are already cached, so this is
    cheap after the first run. Its progress is echoed to stderr as it happens
    (a cold build takes many minutes). A missing Go toolchain is an error,
    not a reason to skip: the message says what to install.
    """
    with subprocess.Popen(
        ["bash", str(BUILD_SCRIPT)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stderr is not None
        assert process.stdout is not None
        tail = _echo_and_keep_tail(process.stderr)
        stdout = process.stdout.read()
    if process.returncode != 0:
        raise ControlPlaneError(
            f"{BUILD_SCRIPT} failed with exit code {process.returncode}:\n" + "".join(tail)
        )
    lines = stdout.strip().splitlines()
    if not lines:
        raise ControlPlaneError(f"{BUILD_SCRIPT} printed no bin directory")
    return Path(lines[-1])


def _echo_and_keep_tail(stream: IO[str]) -> collections.deque[str]:
    """Copy ``stream`` to our stderr line by line, keeping the last lines."""
    tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
    for line in stream:
        sys.stderr.write(line)
        tail.append(line)
    return tail


class ControlPlane:
    """An etcd plus kube-apiserver pair with an admin token, on loopback only.

    Use it as a context manager, or call ``start()`` and ``stop()``;
    ``start_scheduler()`` adds a kube-scheduler. All state (etcd data,
    certificates, keys, kubeconfig, scheduler config and process logs) lives in
    one temporary directory that ``stop()`` removes. ``feature_gates`` sets the same
    Kubernetes feature gates in every component it runs, to try an alpha API.
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        start_timeout: float = 90.0,
        extra_apiserver_args: Sequence[str] = (),
        *,
        feature_gates: Mapping[str, bool] = {},
    ) -> None:
        """Prepare, but do not start, a control plane.

        ``bin_dir`` defaults to the output of ``ensure_binaries()``.
        ``extra_apiserver_args`` are appended to kube-apiserver's command line
        (for example ``--v=4`` when debugging webhook calls).

        ``feature_gates`` (such as ``{"DRAConsumableCapacity": True}``) go, as one
        ``--feature-gates=Name=true,...`` sorted by name, to kube-apiserver, kube-scheduler and
        kube-controller-manager alike: an alpha API field is kept in storage only by an
        apiserver with its gate on, and acted on only by a scheduler or controller with it on.
        The scheduler reads the flag beside ``--config``: its gates are set from the command
        line before the configuration file is loaded and defaulted, and every profile of the
        file this class writes has the default plugins (``DynamicResources`` among them, as
        ``DynamicResourceAllocation`` is on by default since 1.34). Without gates no flag is
        passed and every component runs with its release's defaults.
        """
        self._bin_dir = bin_dir
        self._start_timeout = start_timeout
        self._extra_apiserver_args = list(extra_apiserver_args)
        self._gate_args = _feature_gate_args(feature_gates)
        self._service_account_admission = False
        self._workdir: Path | None = None
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self.token = secrets.token_urlsafe(32)
        self._tokens = {
            user: secrets.token_urlsafe(32)
            for user in (GPUADM_USER, CONTROLLER_MANAGER_USER, TENANT_USER)
        }
        self._tokens[ADMIN_USER] = self.token
        self.url = ""
        # etcd's client address, plain HTTP on loopback: its /metrics says what it stores.
        self.etcd_url = ""

    # -- public API -------------------------------------------------------

    @property
    def workdir(self) -> Path:
        """The temporary directory holding all state and the process logs."""
        if self._workdir is None:
            raise ControlPlaneError("the control plane is not started")
        return self._workdir

    @classmethod
    def for_real_node(cls) -> ControlPlane:
        """A control plane that a real node (``kubelet.KubeletNode``) can join.

        Pods on the node reach the apiserver on the bridge's address, so it listens on every
        address; it calls webhooks through their Service by dialling an endpoint, as there is
        no kube-proxy; and it gives every pod its ServiceAccount's token, which the suite's
        other control plane leaves out.
        """
        plane = cls(
            extra_apiserver_args=("--bind-address=0.0.0.0", "--enable-aggregator-routing=true")
        )
        plane._service_account_admission = True
        return plane

    @property
    def bin_dir(self) -> Path:
        """The directory of the built binaries (kubelet included)."""
        if self._bin_dir is None:
            raise ControlPlaneError("the control plane is not started")
        return self._bin_dir

    @property
    def ca_file(self) -> Path:
        """PEM file to verify the apiserver's serving certificate with.

        Without ``--tls-cert-file`` kube-apiserver generates a CA and a serving
        certificate (with 127.0.0.1 among its names) and writes both to
        ``apiserver.crt``, so that file works as the trust bundle.
        """
        return self.workdir / "apiserver-certs" / "apiserver.crt"

    @property
    def webhook_client_ca_file(self) -> Path:
        """The CA of the client certificate the apiserver presents to every webhook.

        A webhook started with it as its client CA (gpuadm's ``--client-ca-file``) answers
        the apiserver and nobody else; ``webhook_client_files`` is the same certificate,
        for a test that must call such a webhook directly.
        """
        return self.workdir / "webhook-client" / "ca.crt"

    @property
    def webhook_client_files(self) -> tuple[Path, Path]:
        """The apiserver's webhook client certificate and key."""
        directory = self.workdir / "webhook-client"
        return directory / "client.crt", directory / "client.key"

    @property
    def kubeconfig_path(self) -> Path:
        """A kubeconfig file for the admin user, for people and subprocesses."""
        return self.workdir / "kubeconfig"

    def kubeconfig_of(self, user: str) -> Path:
        """Return a kubeconfig file for one of the control plane's users (``GPUADM_USER``...)."""
        return self.workdir / f"kubeconfig-{self._safe(user)}"

    def log_path(self, name: str) -> Path:
        """Return the combined stdout/stderr log file of one of ``PROCESSES``."""
        return self.workdir / f"{name}.log"

    def log_tail(self, name: str) -> str:
        """Return the last lines of a process's log under a heading, or "" if it has none."""
        path = self.log_path(name)
        if not path.exists():
            return ""
        lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        return f"--- last lines of {path} ---\n" + "\n".join(lines)

    def api_client(self) -> kubernetes.client.ApiClient:
        """Return an official Kubernetes ``ApiClient`` authenticated as admin."""
        configuration = kubernetes.client.Configuration(host=self.url)
        # Everything is on loopback; never route it through an HTTP(S)_PROXY
        # that happens to be set in the environment.
        configuration.proxy = None
        configuration.api_key = {"authorization": self.token}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        configuration.ssl_ca_cert = str(self.ca_file)
        return kubernetes.client.ApiClient(configuration)

    def raise_if_exited(self) -> None:
        """Raise ``ControlPlaneError``, with the log tails, if a process has exited."""
        for name, process in self._processes.items():
            if process.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with code {process.returncode}\n{self._log_tails()}"
                )

    def start(self) -> ControlPlane:
        """Start etcd and kube-apiserver and wait until the apiserver is ready.

        On failure everything started so far is stopped again and a
        ``ControlPlaneError`` carrying the tails of both logs is raised.
        """
        if self._processes:
            raise ControlPlaneError("the control plane is already started")
        self._bin_dir = self._bin_dir or ensure_binaries()
        self._workdir = Path(tempfile.mkdtemp(prefix="gpuadm-controlplane-"))
        try:
            self._start_processes(self._bin_dir)
        except BaseException:
            self.stop()
            raise
        return self

    def start_scheduler(self, scheduler_names: Sequence[str]) -> None:
        """Start kube-scheduler with one profile per name in ``scheduler_names``.

        A pod is placed by the profile its ``spec.schedulerName`` names, so
        one process stands in for every scheduler the names stand for. It has
        no HTTP endpoint to ask whether it is ready (``--secure-port=0``):
        callers wait for what it does to a pod, a binding or a
        ``FailedScheduling`` condition, with a bounded wait.
        """
        if "kube-scheduler" in self._processes:
            raise ControlPlaneError("the scheduler is already started")
        if self._bin_dir is None or not self._processes:
            raise ControlPlaneError("the control plane is not started")
        config = self.workdir / "kube-scheduler.yaml"
        config.write_text(yaml.safe_dump(self._scheduler_config(scheduler_names)))
        self._spawn(
            "kube-scheduler",
            [
                str(self._bin_dir / "kube-scheduler"),
                f"--config={config}",
                # Nothing probes or scrapes it; with 0 it opens no port at all.
                "--secure-port=0",
                *self._gate_args,
            ],
        )

    def start_controller_manager(self, controllers: Sequence[str] = CONTROLLERS) -> None:
        """Start kube-controller-manager with the controllers the suite needs.

        - resourceclaim: makes the ResourceClaim of each pod that names a
          ResourceClaimTemplate, as ``<pod>-<entry>-<random>``, and records it in the pod's
          status; the scheduler then allocates it.
        - job: makes the pods of Jobs, and makes them again when they are deleted.
        - clusterrole-aggregation: fills ``view``, ``edit`` and ``admin`` with the rules of the
          ClusterRoles labelled to aggregate into them.

        Nothing else of a controller manager runs, unless ``controllers`` names more (a real
        node's cluster runs those a Deployment needs).
        """
        if "kube-controller-manager" in self._processes:
            raise ControlPlaneError("the controller manager is already started")
        if self._bin_dir is None or not self._processes:
            raise ControlPlaneError("the control plane is not started")
        self._spawn(
            "kube-controller-manager",
            [
                str(self._bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig_of(CONTROLLER_MANAGER_USER)}",
                f"--controllers={','.join(controllers)}",
                # Published into every namespace as kube-root-ca.crt, which each pod's
                # service-account token volume mounts.
                f"--root-ca-file={self.ca_file}",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                "--secure-port=0",
                *self._gate_args,
            ],
        )

    def stop_scheduler(self) -> None:
        """Stop kube-scheduler if it runs; its log stays until ``stop()``."""
        self._stop_one("kube-scheduler")

    def stop_controller_manager(self) -> None:
        """Stop kube-controller-manager if it runs; its log stays until ``stop()``."""
        self._stop_one("kube-controller-manager")

    def _stop_one(self, name: str) -> None:
        process = self._processes.pop(name, None)
        if process is not None:
            terminate(process)

    def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL) and delete the temp dir.

        Safe to call more than once and on a partly started control plane.
        """
        # Clients of the apiserver go before it, and the apiserver before etcd,
        # so that none of them logs a burst of errors about the one below.
        for name in PROCESSES:
            process = self._processes.pop(name, None)
            if process is not None:
                terminate(process)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- startup ----------------------------------------------------------

    def _start_processes(self, bin_dir: Path) -> None:
        etcd_client_port, etcd_peer_port, apiserver_port = _free_ports(3)
        self.url = f"https://{LOOPBACK}:{apiserver_port}"
        etcd_url = self.etcd_url = f"http://{LOOPBACK}:{etcd_client_port}"
        self._spawn("etcd", self._etcd_command(bin_dir, etcd_client_port, etcd_peer_port))
        self._wait_until("etcd", lambda: _probe(f"{etcd_url}/health", None)[0] == 200)
        self._write_service_account_key()
        self._write_token_file()
        self._write_webhook_admission_config()
        self._spawn("kube-apiserver", self._apiserver_command(bin_dir, etcd_url, apiserver_port))
        self._wait_until("kube-apiserver", self._apiserver_ready)
        self._write_kubeconfig()

    def _etcd_command(self, bin_dir: Path, client_port: int, peer_port: int) -> list[str]:
        client_url = f"http://{LOOPBACK}:{client_port}"
        peer_url = f"http://{LOOPBACK}:{peer_port}"
        return [
            str(bin_dir / "etcd"),
            "--name=gpuadm-e2e",
            f"--data-dir={self.workdir / 'etcd-data'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=gpuadm-e2e={peer_url}",
            # The data is thrown away after the run; fsync only slows tests.
            "--unsafe-no-fsync",
        ]

    def _apiserver_command(self, bin_dir: Path, etcd_url: str, port: int) -> list[str]:
        return [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={LOOPBACK}",
            # The address the apiserver puts in its own serving certificate and
            # advertises; left unset it would be the host's first non-loopback
            # address.
            f"--advertise-address={LOOPBACK}",
            # Endpoints may not hold loopback addresses, so keeping the default
            # "kubernetes" Service's endpoints in sync would fail (and log an
            # error) every ten seconds. Nothing in-cluster needs that Service.
            "--endpoint-reconciler-type=none",
            f"--secure-port={port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--service-account-key-file={self.workdir / 'sa.pub'}",
            f"--service-account-signing-key-file={self.workdir / 'sa.key'}",
            # Only embedded in issued tokens as a name; never fetched.
            f"--service-account-issuer={self.url}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            # Without a kube-controller-manager no namespace ever gets its
            # "default" ServiceAccount, and this plugin would reject every pod
            # that does not name an existing one. A real node's cluster runs the
            # controller that makes them, and its pods need their tokens.
            *(
                ()
                if self._service_account_admission
                else ("--disable-admission-plugins=ServiceAccount",)
            ),
            "--allow-privileged=true",
            f"--admission-control-config-file={self.workdir / 'admission.yaml'}",
            *self._gate_args,
            *self._extra_apiserver_args,
        ]

    def _spawn(self, name: str, command: list[str]) -> None:
        self._processes[name] = spawn_logged(command, self.log_path(name), self.workdir)

    def _apiserver_ready(self) -> bool:
        if not self.ca_file.exists():
            return False
        # With the admin token the answer does not depend on RBAC's
        # bootstrap roles, which are themselves one of the readiness checks.
        status, _ = _probe(f"{self.url}/readyz", self._ssl_context(), self.token)
        return status == 200

    def _wait_until(self, name: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self._start_timeout
        while not ready():
            self.raise_if_exited()
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{name} was not ready after {self._start_timeout:.0f}s"
                    f"{self._readyz_details()}\n{self._log_tails()}"
                )
            time.sleep(POLL_INTERVAL_SECONDS)

    def _readyz_details(self) -> str:
        """Explain which readiness checks fail, if the apiserver answers at all."""
        if "kube-apiserver" not in self._processes or not self.ca_file.exists():
            return ""
        _, body = _probe(f"{self.url}/readyz?verbose", self._ssl_context(), self.token)
        return f"\n--- {self.url}/readyz?verbose ---\n{body}" if body else ""

    def _log_tails(self) -> str:
        return "\n".join(filter(None, (self.log_tail(name) for name in reversed(PROCESSES))))

    def _ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    # -- files --------------------------------------------------------------

    def _write_service_account_key(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        private_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        public_pem = key.public_key().public_bytes(
            serialization.Encoding.PEM,
            serialization.PublicFormat.SubjectPublicKeyInfo,
        )
        _write_private(self.workdir / "sa.key", private_pem)
        _write_private(self.workdir / "sa.pub", public_pem)

    def _write_webhook_admission_config(self) -> None:
        """Make the apiserver present a client certificate to every webhook it calls."""
        directory = self.workdir / "webhook-client"
        directory.mkdir()
        ca = make_ca(now=datetime.now(UTC))
        client = make_client(ca, "kube-apiserver")
        _write_private(self.webhook_client_ca_file, ca.cert_pem)
        cert_file, key_file = self.webhook_client_files
        _write_private(cert_file, client.cert_pem)
        _write_private(key_file, client.key_pem)
        kubeconfig = directory / "kubeconfig"
        # The user named "*" is the default for every webhook, by Service name or URL.
        users = [
            {
                "name": "*",
                "user": {"client-certificate": str(cert_file), "client-key": str(key_file)},
            }
        ]
        _write_private(
            kubeconfig,
            yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "users": users}).encode(),
        )
        plugins = [
            {
                "name": plugin,
                "configuration": {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "WebhookAdmissionConfiguration",
                    "kubeConfigFile": str(kubeconfig),
                },
            }
            for plugin in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
        ]
        config = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "AdmissionConfiguration",
            "plugins": plugins,
        }
        _write_private(self.workdir / "admission.yaml", yaml.safe_dump(config).encode())

    def _write_token_file(self) -> None:
        # Format: token,user,uid[,"group1,group2"]
        lines = [
            f"{token},{user},{user}" + ("" if user == TENANT_USER else f',"{ADMIN_GROUP}"') + "\n"
            for user, token in self._tokens.items()
        ]
        _write_private(self.workdir / "tokens.csv", "".join(lines).encode())

    @staticmethod
    def _safe(user: str) -> str:
        return user.replace(":", "-")

    def _scheduler_config(self, scheduler_names: Sequence[str]) -> dict[str, object]:
        return {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig_path)},
            # A single replica: there is nobody to take over from, and electing
            # itself would only delay the first placement.
            "leaderElection": {"leaderElect": False},
            "profiles": [{"schedulerName": name} for name in scheduler_names],
        }

    def _write_kubeconfig(self) -> None:
        for user in self._tokens:
            path = self.kubeconfig_path if user == ADMIN_USER else self.kubeconfig_of(user)
            _write_private(path, yaml.safe_dump(self._kubeconfig(user)).encode())

    def _kubeconfig(self, user: str) -> dict[str, object]:
        name = "gpuadm-e2e"
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": name,
                    "cluster": {
                        "server": self.url,
                        "certificate-authority": str(self.ca_file),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": self._tokens[user]}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": user}}],
            "current-context": name,
        }


def _feature_gate_args(gates: Mapping[str, bool]) -> tuple[str, ...]:
    """Return the ``--feature-gates`` argument for ``gates``, or none when there are none."""
    if not gates:
        return ()
    listed = ",".join(f"{name}={str(on).lower()}" for name, on in sorted(gates.items()))
    return (f"--feature-gates={listed}",)


def _free_ports(count: int) -> list[int]:
    """Return ``count`` distinct loopback ports that were free a moment ago.

    All sockets stay open until every port is picked, so the ports differ.
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]


def _probe(url: str, context: ssl.SSLContext | None, token: str = "") -> tuple[int, str]:
    """GET ``url`` without any proxy; return (status, body), or (0, "") if unreachable."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.build_opener(*handlers).open(request, timeout=5) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode(errors="replace")
    except (OSError, http.client.HTTPException):
        return 0, ""


def spawn_logged(command: list[str], log_path: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start a server process whose output goes to ``log_path`` and that dies with us."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            # Own session: a Ctrl-C in the terminal reaches only Python,
            # which then stops the processes in order.
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def terminate(process: subprocess.Popen[bytes], grace: float = STOP_GRACE_SECONDS) -> None:
    """Stop ``process`` with SIGTERM, escalating to SIGKILL after ``grace`` seconds."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this child if the Python process dies abruptly.

    Covers a test run killed with SIGKILL (for example by a CI timeout), where
    no cleanup code runs and the servers would otherwise keep their ports.
    The signal fires when the thread that started the child exits, so start
    the control plane from a thread that lives as long as it is needed.
    """
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable only by the current user."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
