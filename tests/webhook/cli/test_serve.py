"""`gpuadm serve` as its own process: HTTPS with its own certificate, and live config files."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders import pod, review
from tests.support import ROOT, ServeProcess


@pytest.fixture
def config_files(tmp_path: Path) -> tuple[Path, Path]:
    policy = tmp_path / "policy.yaml"
    quotas = tmp_path / "quotas.yaml"
    policy.write_text((ROOT / "examples" / "policy.yaml").read_text())
    quotas.write_text((ROOT / "examples" / "quotas.yaml").read_text())
    return policy, quotas


@pytest.fixture
def server(tmp_path: Path, config_files: tuple[Path, Path]) -> Iterator[ServeProcess]:
    running = ServeProcess(tmp_path, *config_files)
    yield running
    running.stop()


def test_serves_a_real_review_over_https_with_its_own_certificate(server: ServeProcess) -> None:
    status, answer = server.post("/mutate", review(pod({"gpuadm.io/h100": "1"})))
    assert status == 200
    assert answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"


def test_config_edits_apply_live_and_bad_edits_keep_the_last_good_one(
    server: ServeProcess, config_files: tuple[Path, Path]
) -> None:
    policy, _ = config_files
    body = review(pod({"gpuadm.io/b200": "1"}))
    assert "names no GPU class" in server.post("/mutate", body)[1]["response"]["status"]["message"]

    policy.write_text(policy.read_text() + "  b200:\n    backend: nvidia\n")
    assert _eventually(lambda: server.post("/mutate", body)[1]["response"]["allowed"])

    policy.write_text("classes: {b200: {backend: nope}}\n")
    log = Path(server.log.name)
    assert _eventually(lambda: "config not reloaded" in log.read_text())
    assert "classes.b200.backend: there is no backend 'nope'" in log.read_text()
    assert server.post("/mutate", body)[1]["response"]["allowed"] is True


def test_refuses_to_start_on_an_invalid_policy(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("classes:\n  a:\n    backend: hami\n")
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "serve", "--policy", str(policy)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert f"{policy}:2: classes.a: backend hami needs `memory`" in result.stderr


@pytest.mark.parametrize(
    ("quotas", "problem"),
    [
        pytest.param(b"", "the document is empty; to have no quotas at all", id="empty"),
        pytest.param(b"namespaces: {\xff}\n", "not UTF-8", id="not-utf8"),
    ],
)
def test_refuses_to_start_on_quotas_that_say_nothing_valid(
    tmp_path: Path, quotas: bytes, problem: str
) -> None:
    policy, quotas_file = tmp_path / "policy.yaml", tmp_path / "quotas.yaml"
    policy.write_text((ROOT / "examples" / "policy.yaml").read_text())
    quotas_file.write_bytes(quotas)
    command = ["serve", "--policy", str(policy), "--quotas", str(quotas_file)]
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert problem in result.stderr
    assert "Traceback" not in result.stderr


def _eventually(check: Any, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def test_review_json_output_is_machine_readable(tmp_path: Path) -> None:
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod({"gpuadm.io/a100": "0.5"})))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "review",
            str(path),
            "--policy",
            str(ROOT / "examples" / "policy.yaml"),
            "-o",
            "json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["demand"] == "a100=0.5"
