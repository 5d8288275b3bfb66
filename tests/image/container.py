"""The gpuadm image, built by ``image/build.sh`` and run by runc as a pod's container would be.

No kubelet and no container engine: the OCI archive is unpacked by umoci into a runc bundle,
whose ``config.json`` is then set up as ``deploy/`` sets up the pod: the image's user, a
read-only root filesystem, no privilege escalation, every capability dropped, and a writable
``/tmp`` bound from a host directory, which is what an ``emptyDir`` volume is. Two things
differ from a pod: there is no seccomp profile (the manifests ask for RuntimeDefault, the
runtime's own), and the container shares the host's network namespace (the pod's own would
need a CNI plugin), so gpuadm's port is reached on loopback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "image" / "build.sh"
# A cold build makes the Debian base and installs gpuadm from PyPI: about a minute and a half
# on two cores. The limit is for a build that hangs, not a measure of speed.
BUILD_TIMEOUT_SECONDS = 1200
STOP_TIMEOUT_SECONDS = 10
OCI_REF_NAME = "org.opencontainers.image.ref.name"
# The user the image runs as, and the manifests' runAsUser.
IMAGE_UID = 65532


class ImageError(AssertionError):
    """The image could not be built, unpacked or run."""


@dataclass(frozen=True)
class BuiltImage:
    """An OCI archive and the name it holds the image under."""

    archive: Path
    name: str


def build_image() -> BuiltImage:
    """Run ``image/build.sh`` (a no-op when the image is cached) and return what it printed."""
    try:
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT)],
            capture_output=True,
            text=True,
            check=False,
            timeout=BUILD_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired as error:
        raise ImageError(f"image/build.sh ran over {BUILD_TIMEOUT_SECONDS} s") from error
    if result.returncode != 0:
        raise ImageError(f"image/build.sh exited {result.returncode}:\n{result.stderr[-6000:]}")
    lines = result.stdout.splitlines()
    if len(lines) != 2:
        raise ImageError(f"image/build.sh printed {lines!r}, not an archive and a name")
    return BuiltImage(Path(lines[0]), lines[1])


def read_blob(archive: tarfile.TarFile, digest: str) -> dict[str, Any]:
    """Return a JSON blob of an OCI layout, by its digest."""
    algorithm, hex_digest = digest.split(":", 1)
    member = archive.extractfile(f"blobs/{algorithm}/{hex_digest}")
    assert member is not None, f"{digest} is not a file in the archive"
    blob: dict[str, Any] = json.load(member)
    return blob


def read_index(image: BuiltImage) -> dict[str, Any]:
    """Return the archive's ``index.json``."""
    with tarfile.open(image.archive) as archive:
        member = archive.extractfile("index.json")
        assert member is not None, "the archive has no index.json"
        index: dict[str, Any] = json.load(member)
        return index


def read_config(image: BuiltImage) -> dict[str, Any]:
    """Return the OCI image configuration of the image the archive names ``image.name``."""
    (descriptor,) = (
        m
        for m in read_index(image)["manifests"]
        if m.get("annotations", {}).get(OCI_REF_NAME) == image.name
    )
    with tarfile.open(image.archive) as archive:
        manifest = read_blob(archive, descriptor["digest"])
        return read_blob(archive, manifest["config"]["digest"])


def require(*tools: str) -> None:
    """Fail, naming the package, when a tool the image tests run is missing."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        raise ImageError(f"{', '.join(missing)} not found: on Debian, apt-get install runc umoci")


def unpack(image: BuiltImage, bundle: Path) -> None:
    """Unpack the image into a runc bundle (``rootfs/`` and ``config.json``) with umoci."""
    require("umoci")
    layout = bundle.with_name(bundle.name + "-layout")
    layout.mkdir()
    with tarfile.open(image.archive) as archive:
        archive.extractall(layout, filter="tar")
    _run(["umoci", "unpack", "--image", f"{layout}:{image.name}", str(bundle)])
    shutil.rmtree(layout)


def harden(bundle: Path, *, args: list[str], tmp: Path, binds: dict[str, Path]) -> dict[str, Any]:
    """Set the bundle's ``config.json`` up as the Deployment's pod and container are.

    The user, the environment and the working directory stay as umoci read them from the
    image. `args` replace the command; `tmp` is bound at ``/tmp`` read-write; each of `binds`
    (container path: host directory) is bound read-only. Returns the configuration written.
    """
    path = bundle / "config.json"
    config: dict[str, Any] = json.loads(path.read_text())
    process = config["process"]
    process["args"] = args
    process["terminal"] = False
    process["noNewPrivileges"] = True
    process["capabilities"] = {
        kind: [] for kind in ("bounding", "effective", "inheritable", "permitted", "ambient")
    }
    config["root"]["readonly"] = True
    config["hostname"] = "gpuadm"
    config["linux"]["namespaces"] = [
        n for n in config["linux"]["namespaces"] if n["type"] != "network"
    ]
    config["mounts"].append(
        {
            "destination": "/tmp",
            "type": "bind",
            "source": str(tmp),
            "options": ["rbind", "rw", "nosuid", "nodev"],
        }
    )
    for destination, source in binds.items():
        config["mounts"].append(
            {
                "destination": destination,
                "type": "bind",
                "source": str(source),
                "options": ["rbind", "ro", "nosuid", "nodev", "noexec"],
            }
        )
    path.write_text(json.dumps(config, indent=2))
    return config


class Container:
    """One runc container of a bundle, run in the foreground of a child process."""

    def __init__(self, bundle: Path, state: Path, log: Path) -> None:
        require("runc")
        self.id = f"gpuadm-image-test-{uuid.uuid4().hex[:12]}"
        self.state = state
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [*self._runc(), "run", "--bundle", str(bundle), self.id],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def _runc(self) -> list[str]:
        # A state directory of its own, apart from any containerd's.
        return ["runc", "--root", str(self.state)]

    def running(self) -> bool:
        """Whether the container's first process is still running."""
        return self.process.poll() is None

    def output(self) -> str:
        """What the container's first process has written so far."""
        return self.log.read_text(errors="replace")

    def pid(self) -> int:
        """The host's pid of the container's first process."""
        state = json.loads(_run([*self._runc(), "state", self.id]).stdout)
        pid: int = state["pid"]
        return pid

    def exec(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run a command in the running container as its process runs (user, environment)."""
        return subprocess.run(
            [*self._runc(), "exec", self.id, *argv],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )

    def stop(self) -> None:
        """Kill the container and remove it; safe when it has already exited."""
        subprocess.run([*self._runc(), "kill", self.id, "KILL"], capture_output=True, check=False)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        subprocess.run(
            [*self._runc(), "delete", "--force", self.id], capture_output=True, check=False
        )


def wait_for(condition: Callable[[], bool], *, seconds: float, describe: Callable[[], str]) -> None:
    """Poll `condition()` until it is true; fail with `describe()` after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise ImageError(f"gave up after {seconds} s:\n{describe()}")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
    if result.returncode != 0:
        raise ImageError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stderr}")
    return result
