"""A real node for the test cluster: containerd, runc and CNI from Debian, and a kubelet.

The fake nodes of ``nodes.py`` are Node objects only; the scheduler places pods on them and
nothing runs. This node runs pods: gpuadm's own image, installed by its Helm chart, with
service-account tokens, probes, restarts and rolling updates done by the kubelet as in any
cluster. It needs root, Linux, and the packages ``node/setup.sh`` installs.

What it sets up, all under one temporary directory that ``stop()`` removes:

- containerd on its own socket and state, with the CRI plugin on cgroupfs (the kernel mounts
  cgroup v1 here), the overlayfs snapshotter, and a pause image made locally (``pause.go``),
  so nothing is pulled from a registry;
- a CNI bridge (``BRIDGE``) with host-local addresses from ``POD_SUBNET``, one node per
  machine at a time; the host reaches
  pods on it directly, which is how the apiserver calls a webhook through its Service
  (``--enable-aggregator-routing``: the apiserver dials an endpoint of the Service);
- the ``kubernetes`` Service's address, DNAT-ed by one iptables rule to the apiserver, so
  in-cluster clients reach it as they would through kube-proxy;
- a kubelet, built from the same ``k8s.io/kubernetes`` module as the control plane, that
  registers the node as ``name``.

The cluster must run its apiserver on all addresses with aggregator routing and the
ServiceAccount admission plugin, and a controller manager with the controllers a Deployment
needs: ``ControlPlane.for_real_node()`` and ``start_controller_manager(REAL_NODE_CONTROLLERS)``.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from types import TracebackType

import yaml

from tests.e2e.cluster import ControlPlane, spawn_logged, terminate

__all__ = [
    "BRIDGE",
    "NODE_LABEL",
    "PAUSE_IMAGE",
    "POD_SUBNET",
    "REAL_NODE_CONTROLLERS",
    "KubeletNode",
    "NodeError",
    "node_prerequisites",
]

HERE = Path(__file__).resolve().parent
SETUP_SCRIPT = HERE / "node" / "setup.sh"
PAUSE_SOURCE = HERE / "node" / "pause.go"
PAUSE_IMAGE = "gpuadm.local/pause:3.10"
BRIDGE = "gpuadm0"
POD_SUBNET = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
# The first address of the control plane's --service-cluster-ip-range: the kubernetes
# Service, which every pod is told about in KUBERNETES_SERVICE_HOST.
KUBERNETES_SERVICE_IP = "10.0.0.1"
NODE_LABEL = "gpuadm.test/real-node"
CNI_BIN_DIR = "/usr/lib/cni"
# What a Deployment needs from a controller manager, beside the suite's own three:
# ReplicaSets and their pods, the "default" ServiceAccount and the kube-root-ca.crt
# ConfigMap every pod's token volume mounts, endpoints for the webhook Service, owner
# references (helm uninstall deletes a Deployment in the background), and the PDB status
# evictions read.
REAL_NODE_CONTROLLERS = (
    "resourceclaim-controller",
    "job-controller",
    "clusterrole-aggregation-controller",
    "deployment-controller",
    "replicaset-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "garbage-collector-controller",
    "disruption-controller",
)
READY_TIMEOUT_SECONDS = 120.0
STOP_GRACE_SECONDS = 10.0


class NodeError(RuntimeError):
    """The real node could not be set up or did not become Ready."""


def node_prerequisites() -> str:
    """Return why a real node cannot run here, or "" when it can."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, mounts, network namespaces)"
    missing = [tool for tool in ("containerd", "ctr", "runc", "iptables") if not shutil.which(tool)]
    if not Path(CNI_BIN_DIR, "bridge").exists():
        missing.append(f"{CNI_BIN_DIR}/bridge")
    if missing:
        return f"missing {', '.join(missing)}: run {SETUP_SCRIPT}"
    return ""


class KubeletNode:
    """containerd and a kubelet that register one real node with a running control plane."""

    def __init__(self, plane: ControlPlane, name: str = "gpuadm-node") -> None:
        self.plane = plane
        self.name = name
        self._workdir: Path | None = None
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._nat_rule: list[str] = []
        self._bridge_made = False

    # -- public API -------------------------------------------------------

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise NodeError("the node is not started")
        return self._workdir

    @property
    def socket(self) -> Path:
        """containerd's socket, for ``ctr --address``."""
        return self.workdir / "containerd" / "containerd.sock"

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        return f"--- last lines of {path} ---\n" + "\n".join(tail)

    def start(self) -> KubeletNode:
        problem = node_prerequisites()
        if problem:
            raise NodeError(problem)
        self._workdir = Path(tempfile.mkdtemp(prefix="gpuadm-node-"))
        try:
            self._start_containerd()
            self.load_image(self._pause_archive())
            self._make_bridge()
            self._route_kubernetes_service()
            self._start_kubelet()
            self._wait_ready()
            self._untaint()
        except BaseException:
            self.stop()
            raise
        return self

    def load_image(self, archive: Path) -> None:
        """Import an OCI or docker archive into the CRI's image store, as a registry pull would."""
        self._ctr("images", "import", "--all-platforms", str(archive))

    def tag(self, source: str, target: str) -> None:
        """Give an image the node holds a second name, as a push of a new tag would."""
        self._ctr("images", "tag", "--force", source, target)

    def images(self) -> list[str]:
        """The names of the images the CRI holds."""
        output = self._ctr("images", "list", "--quiet")
        return output.split()

    def stop(self) -> None:
        """Stop the kubelet, every container and containerd; remove the node's traces.

        Safe to call more than once. Containers are killed through their shims, mounts under
        the work directory are undone, and the bridge, the network namespaces and the NAT
        rule are removed, so the next run starts clean.
        """
        kubelet = self._processes.pop("kubelet", None)
        if kubelet is not None:
            terminate(kubelet, STOP_GRACE_SECONDS)
        if self._workdir is not None:
            self._kill_shims()
        containerd = self._processes.pop("containerd", None)
        if containerd is not None:
            terminate(containerd, STOP_GRACE_SECONDS)
        if self._nat_rule:
            subprocess.run(["iptables", "-t", "nat", "-D", *self._nat_rule], check=False)
            self._nat_rule = []
        if self._workdir is not None:
            _unmount_under(self._workdir)
            if self._bridge_made:
                subprocess.run(
                    ["ip", "link", "delete", BRIDGE], check=False, stderr=subprocess.DEVNULL
                )
                self._bridge_made = False
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    def __enter__(self) -> KubeletNode:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- containerd -------------------------------------------------------

    def _start_containerd(self) -> None:
        root = self.workdir / "containerd"
        cni = self.workdir / "cni"
        for directory in (root, cni):
            directory.mkdir()
        (cni / "10-gpuadm.conflist").write_text(json.dumps(self._cni_config(), indent=2))
        config = root / "config.toml"
        config.write_text(self._containerd_config(root, cni))
        self._spawn("containerd", ["containerd", "--config", str(config)])
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not self.socket.exists() or not self._ctr_ok("version"):
            self.raise_if_exited()
            if time.monotonic() > deadline:
                raise NodeError(f"containerd did not start\n{self.log_tail('containerd')}")
            time.sleep(0.2)

    def _containerd_config(self, root: Path, cni: Path) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"

[grpc]
  address = "{self.socket}"

[ttrpc]
  address = "{root / "containerd.sock.ttrpc"}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # This machine's processes may not lower their OOM score (no CAP_SYS_RESOURCE), and the
  # kubelet asks -998 for sandboxes: clamp to containerd's own score instead.
  restrict_oom_score_adj = true
  # Pod network namespaces under this node's own state, not /var/run/netns, so that stopping
  # the node removes its namespaces and no one else's.
  netns_mounts_under_state_dir = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  # The kubelet runs with cgroupDriver: cgroupfs; the two must agree.
  SystemdCgroup = false

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni}"
  max_conf_num = 1
"""

    def _cni_config(self) -> dict[str, object]:
        return {
            "cniVersion": "1.0.0",
            "name": "gpuadm-e2e",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    # The bridge holds the gateway address, so the host (and the apiserver
                    # on it) reaches every pod directly.
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                        # Through the bridge for everything, the kubernetes Service included.
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.workdir / "ipam"),
                    },
                }
            ],
        }

    def _ctr(self, *args: str) -> str:
        result = subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def _ctr_ok(self, *args: str) -> bool:
        try:
            self._ctr(*args)
        except NodeError:
            return False
        return True

    def _pause_archive(self) -> Path:
        """Build the pause binary and wrap it in a one-layer OCI archive."""
        binary = self.workdir / "pause"
        subprocess.run(
            ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(binary), str(PAUSE_SOURCE)],
            check=True,
            env={**os.environ, "CGO_ENABLED": "0"},
            capture_output=True,
        )
        archive = self.workdir / "pause.tar"
        write_oci_archive(archive, PAUSE_IMAGE, {"pause": binary.read_bytes()}, ["/pause"])
        return archive

    # -- network ------------------------------------------------------------

    def _make_bridge(self) -> None:
        """Make the pod bridge with the gateway address now, not with the first pod.

        The kubelet checks that its node IP is on an interface before it reports one, and the
        apiserver's route to pods must exist before the first webhook call. The CNI bridge
        plugin takes over an existing bridge of its name.
        """
        if Path("/sys/class/net", BRIDGE).exists():
            raise NodeError(
                f"the bridge {BRIDGE} exists: another test node runs on this machine (the "
                f"suite, or make dev-cluster). If none does, a killed run left it behind: "
                f"ip link delete {BRIDGE}"
            )
        for command in (
            ["ip", "link", "add", BRIDGE, "type", "bridge"],
            ["ip", "address", "add", f"{POD_GATEWAY}/{POD_SUBNET.split('/')[1]}", "dev", BRIDGE],
            ["ip", "link", "set", BRIDGE, "up"],
        ):
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise NodeError(f"{' '.join(command)}: {result.stderr.strip()}")
            self._bridge_made = True

    def _route_kubernetes_service(self) -> None:
        """Send the kubernetes Service's address to the apiserver, as kube-proxy would."""
        port = self.plane.url.rsplit(":", 1)[1]
        self._nat_rule = [
            "PREROUTING",
            "-s",
            POD_SUBNET,
            "-d",
            f"{KUBERNETES_SERVICE_IP}/32",
            "-p",
            "tcp",
            "--dport",
            "443",
            "-j",
            "DNAT",
            "--to-destination",
            f"{POD_GATEWAY}:{port}",
        ]
        result = subprocess.run(
            ["iptables", "-t", "nat", "-A", *self._nat_rule], capture_output=True, text=True
        )
        if result.returncode != 0:
            self._nat_rule = []
            raise NodeError(f"iptables: {result.stderr.strip()}")

    # -- kubelet ------------------------------------------------------------

    def _start_kubelet(self) -> None:
        root = self.workdir / "kubelet"
        root.mkdir()
        config = root / "config.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config(root)))
        self._spawn(
            "kubelet",
            [
                str(self.plane.bin_dir / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={self.plane.kubeconfig_path}",
                f"--root-dir={root}",
                f"--cert-dir={root / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={POD_GATEWAY}",
                f"--node-labels={NODE_LABEL}=true",
            ],
        )

    def _kubelet_config(self, root: Path) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs",
            # Kubernetes 1.34 still runs on cgroup v1, which this kernel mounts.
            "failCgroupV1": False,
            "failSwapOn": False,
            "address": "127.0.0.1",
            "port": 0,
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(root / "pod-logs"),
            "resolvConf": "",
            # The test's images are imported, never pulled: they must never be collected.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # The host's free disk is the host's business; a test must not be evicted by it.
            "evictionHard": {"memory.available": "100Mi"},
            "protectKernelDefaults": False,
            "maxPods": 30,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "5s",
        }

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not self._node_ready():
            self.raise_if_exited()
            if time.monotonic() > deadline:
                raise NodeError(
                    f"node {self.name} was not Ready after {READY_TIMEOUT_SECONDS:.0f}s\n"
                    f"{self.log_tail('kubelet')}\n{self.log_tail('containerd')}"
                )
            time.sleep(0.5)

    def _untaint(self) -> None:
        """Lift the not-ready taint the kubelet registers with, once the node is Ready.

        In a cluster the node lifecycle controller does this. It does not run here: it would
        also mark the suite's fake nodes, which send no heartbeats, unreachable and evict their
        pods.
        """
        import kubernetes.client

        with self.plane.api_client() as client:
            core = kubernetes.client.CoreV1Api(client)
            node = core.read_node(self.name)
            taints = [t for t in node.spec.taints or [] if t.key != "node.kubernetes.io/not-ready"]
            core.patch_node(self.name, {"spec": {"taints": taints or None}})

    def _node_ready(self) -> bool:
        import kubernetes.client

        with self.plane.api_client() as client:
            try:
                node = kubernetes.client.CoreV1Api(client).read_node(self.name)
            except kubernetes.client.ApiException:
                return False
        conditions = node.status.conditions or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    # -- processes -------------------------------------------------------------

    def _spawn(self, name: str, command: list[str]) -> None:
        self._processes[name] = spawn_logged(command, self.workdir / f"{name}.log", self.workdir)

    def raise_if_exited(self) -> None:
        for name, process in self._processes.items():
            if process.poll() is not None:
                raise NodeError(
                    f"{name} exited with code {process.returncode}\n{self.log_tail(name)}"
                )

    def _kill_shims(self) -> None:
        """Kill the shims of this containerd, and so every container they run."""
        marker = str(self.socket)
        for status in glob.glob("/proc/[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                argv = Path(status).read_bytes().split(b"\0")
                if b"containerd-shim" in argv[0] and marker.encode() in b" ".join(argv):
                    pid = int(Path(status).parent.name)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(os.getpgid(pid), signal.SIGKILL)


def write_oci_archive(
    archive: Path, name: str, files: dict[str, bytes], entrypoint: list[str]
) -> None:
    """Write a one-layer OCI image archive holding ``files`` (executables) at the root."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    layer_bytes = layer.getvalue()
    layer_digest = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
    ).encode()
    config_digest = "sha256:" + hashlib.sha256(config).hexdigest()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest,
                    "size": len(layer_bytes),
                }
            ],
        }
    ).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": manifest_digest,
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        }
    ).encode()
    blobs = {layer_digest: layer_bytes, config_digest: config, manifest_digest: manifest}
    with tarfile.open(archive, mode="w") as tar:
        entries = {
            "oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
            "index.json": index,
            **{f"blobs/sha256/{d.split(':')[1]}": data for d, data in blobs.items()},
        }
        for path, data in entries.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _unmount_under(directory: Path) -> None:
    """Unmount everything mounted below ``directory``, deepest first."""
    prefix = str(directory) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False, stderr=subprocess.DEVNULL)
