"""The command line: review and check-config, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.builders import container
from tests.support import ROOT
from webhook.cli import main

POLICY = ROOT / "examples" / "policy.yaml"
QUOTAS = ROOT / "examples" / "quotas.yaml"


def write_pod(tmp_path: Path, limits: dict[str, str], **metadata: str) -> Path:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", **metadata},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]},
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    return path


@pytest.mark.parametrize(
    ("limits", "resources"),
    [
        pytest.param(
            {"gpuadm.io/a100": "0.5"},
            {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50", "nvidia.com/gpumem": "40960"},
            id="hami-share",
        ),
        pytest.param(
            {"gpuadm.io/t4-memory": "4Gi"},
            {"tencent.com/vcuda-core": "25", "tencent.com/vcuda-memory": "16"},
            id="gpu-manager-memory",
        ),
        pytest.param({"gpuadm.io/h100": "2"}, {"nvidia.com/gpu": "2"}, id="nvidia-whole"),
        pytest.param(
            {"gpuadm.io/a100-mig": "0.5"}, {"nvidia.com/mig-3g.40gb": "1"}, id="mig-share"
        ),
        pytest.param(
            {"nvidia.com/gpu": "1"}, {"tencent.com/vcuda-core": "100"}, id="untyped-default-class"
        ),
    ],
)
def test_review_prints_the_stored_pod_as_json(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    limits: dict[str, str],
    resources: dict[str, str],
) -> None:
    path = write_pod(tmp_path, limits)
    code = main(
        ["review", str(path), "--policy", str(POLICY), "--quotas", str(QUOTAS), "-o", "json"]
    )
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["allowed"] is True
    stored = result["pod"]["spec"]["containers"][0]["resources"]
    assert stored["limits"] == resources
    assert stored["requests"] == resources


def test_review_text_shows_verdict_demand_and_patch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_pod(tmp_path, {"gpuadm.io/t4": "0.333"}, namespace="team-b")
    assert main(["review", str(path), "--policy", str(POLICY)]) == 0
    out = capsys.readouterr().out
    assert "verdict: allowed (namespace team-b)" in out
    assert "demand: t4=0.33" in out
    assert 'warning: container "main": a share of 0.333 of t4 rounded down' in out
    assert "path: /spec/containers/0/resources" in out


def test_review_of_an_invalid_pod_exits_1_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_pod(tmp_path, {"gpuadm.io/h100": "0.5"})
    assert main(["review", str(path), "--policy", str(POLICY)]) == 1
    out = capsys.readouterr().out
    assert "verdict: denied" in out
    assert "backend nvidia gives whole GPUs only" in out


@pytest.mark.parametrize(
    ("manifest", "error"),
    [
        pytest.param("kind: Service\n", "is not a Pod manifest", id="not-a-pod"),
        pytest.param("kind: Deployment\n", "Deployment/ has no pod template", id="no-template"),
        pytest.param(
            "kind: Pod\nmetadata: [a, b]\nspec: {containers: []}\n",
            "metadata is not a mapping",
            id="odd-metadata",
        ),
    ],
)
def test_review_of_what_is_no_pod_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest: str, error: str
) -> None:
    path = tmp_path / "manifest.yaml"
    path.write_text(manifest)
    assert main(["review", str(path), "--policy", str(POLICY)]) == 2
    assert error in capsys.readouterr().err


MANIFEST = """kind: Pod
metadata: {name: p}
spec:
  containers:
  - name: main
    image: x
    resources: {limits: {gpuadm.io/h100: 1}, other: VALUE}
"""


@pytest.mark.parametrize(
    ("value", "sent"),
    [
        pytest.param("2026-01-01", "2026-01-01", id="date"),
        pytest.param("2026-01-01T10:00:00Z", "2026-01-01T10:00:00Z", id="timestamp"),
        pytest.param("12:30:00", "12:30:00", id="base-60-integer"),
        pytest.param("1:30.5", "1:30.5", id="base-60-float"),
        pytest.param("{1: a, 2.5: b}", {"1": "a", "2.5": "b"}, id="keys-that-are-not-text"),
        pytest.param("0x10", 16, id="hexadecimal"),
    ],
)
def test_review_reads_yaml_as_the_json_kubectl_would_send(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, sent: object
) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(MANIFEST.replace("VALUE", value))
    assert main(["review", str(path), "--policy", str(POLICY), "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["pod"]["spec"]["containers"][0]["resources"]["other"] == sent


def test_review_of_a_quantity_written_as_a_date_names_the_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(MANIFEST.replace("gpuadm.io/h100: 1", "gpuadm.io/h100: 2026-01-01"))
    assert main(["review", str(path), "--policy", str(POLICY)]) == 1
    assert "'2026-01-01' is not a quantity" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("value", "error"),
    [
        pytest.param("!!binary aGVsbG8=", "Object of type bytes", id="binary"),
        pytest.param("!!set {a}", "Object of type set", id="set"),
        pytest.param(".nan", "Out of range float values", id="not-a-number"),
        pytest.param("-.inf", "Out of range float values", id="infinity"),
    ],
)
def test_review_of_a_value_json_cannot_carry_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, error: str
) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(MANIFEST.replace("VALUE", value))
    assert main(["review", str(path), "--policy", str(POLICY)]) == 2
    assert f"{path} holds a value JSON cannot carry: {error}" in capsys.readouterr().err


def test_review_with_a_bad_policy_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text("classes:\n  a:\n    backend: hami\n    memory: lots\n")
    assert main(["review", str(write_pod(tmp_path, {})), "--policy", str(bad)]) == 2
    assert f"{bad}:4: classes.a.memory: 'lots' is not a quantity" in capsys.readouterr().err


def test_check_config_accepts_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(POLICY), str(QUOTAS)]) == 0
    assert "ok: 1 policy and 1 quota config(s) are valid" in capsys.readouterr().out


def test_check_config_reads_configmaps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpuadm-quotas"},
        "data": {"quotas.yaml": "namespaces:\n  team-a:\n    a100: -2\n"},
    }
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump(configmap))
    assert main(["check-config", str(path)]) == 1
    out = capsys.readouterr().out
    # Lines count in the manifest, not in the embedded block.
    assert f"{path}:5: namespaces.team-a.a100: -2 is negative" in out


def test_check_config_reports_quota_classes_missing_from_the_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("namespaces:\n  team-a:\n    b200: 1\n")
    assert main(["check-config", str(POLICY), str(quotas)]) == 1
    assert (
        f"{quotas}:3: namespaces.team-a.b200: no class 'b200' in the policy ({POLICY})"
        in capsys.readouterr().out
    )


def test_check_config_of_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(tmp_path / "nope.yaml")]) == 2
    assert f"gpuadm: cannot read {tmp_path / 'nope.yaml'}: No such file" in capsys.readouterr().err


def test_review_judges_the_pod_against_the_namespace_quota(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_pod(tmp_path, {"gpuadm.io/a100": "5"}, namespace="team-a")
    assert main(["review", str(path), "--policy", str(POLICY), "--quotas", str(QUOTAS)]) == 1
    out = capsys.readouterr().out
    assert 'namespace "team-a": a100 quota exceeded: requested 5, in use 0 of 4' in out


def test_serve_without_policy_or_cluster_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["serve", "--log-format", "text"]) == 2
    error = capsys.readouterr().err
    assert "cannot reach a cluster" in error
    assert "give --policy FILE to run standalone" in error


def test_certs_generate_writes_a_ca_and_a_serving_pair(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tls"
    assert main(["certs", "generate", "--out", str(out), "--ip", "10.0.0.9"]) == 0
    assert {p.name for p in out.iterdir()} == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert oct((out / "ca.key").stat().st_mode)[-3:] == "600"
    assert main(["certs", "show", "--dir", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "gpuadm.gpuadm-system.svc" in shown
    assert "10.0.0.9" in shown


def test_check_config_warns_of_a_hami_class_without_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("classes:\n  any:\n    backend: hami\n    memory: 80Gi\n")
    assert main(["check-config", str(policy)]) == 0
    out = capsys.readouterr().out
    assert f"warning: {policy}:2: class any (hami) lists neither `models` nor `gpuTypes`" in out
    assert "ok: 1 policy and 0 quota config(s) are valid" in out


def test_check_config_names_a_known_gpu_a_class_cannot_keep_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `NVIDIA L4` is inside `NVIDIA L40`, which is inside `NVIDIA L40S`: no nouse-gputype
    # entry keeps an L40 from this class without keeping its L40S off too.
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "classes:\n  ada:\n    backend: hami\n    memory: 24Gi\n"
        "    models: [NVIDIA L4, NVIDIA L40S]\n"
    )
    assert main(["check-config", str(policy)]) == 0
    out = capsys.readouterr().out
    assert f"warning: {policy}:2: class ada (hami): its pods may also land on GPU models" in out
    assert "'NVIDIA L40' (use-gputype entry 'NVIDIA L4' matches it" in out
    assert "ok: 1 policy and 0 quota config(s) are valid" in out


def test_review_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    # Far more output than a pipe buffers, so the writer meets the closed pipe.
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "wide"},
        "spec": {"containers": [container(f"c{i}", {"gpuadm.io/h100": "1"}) for i in range(400)]},
    }
    pod = tmp_path / "wide.yaml"
    pod.write_text(yaml.safe_dump(body))
    result = subprocess.run(
        f"{sys.executable} -m webhook.cli review {pod} --policy {POLICY} | head -c 1",
        shell=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "Traceback" not in result.stderr
    assert result.stdout == "v"


def test_review_shows_the_claim_rewrite_and_the_template_of_a_dra_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("classes:\n  h100: {backend: dra, models: [NVIDIA H100 80GB HBM3]}\n")
    path = write_pod(tmp_path, {"gpuadm.io/h100": "2"}, namespace="team-b")
    assert main(["review", str(path), "--policy", str(policy), "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    (template,) = result["claimTemplates"]
    name = template["metadata"]["name"]
    assert result["pod"]["spec"]["resourceClaims"] == [
        {"name": "gpuadm-c0", "resourceClaimTemplateName": name}
    ]
    assert result["pod"]["spec"]["containers"][0]["resources"] == {
        "claims": [{"name": "gpuadm-c0"}]
    }
    assert template["metadata"]["namespace"] == "team-b"
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 2
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert main(["review", str(path), "--policy", str(policy)]) == 0
    out = capsys.readouterr().out
    assert "ResourceClaimTemplate gpuadm makes in the namespace, if it is missing:" in out
    assert f"name: {name}" in out


def test_review_says_when_a_pod_would_borrow_from_its_cohort(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(
        "namespaces:\n"
        "  team-a: {cohort: research, h100: 1, borrow: {h100: 2}}\n"
        "  team-b: {cohort: research, h100: 2}\n"
    )
    pod = (
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: team-a}}\n"
        "spec: {{containers: [{{name: m, image: i, resources: {{limits: "
        '{{gpuadm.io/h100: "1"}}}}}}]}}\n'
    )
    path = tmp_path / "pods.yaml"
    path.write_text(pod.format(name="p1") + "---\n" + pod.format(name="p2"))
    assert main(["review", str(path), "--policy", str(POLICY), "--quotas", str(quotas)]) == 0
    out = capsys.readouterr()
    said = out.out + out.err
    assert said.count("borrows 1 h100 from cohort research") == 1
    assert "(2 in use, nominal quota 1)" in said
