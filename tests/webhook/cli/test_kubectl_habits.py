"""kubectl's habits: -o json|yaml|wide, -n for a tenant's namespace only, --context and
--kubeconfig as kubectl reads them, --version, and the `kubectl gpuadm` plugin."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.support import ROOT
from tests.webhook.cli.apiserver import fake_apiserver
from tests.webhook.cli.test_failures import _config_maps
from webhook.cli import main

POLICY = str(ROOT / "examples" / "policy.yaml")
JOB = str(ROOT / "examples" / "pods" / "h100-job.yaml")
PLUGIN = "import sys; from webhook.cli import plugin; sys.exit(plugin())"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert capsys.readouterr().out == f"gpuadm {project['version']}\n"


def test_the_kubectl_plugin_is_the_same_command_under_kubectl_s_name() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-gpuadm"] == "webhook.cli:plugin"
    result = subprocess.run(
        [sys.executable, "-c", PLUGIN, "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0
    assert result.stdout.startswith("kubectl gpuadm ")


@pytest.mark.parametrize("output", ["json", "yaml", "wide", "text"])
def test_review_speaks_every_output(output: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["review", JOB, "--policy", POLICY, "-o", output]) == 0
    out = capsys.readouterr().out
    if output in ("json", "yaml"):
        parsed = json.loads(out) if output == "json" else yaml.safe_load(out)
        assert parsed["demand"] == "h100=1"
    else:
        assert out.startswith("verdict: allowed (namespace team-c)")


def _quota(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    with fake_apiserver() as apiserver:
        apiserver.objects["/api/v1/namespaces/gpuadm-system/configmaps"] = _config_maps()
        # The current context reaches nothing; the one named `real` reaches the apiserver.
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {"name": "real", "cluster": {"server": apiserver.url}},
                        {"name": "gone", "cluster": {"server": "https://127.0.0.1:1"}},
                    ],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [
                        {"name": "real", "context": {"cluster": "real", "user": "u"}},
                        {"name": "gone", "context": {"cluster": "gone", "user": "u"}},
                    ],
                    "current-context": "gone",
                }
            )
        )
        return subprocess.run(
            [sys.executable, "-m", "webhook.cli", "quota", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin"},
        )


def test_context_picks_a_context_of_the_kubeconfig(tmp_path: Path) -> None:
    assert _quota(tmp_path).returncode == 2  # the current context reaches nothing
    result = _quota(tmp_path, "--context", "real")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("NAMESPACE")


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_quota_speaks_json_and_yaml(tmp_path: Path, output: str) -> None:
    result = _quota(tmp_path, "--context", "real", "-o", output)
    assert result.returncode == 0, result.stderr
    parsed = json.loads(result.stdout) if output == "json" else yaml.safe_load(result.stdout)
    assert {item["namespace"] for item in parsed["items"]} >= {"team-a", "team-b", "team-c"}


def test_quota_without_headers(tmp_path: Path) -> None:
    result = _quota(tmp_path, "--context", "real", "-o", "wide", "--no-headers")
    assert result.returncode == 0, result.stderr
    assert "NAMESPACE" not in result.stdout
    assert result.stdout.startswith("team-a")


def test_gpuadm_s_own_namespace_has_its_own_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tls"
    assert main(["certs", "generate", "--out", str(out), "--gpuadm-namespace", "gpu-adm"]) == 0
    assert main(["certs", "show", "--dir", str(out), "--gpuadm-namespace", "gpu-adm"]) == 0
    captured = capsys.readouterr()
    assert "gpuadm.gpu-adm.svc" in captured.out
    assert "warning" not in captured.err


def test_the_old_namespace_flag_still_works_and_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tls"
    assert main(["certs", "generate", "--out", str(out), "--namespace", "gpu-adm"]) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        "gpuadm: warning: --namespace is deprecated here: gpuadm's own namespace is "
        "--gpuadm-namespace (-n and --namespace name a tenant's namespace)\n"
    )
    assert main(["certs", "show", "--dir", str(out), "--gpuadm-namespace", "gpu-adm"]) == 0
    assert "gpuadm.gpu-adm.svc" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["certs", "show"], ["serve"], ["uninstall"]])
def test_dash_n_is_no_flag_of_commands_without_a_tenant(command: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command, "-n", "team-a"])
    assert exited.value.code == 2


def test_no_shipped_manifest_uses_the_old_spelling() -> None:
    for path in [
        *(ROOT / "deploy").rglob("*.yaml"),
        *(ROOT / "docs").glob("*.md"),
        ROOT / "README.md",
    ]:
        text = path.read_text()
        assert "- --namespace\n" not in text, path
        assert "serve --namespace" not in text, path


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_check_config_speaks_json_and_yaml(
    output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("namespaces:\n  team-a:\n    t4: 1.5Gi\n")
    assert main(["check-config", POLICY, str(quotas), "-o", output]) == 1
    out = capsys.readouterr().out
    result = json.loads(out) if output == "json" else yaml.safe_load(out)
    assert result["valid"] is False
    assert result["policies"] == [POLICY]
    (problem,) = result["problems"]
    assert problem.startswith(f"{quotas}:3: namespaces.team-a.t4: '1.5Gi' is a size")


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_certs_show_speaks_json_and_yaml(
    output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["certs", "generate", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["certs", "show", "--dir", str(tmp_path), "-o", output]) == 0
    out = capsys.readouterr().out
    result = json.loads(out) if output == "json" else yaml.safe_load(out)
    assert result["valid"] is True
    assert result["problems"] == []
    assert "gpuadm.gpuadm-system.svc" in result["serving"]["certificate"]
    assert result["ca"]["renewalDue"] is False
