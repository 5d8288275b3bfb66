"""No traceback from any command: each command against each failure an admin meets.

Every expected failure ends with one line, `gpuadm: <reason>`, and exit 2 (could not run);
a "no" answer is exit 1 on stdout. Each command runs as a real `gpuadm` process, as an admin
would run it, against a real socket, file or HTTP server.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.webhook.cli.apiserver import fake_apiserver, write_kubeconfig
from webhook.cli import main

POLICY = str(ROOT / "examples" / "policy.yaml")
QUOTAS = str(ROOT / "examples" / "quotas.yaml")


@dataclass
class World:
    """The broken things the commands meet."""

    tmp: Path
    closed: Path  # a kubeconfig naming a loopback port nobody listens on
    unauthorised: Path  # a kubeconfig whose token the apiserver refuses
    missing: Path  # a path that does not exist
    pod_without_metadata: Path
    mismatched_tls: Path  # a directory whose tls.key is not tls.crt's key
    port_in_use: int


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("failures")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    pod = tmp / "pod.yaml"
    pod.write_text(
        "kind: Pod\nspec:\n  containers:\n  - name: a\n    image: b\n"
        "    resources: {limits: {gpuadm.io/a100: 1}}\n"
    )
    for name in ("one", "two"):
        assert main(["certs", "generate", "--out", str(tmp / name)]) == 0
    (tmp / "one" / "tls.key").write_bytes((tmp / "two" / "tls.key").read_bytes())
    with fake_apiserver() as apiserver, socket.socket() as busy:
        apiserver.token = "the-right-one"
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield World(
            tmp=tmp,
            closed=write_kubeconfig(tmp / "closed.kubeconfig", f"https://127.0.0.1:{closed_port}"),
            unauthorised=apiserver.kubeconfig(tmp / "unauthorised.kubeconfig", token="wrong"),
            missing=tmp / "nowhere",
            pod_without_metadata=pod,
            mismatched_tls=tmp / "one",
            port_in_use=busy.getsockname()[1],
        )


Argv = Callable[[World], list[str]]

CLUSTER_COMMANDS: list[tuple[str, Argv]] = [
    ("quota", lambda w: ["quota"]),
    ("usage", lambda w: ["usage"]),
    ("certs-show", lambda w: ["certs", "show"]),
    ("certs-install", lambda w: ["certs", "install"]),
    ("certs-rotate", lambda w: ["certs", "rotate"]),
    ("uninstall", lambda w: ["uninstall"]),
    ("uninstall-dry-run", lambda w: ["uninstall", "--dry-run"]),
]
KUBECONFIGS: list[tuple[str, Callable[[World], Path], str]] = [
    ("unreachable", lambda w: w.closed, "cannot reach the apiserver at https://127.0.0.1:"),
    ("unauthorised", lambda w: w.unauthorised, "401: Unauthorized"),
    ("no-kubeconfig", lambda w: w.missing, "cannot reach a cluster"),
]

CASES = [
    *(
        pytest.param(
            (lambda w, a=argv, k=kube: [*a(w), "--kubeconfig", str(k(w))]),
            2,
            reason,
            id=f"{name}-{failure}",
        )
        for name, argv in CLUSTER_COMMANDS
        for failure, kube, reason in KUBECONFIGS
    ),
    pytest.param(
        lambda w: ["serve", "--kubeconfig", str(w.missing)],
        2,
        "cannot reach a cluster",
        id="serve-no-kubeconfig",
    ),
    pytest.param(
        lambda w: ["check-config", str(w.missing)], 2, "cannot read", id="check-config-missing"
    ),
    pytest.param(
        lambda w: ["check-config", "/nonexistent.yaml"],
        2,
        "cannot read /nonexistent.yaml",
        id="check-config-nonexistent",
    ),
    pytest.param(
        lambda w: ["review", str(w.missing), "--policy", POLICY],
        2,
        "cannot read pod",
        id="review-missing-pod",
    ),
    pytest.param(
        lambda w: ["review", str(w.pod_without_metadata), "--policy", str(w.missing)],
        2,
        "nowhere: No such file or directory",
        id="review-missing-policy",
    ),
    pytest.param(
        lambda w: [
            "review",
            str(w.pod_without_metadata),
            "--policy",
            POLICY,
            "--quotas",
            str(w.missing),
        ],
        2,
        "nowhere: No such file or directory",
        id="review-missing-quotas",
    ),
    pytest.param(
        lambda w: ["review", str(w.pod_without_metadata), "--policy", POLICY, "--quotas", QUOTAS],
        0,
        "",
        id="review-pod-without-metadata",
    ),
    pytest.param(
        lambda w: ["certs", "show", "--dir", str(w.missing)],
        2,
        "cannot read",
        id="certs-show-missing-dir",
    ),
    pytest.param(
        lambda w: ["certs", "show", "--dir", str(w.mismatched_tls)],
        1,
        "",
        id="certs-show-key-not-the-certificates",
    ),
    pytest.param(
        lambda w: ["certs", "generate", "--out", POLICY],
        2,
        "cannot write to",
        id="certs-generate-onto-a-file",
    ),
    pytest.param(
        lambda w: ["serve", "--policy", str(w.missing)],
        2,
        "cannot read config",
        id="serve-missing-policy",
    ),
    pytest.param(
        lambda w: [
            "serve",
            "--policy",
            POLICY,
            "--cert-file",
            str(w.missing),
            "--key-file",
            str(w.missing),
        ],
        2,
        "cannot read --cert-file",
        id="serve-missing-certificate",
    ),
    pytest.param(
        lambda w: [
            "serve",
            "--policy",
            POLICY,
            "--cert-file",
            str(w.mismatched_tls / "tls.crt"),
            "--key-file",
            str(w.mismatched_tls / "tls.key"),
        ],
        2,
        "cannot load the TLS files",
        id="serve-key-not-the-certificates",
    ),
    pytest.param(
        lambda w: ["serve", "--policy", POLICY, "--client-ca-file", str(w.missing)],
        2,
        "cannot read --client-ca-file",
        id="serve-missing-client-ca",
    ),
    pytest.param(
        lambda w: [
            "serve",
            "--policy",
            POLICY,
            "--host",
            "127.0.0.1",
            "--port",
            str(w.port_in_use),
            "--tls-dir",
            str(w.tmp / "serve-tls"),
        ],
        2,
        "cannot listen on 127.0.0.1:",
        id="serve-port-in-use",
    ),
]


@pytest.mark.parametrize(("argv", "code", "reason"), CASES)
def test_no_command_ends_in_a_traceback(world: World, argv: Argv, code: int, reason: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", *argv(world)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.returncode == code, output
    if code == 2:
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("gpuadm: "), result.stderr
        assert reason in last, result.stderr


def test_the_fake_apiserver_lets_the_right_token_in(tmp_path: Path) -> None:
    """The unauthorised case fails on the token alone: the right one reads the cluster."""
    with fake_apiserver() as apiserver:
        apiserver.token = "the-right-one"
        apiserver.objects["/api/v1/namespaces/gpuadm-system/configmaps"] = _config_maps()
        kubeconfig = apiserver.kubeconfig(tmp_path / "kc", token="the-right-one")
        result = subprocess.run(
            [sys.executable, "-m", "webhook.cli", "quota", "--kubeconfig", str(kubeconfig)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 0, result.stderr
    assert "team-a" in result.stdout


def _config_maps() -> dict[str, object]:
    def config_map(name: str, key: str, path: str) -> dict[str, object]:
        return {"metadata": {"name": name}, "data": {key: Path(path).read_text()}}

    return {
        "kind": "ConfigMapList",
        "metadata": {},
        "items": [
            config_map("gpuadm-policy", "policy.yaml", POLICY),
            config_map("gpuadm-quotas", "quotas.yaml", QUOTAS),
        ],
    }
