"""`gpuadm review` of what users really have: workloads' pod templates, several documents,
Lists and stdin; `-n` for the stored pod too; `--in-use` for what already runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import ROOT
from webhook.cli import main

POLICY = str(ROOT / "examples" / "policy.yaml")
QUOTAS = str(ROOT / "examples" / "quotas.yaml")
POD_SPEC = {
    "containers": [{"name": "main", "image": "x", "resources": {"limits": {"gpuadm.io/h100": "1"}}}]
}
GPUADM = [sys.executable, "-m", "webhook.cli"]
TEMPLATE = {"metadata": {"labels": {"app": "w"}}, "spec": POD_SPEC}


def workload(kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": TEMPLATE}
    if kind == "CronJob":
        spec = {"schedule": "@daily", "jobTemplate": {"spec": {"template": TEMPLATE}}}
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "w"}, "spec": spec}


def review(tmp_path: Path, documents: list[dict[str, Any]], *args: str) -> tuple[int, Any]:
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    capture = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "review",
            str(path),
            "--policy",
            POLICY,
            "--quotas",
            QUOTAS,
            "-o",
            "json",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in capture.stderr, capture.stderr
    return capture.returncode, json.loads(capture.stdout)


@pytest.mark.parametrize(
    "kind", ["Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "Job", "CronJob"]
)
def test_the_pod_template_of_a_workload_is_reviewed(
    kind: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(workload(kind)))
    assert main(["review", str(path), "--policy", POLICY, "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["demand"] == "h100=1"
    stored = result["pod"]
    assert stored["kind"] == "Pod"
    assert stored["metadata"]["generateName"] == "w-"
    assert stored["metadata"]["labels"]["app"] == "w"
    assert stored["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_the_example_job_is_reviewed(capsys: pytest.CaptureFixture[str]) -> None:
    job = str(ROOT / "examples" / "pods" / "h100-job.yaml")
    assert main(["review", job, "--policy", POLICY, "--quotas", QUOTAS]) == 0
    assert "verdict: allowed (namespace team-c)" in capsys.readouterr().out


def test_several_documents_and_lists_are_each_reviewed(tmp_path: Path) -> None:
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": POD_SPEC}
    half = {
        "kind": "Pod",
        "metadata": {"name": "q"},
        "spec": {
            "containers": [
                {"name": "m", "image": "x", "resources": {"limits": {"gpuadm.io/h100": "0.5"}}}
            ]
        },
    }
    listed = {"apiVersion": "v1", "kind": "List", "items": [workload("Job"), half]}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    code, result = review(tmp_path, [pod, service, listed])
    assert code == 1  # one of them would be denied
    verdicts = [(item["object"], item["allowed"]) for item in result["items"]]
    assert verdicts == [("Pod/p", True), ("Job/w", True), ("Pod/q", False)]


def test_stdin_is_read_with_a_dash() -> None:
    job = (ROOT / "examples" / "pods" / "h100-job.yaml").read_text()
    capture = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "review", "-", "--policy", POLICY, "-o", "json"],
        input=job,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert capture.returncode == 0, capture.stderr
    assert json.loads(capture.stdout)["namespace"] == "team-c"


def test_dash_n_is_the_namespace_of_the_stored_pod_too(tmp_path: Path) -> None:
    # A manifest that names another namespace is refused (test_kubectl_habits.py).
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": POD_SPEC}
    code, result = review(tmp_path, [pod], "-n", "team-b")
    assert code == 0
    assert result["namespace"] == "team-b"
    assert result["pod"]["metadata"]["namespace"] == "team-b"


@pytest.mark.parametrize(
    ("in_use", "allowed", "reason"),
    [
        pytest.param([], True, None, id="nothing-runs"),
        pytest.param(["--in-use", "a100=1"], True, None, id="fits-next-to-one"),
        pytest.param(
            ["--in-use", "a100=2"],
            False,
            'namespace "team-d": a100 quota exceeded: requested 1, in use 2 of 2',
            id="full",
        ),
        pytest.param(
            ["--in-use", "a100=1.5,t4=1"],
            False,
            'namespace "team-d": a100 quota exceeded: requested 1, in use 1.5 of 2',
            id="whole-and-share",
        ),
    ],
)
def test_in_use_says_whether_the_pod_fits_next_to_what_runs(
    tmp_path: Path, in_use: list[str], allowed: bool, reason: str | None
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("namespaces:\n  team-d:\n    a100: 2\n")
    limits = {"gpuadm.io/a100": "1"}
    container = {"name": "main", "image": "x", "resources": {"limits": limits}}
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [container]}}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    capture = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "review",
            str(path),
            "--policy",
            POLICY,
            "--quotas",
            str(quotas),
            "-n",
            "team-d",
            "-o",
            "json",
            *in_use,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    result = json.loads(capture.stdout)
    assert result["allowed"] is allowed
    if reason:
        assert result["reason"].startswith(reason), result["reason"]


def test_in_use_of_a_class_the_policy_lacks_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = str(ROOT / "examples" / "pods" / "h100-job.yaml")
    assert main(["review", job, "--policy", POLICY, "--in-use", "h10=1"]) == 2
    assert "gpuadm: --in-use h10=1: no class 'h10' in the policy" in capsys.readouterr().err


def test_in_use_no_pod_could_hold_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    job = str(ROOT / "examples" / "pods" / "h100-job.yaml")
    assert main(["review", job, "--policy", POLICY, "--in-use", "h100=1.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuadm: --in-use h100=1.5: no pod can hold that: ")
    assert "backend nvidia gives whole GPUs only" in err
