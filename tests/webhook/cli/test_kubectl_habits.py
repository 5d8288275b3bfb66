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
from packaging.version import Version

from tests.support import ROOT
from tests.webhook.cli.apiserver import fake_apiserver
from tests.webhook.cli.test_failures import _config_maps
from webhook.cli import main

POLICY = str(ROOT / "examples" / "policy.yaml")
JOB = str(ROOT / "examples" / "pods" / "h100-job.yaml")
PLUGIN = "import sys; from webhook.cli import plugin; sys.exit(plugin())"

# Discovery of gpuadm's API, as the apiserver serves it once the GPUQuota CRD is installed.
QUOTA_API = "/apis/gpuadm.io/v1alpha1"
QUOTA_API_RESOURCES = {"kind": "APIResourceList", "groupVersion": "gpuadm.io/v1alpha1"}


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # The installed package's version, as the build wrote it: `0.3.0-rc.1` becomes `0.3.0rc1`.
    assert capsys.readouterr().out == f"gpuadm {Version(project['version'])}\n"


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


def test_an_empty_pod_namespace_means_gpuadm_s_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "")
    out = tmp_path / "tls"
    assert main(["certs", "generate", "--out", str(out)]) == 0
    assert main(["certs", "show", "--dir", str(out)]) == 0
    assert "gpuadm.gpuadm-system.svc" in capsys.readouterr().out


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


@pytest.mark.parametrize(
    "command",
    [
        *([c, "--gpuadm-namespace"] for c in ["serve", "uninstall", "quota", "check-config"]),
        # The old spelling, on the commands that have no tenant.
        *([c, "--namespace"] for c in ["serve", "uninstall"]),
    ],
)
def test_gpuadm_s_own_namespace_must_be_a_namespace_s_name(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command, "Bad_NS"])
    assert exited.value.code == 2
    assert "'Bad_NS' is not a namespace's name" in capsys.readouterr().err


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


@pytest.mark.parametrize(
    ("flag", "env", "in_a_pod", "reached"),
    [
        pytest.param("flag", "env", True, "https://flag.example:6443", id="flag-first"),
        pytest.param(None, "env", True, "https://env.example:6443", id="env-before-pod"),
        pytest.param(None, None, True, "Service token file", id="pod-account"),
        pytest.param(None, None, False, "https://home.example:6443", id="home-last"),
    ],
)
def test_the_cluster_is_found_as_kubectl_finds_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flag: str | None,
    env: str | None,
    in_a_pod: bool,
    reached: str,
) -> None:
    # A CI pod that runs gpuadm against another cluster must reach that one: $KUBECONFIG
    # comes before the pod's own service account.
    from tests.webhook.cli.apiserver import write_kubeconfig
    from webhook.kube.client import connect
    from webhook.kube.errors import KubeError

    (tmp_path / ".kube").mkdir()
    write_kubeconfig(tmp_path / ".kube" / "config", "https://home.example:6443")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    if env:
        monkeypatch.setenv(
            "KUBECONFIG", str(write_kubeconfig(tmp_path / "env", f"https://{env}.example:6443"))
        )
    if in_a_pod:
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    given = str(write_kubeconfig(tmp_path / "flag", "https://flag.example:6443")) if flag else None
    try:
        found = connect(given).endpoint().host
    except KubeError as error:
        found = str(error)
    assert reached in found


@pytest.mark.parametrize(
    ("args", "error"),
    [
        pytest.param(
            ["-n", "team-b"],
            "the namespace from the provided object 'team-a' does not match the namespace "
            "'team-b': give -n team-a, or no -n",
            id="another-namespace",
        ),
        pytest.param(["-n", "Bad_NS"], "'Bad_NS' is not a namespace's name", id="not-a-name"),
        pytest.param(["-n", "x" * 64], "is not a namespace's name", id="too-long"),
    ],
)
def test_review_refuses_a_namespace_the_manifest_contradicts_or_no_namespace_has(
    tmp_path: Path, args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team-a}\n"
        "spec: {containers: [{name: c, image: i, resources: {limits: {gpuadm.io/a100: 1}}}]}\n"
    )
    code: object
    try:
        code = main(["review", str(manifest), "--policy", POLICY, *args])
    except SystemExit as exited:  # refused by the parser, before the command runs
        code = exited.code
    assert code == 2
    assert error in capsys.readouterr().err


def test_review_judges_in_the_manifest_s_own_namespace_given_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["review", JOB, "--policy", POLICY, "-n", "team-c"])
    assert "verdict:" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["99999", "0", "-1", "https"])
def test_serve_refuses_a_port_no_socket_has(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--port", value, "--policy", POLICY])
    assert exited.value.code == 2
    assert f"--port: {value!r} is not a port: give 1 to 65535" in capsys.readouterr().err


def _config_map(name: str, key: str, text: str) -> str:
    body = "\n".join("    " + line for line in text.splitlines())
    return (
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  {key}: |\n{body}\n"
    )


def test_review_takes_the_configmap_manifests_an_admin_hands_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "gpuadm-policy.yaml"
    policy.write_text(_config_map("gpuadm-policy", "policy.yaml", Path(POLICY).read_text()))
    quotas = tmp_path / "gpuadm-quotas.yaml"
    quotas.write_text(
        _config_map("gpuadm-quotas", "quotas.yaml", "namespaces:\n  team-c:\n    h100: 0\n")
    )
    code = main(["review", JOB, "--policy", str(policy), "--quotas", str(quotas)])
    assert code == 1  # a worker of one H100, against a limit of none
    assert 'namespace "team-c": h100 quota exceeded: requested 1, in use 0 of 0' in (
        capsys.readouterr().out
    )


def test_review_names_the_line_of_a_configmap_s_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quotas = tmp_path / "gpuadm-quotas.yaml"
    quotas.write_text(
        _config_map("gpuadm-quotas", "quotas.yaml", "namespaces:\n  team-c:\n    h100: lots\n")
    )
    assert main(["review", JOB, "--policy", POLICY, "--quotas", str(quotas)]) == 2
    assert f"{quotas}:9: " in capsys.readouterr().err


def test_review_refuses_a_configmap_gpuadm_never_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "cm.yaml"
    policy.write_text(_config_map("my-policy", "policy.yaml", Path(POLICY).read_text()))
    assert main(["review", JOB, "--policy", str(policy)]) == 2
    assert "gpuadm reads only the ConfigMaps gpuadm-policy and gpuadm-quotas" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("in_use", "reserved", "code", "said"),
    [
        pytest.param("2", "1", 0, "verdict: allowed", id="room-for-one-more"),
        pytest.param("2.5", "1", 1, "a100 quota exceeded: requested 1, in use 3.5 of 4", id="full"),
    ],
)
def test_review_from_the_cluster_counts_what_the_namespace_holds_and_reserves(
    tmp_path: Path,
    in_use: str,
    reserved: str,
    code: int,
    said: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.webhook.cli.apiserver import write_kubeconfig

    with fake_apiserver() as apiserver:
        apiserver.objects["/api/v1/namespaces/gpuadm-system/configmaps"] = _config_maps()
        apiserver.objects[QUOTA_API] = QUOTA_API_RESOURCES
        apiserver.objects["/apis/gpuadm.io/v1alpha1/namespaces/team-a/gpuquotas/a100"] = {
            "kind": "GPUQuota",
            "metadata": {"name": "a100", "namespace": "team-a"},
            "status": {"class": "a100", "limit": "4", "inUse": in_use, "reserved": reserved},
        }
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
        pod = tmp_path / "pod.yaml"
        pod.write_text(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team-a}\nspec:\n"
            "  containers: [{name: c, image: i, resources: {limits: {gpuadm.io/a100: 1}}}]\n"
        )
        args = ["review", str(pod), "--from-cluster", "--kubeconfig", str(kubeconfig)]
        assert main(args) == code
    assert said in capsys.readouterr().out


def test_review_from_the_cluster_refused_the_config_names_the_tenants_grant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.webhook.cli.apiserver import write_kubeconfig

    with fake_apiserver() as apiserver:
        apiserver.objects["/api/v1/namespaces/gpuadm-system/configmaps"] = _config_maps()
        apiserver.forbidden.add("/api/v1/namespaces/gpuadm-system/configmaps/gpuadm-policy")
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
        assert main(["review", JOB, "--from-cluster", "--kubeconfig", str(kubeconfig)]) == 2
    assert capsys.readouterr().err.endswith(
        "ask your admin to turn on the chart's tenantAccess.readConfig for you (docs/tenants.md)\n"
    )


def test_review_from_a_cluster_without_the_gpuquota_crd_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the CRD every GPUQuota reads as absent, which is no reading of what a namespace
    holds: the review says so rather than judge as if it held nothing."""
    from tests.webhook.cli.apiserver import write_kubeconfig

    with fake_apiserver() as apiserver:
        apiserver.objects["/api/v1/namespaces/gpuadm-system/configmaps"] = _config_maps()
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
        assert main(["review", JOB, "--from-cluster", "--kubeconfig", str(kubeconfig)]) == 2
    assert capsys.readouterr().err == (
        "gpuadm: the cluster serves no GPUQuota API (gpuadm.io/v1alpha1): what namespaces hold "
        "cannot be read; install gpuadm's CRD (docs/operations.md)\n"
    )


@pytest.mark.parametrize(
    ("args", "error"),
    [
        pytest.param([], "give either --policy (and --quotas) files or --from-cluster", id="none"),
        pytest.param(["--policy", POLICY, "--from-cluster"], "give either --policy", id="both"),
        pytest.param(
            ["--from-cluster", "--quotas", POLICY], "--from-cluster reads the quotas", id="quotas"
        ),
    ],
)
def test_review_takes_files_or_the_cluster(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["review", JOB, *args]) == 2
    assert error in capsys.readouterr().err


def test_review_from_the_cluster_says_what_it_could_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.webhook.cli.apiserver import write_kubeconfig

    with fake_apiserver() as apiserver:
        apiserver.objects["/api/v1/namespaces/gpuadm-system/configmaps"] = _config_maps()
        apiserver.token = "not-the-one-sent"  # every call is refused as unauthorized
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)
        assert main(["review", JOB, "--from-cluster", "--kubeconfig", str(kubeconfig)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuadm: ")
    assert "Traceback" not in err
