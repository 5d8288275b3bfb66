"""The image users deploy, built from the Dockerfile and run as the Deployment runs it.

Built by ``image/build.sh`` on a Debian base made locally, then run by runc as user 65532
on a read-only root filesystem, with no capabilities and no privilege escalation (see
``tests/image/container.py``): it must serve HTTPS, judge a review, and write nowhere but
``/tmp``. Marked ``e2e`` as well, so ``make test-fast`` leaves it out with the other suites
that build what they run; ``make test`` fails, not skips, when the image cannot be built.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from tests.builders import POLICY_YAML, QUOTAS_YAML, pod, review
from tests.image.container import (
    IMAGE_UID,
    OCI_REF_NAME,
    ROOT,
    BuiltImage,
    Container,
    ImageError,
    harden,
    read_config,
    read_index,
    unpack,
    wait_for,
)
from tests.support import free_port

pytestmark = [pytest.mark.image, pytest.mark.e2e]

VERSION: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# What `gpuadm --version` prints: the version as Python's packaging writes it (0.3.0rc1).
PRINTED_VERSION = str(Version(VERSION))
START_SECONDS = 60


@dataclass(frozen=True)
class Served:
    """gpuadm serving from the image in a runc container."""

    container: Container
    port: int
    tls_dir: Path

    def request(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, bytes]:
        """Call gpuadm over HTTPS, trusting only the CA it wrote to its /tmp."""
        context = ssl.create_default_context(cafile=self.tls_dir / "ca.crt")
        connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=context)
        try:
            payload = None if body is None else json.dumps(body)
            headers = {} if body is None else {"Content-Type": "application/json"}
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()


@pytest.fixture(scope="module")
def served(image: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """Run the image's own command, `gpuadm serve`, standalone on the test policy."""
    work = tmp_path_factory.mktemp("image")
    bundle = work / "bundle"
    try:
        unpack(image, bundle)
    except ImageError as error:
        pytest.fail(str(error), pytrace=False)
    # An emptyDir: a host directory any user may write.
    tmp = work / "tmp"
    tmp.mkdir()
    tmp.chmod(0o777)
    config = work / "config"
    config.mkdir()
    (config / "policy.yaml").write_text(POLICY_YAML)
    (config / "quotas.yaml").write_text(QUOTAS_YAML)
    image_config = read_config(image)["config"]
    port = free_port()
    args = [
        *image_config["Entrypoint"],
        *image_config["Cmd"],
        *("--host", "127.0.0.1", "--port", str(port), "--tls-dir", "/tmp/tls"),
        *("--policy", "/etc/gpuadm/policy.yaml", "--quotas", "/etc/gpuadm/quotas.yaml"),
    ]
    harden(bundle, args=args, tmp=tmp, binds={"/etc/gpuadm": config})
    state = work / "runc"
    try:
        container = Container(bundle, state, work / "container.log")
    except ImageError as error:
        pytest.fail(str(error), pytrace=False)
    running = Served(container, port, tmp / "tls")
    try:
        wait_for(
            lambda: not container.running() or _healthy(running),
            seconds=START_SECONDS,
            describe=container.output,
        )
        if not container.running():
            pytest.fail(f"the container exited:\n{container.output()}", pytrace=False)
        yield running
    finally:
        container.stop()


def _healthy(served: Served) -> bool:
    if not (served.tls_dir / "ca.crt").exists():
        return False
    try:
        return served.request("GET", "/healthz")[0] == 200
    except OSError:
        return False


def test_the_archive_holds_the_image_under_its_printed_name(image: BuiltImage) -> None:
    # `ctr images import` names the image by this annotation.
    (manifest,) = read_index(image)["manifests"]
    assert manifest["annotations"][OCI_REF_NAME] == image.name
    assert re.fullmatch(rf"gpuadm\.local/gpuadm:{re.escape(VERSION)}-[0-9a-f]{{16}}", image.name)


def test_labels_say_what_the_image_is_and_where_it_came_from(image: BuiltImage) -> None:
    labels = read_config(image)["config"]["Labels"]
    assert labels["org.opencontainers.image.title"] == "gpuadm"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.source"] == "https://github.com/gpuadm/gpuadm"
    assert labels["org.opencontainers.image.description"]
    assert labels["org.opencontainers.image.base.name"].startswith(
        "gpuadm.local/debian-python3:bookworm-"
    )
    revision = labels["org.opencontainers.image.revision"]
    commit = re.fullmatch(r"([0-9a-f]{40})(-dirty)?", revision)
    assert commit, revision
    exists = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit[1]}^{{commit}}"], check=False
    )
    assert exists.returncode == 0, f"{revision} is no commit of this repository"


def test_the_image_runs_gpuadm_serve_as_65532(image: BuiltImage) -> None:
    config = read_config(image)["config"]
    assert config["User"] == f"{IMAGE_UID}:{IMAGE_UID}"
    assert config["Entrypoint"] == ["gpuadm"]
    assert config["Cmd"] == ["serve"]
    assert "8443/tcp" in config["ExposedPorts"]
    (path,) = (e.removeprefix("PATH=") for e in config["Env"] if e.startswith("PATH="))
    assert path.split(":")[0] == "/opt/gpuadm/bin"


def test_serves_health_and_a_review_over_https(served: Served) -> None:
    status, _ = served.request("GET", "/healthz")
    assert status == 200
    status, body = served.request("POST", "/mutate", review(pod({"gpuadm.io/h100": "1"})))
    assert status == 200
    answer = json.loads(body)["response"]
    assert answer["allowed"] is True
    assert answer["patchType"] == "JSONPatch"
    assert "Traceback" not in served.container.output()


def test_the_server_runs_as_65532_without_capabilities(served: Served) -> None:
    fields = dict(
        line.split(":", 1)
        for line in Path(f"/proc/{served.container.pid()}/status").read_text().splitlines()
    )
    assert fields["Uid"].split() == [str(IMAGE_UID)] * 4
    assert fields["Gid"].split() == [str(IMAGE_UID)] * 4
    assert int(fields["CapEff"], 16) == 0
    assert fields["NoNewPrivs"].strip() == "1"


def test_id_in_the_container_is_65532(served: Served) -> None:
    for flag in ("-u", "-g"):
        result = served.container.exec("id", flag)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == str(IMAGE_UID)


def test_the_root_filesystem_is_read_only_and_tmp_is_not(served: Served) -> None:
    for path in ("/probe", "/opt/gpuadm/probe"):
        result = served.container.exec("touch", path)
        assert result.returncode != 0
        assert "Read-only file system" in result.stderr
    result = served.container.exec("touch", "/tmp/probe")
    assert result.returncode == 0, result.stderr


def test_gpuadm_version_is_the_project_version(served: Served) -> None:
    result = served.container.exec("gpuadm", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"gpuadm {PRINTED_VERSION}"
