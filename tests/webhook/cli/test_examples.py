"""Every example is what the docs say it is: checked through `gpuadm review` and
`gpuadm check-config`, as a user would run them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policies.classes.backends import BACKENDS
from tests.support import ROOT
from webhook.cli import main

BACKEND_EXAMPLES = ROOT / "examples" / "backends"
BACKEND_POLICY = BACKEND_EXAMPLES / "policy.yaml"

# What each backend's example pod is stored with: the resources its stack reads.
STORED = {
    "nvidia": {"nvidia.com/gpu": "1"},
    "hami": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50", "nvidia.com/gpumem": "40960"},
    "gpu-manager": {"tencent.com/vcuda-core": "25", "tencent.com/vcuda-memory": "16"},
    "gpushare": {"aliyun.com/gpu-mem": "8"},
    "mig": {"nvidia.com/mig-3g.40gb": "1"},
    "time-slicing": {"nvidia.com/gpu.shared": "1"},
    "volcano": {
        "volcano.sh/vgpu-number": "1",
        "volcano.sh/vgpu-cores": "50",
        # Half the 23028Mi an A10 reports, rounded down to Volcano's MiB.
        "volcano.sh/vgpu-memory": "11514",
    },
    "qgpu": {"tke.cloud.tencent.com/qgpu-core": "50", "tke.cloud.tencent.com/qgpu-memory": "8"},
    "cgpu": {"aliyun.com/gpu-mem": "8", "aliyun.com/gpu-core.percentage": "50"},
    "mgpu": {"vke.volcengine.com/mgpu-core": "50", "vke.volcengine.com/mgpu-memory": "12288"},
    "elastic-gpu": {"elasticgpu.com/gpu-core": "50", "elasticgpu.com/gpu-memory": "12288"},
    "extended": {"example.com/npu-core": "250", "example.com/npu-memory": "8"},
}


def test_every_backend_has_an_example() -> None:
    examples = {p.stem for p in BACKEND_EXAMPLES.glob("*.yaml")} - {"policy"}
    backends = {backend.backend_name() for backend in BACKENDS}
    assert backends <= examples
    # Others show a variant of one backend: `<backend>-<variant>.yaml`.
    for variant in examples - backends:
        assert any(variant.startswith(f"{name}-") for name in backends), variant


def test_the_backends_policy_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(BACKEND_POLICY)]) == 0
    assert "ok: 1 policy and 0 quota config(s) are valid" in capsys.readouterr().out


@pytest.mark.parametrize("backend", sorted(STORED))
def test_each_backend_s_example_is_admitted_with_its_stack_s_resources(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    example = BACKEND_EXAMPLES / f"{backend}.yaml"
    assert main(["review", str(example), "--policy", str(BACKEND_POLICY), "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    resources = result["pod"]["spec"]["containers"][0]["resources"]
    assert resources == {"limits": STORED[backend], "requests": STORED[backend]}


def test_the_dra_example_gets_a_claim_from_a_template(capsys: pytest.CaptureFixture[str]) -> None:
    example = BACKEND_EXAMPLES / "dra.yaml"
    assert main(["review", str(example), "--policy", str(BACKEND_POLICY), "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    (claim,) = result["pod"]["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"].startswith("gpuadm-h100-dra-1-")
    (template,) = result["claimTemplates"]
    assert template["metadata"]["name"] == claim["resourceClaimTemplateName"]


def test_the_dra_share_example_gets_a_claim_for_half_a_devices_memory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    example = BACKEND_EXAMPLES / "dra-shared.yaml"
    assert main(["review", str(example), "--policy", str(BACKEND_POLICY), "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["demand"] == "h100-dra-shared=0.5"
    (claim,) = result["pod"]["spec"]["resourceClaims"]
    assert claim["resourceClaimTemplateName"].startswith("gpuadm-h100-dra-shared-p50-")
    (template,) = result["claimTemplates"]
    devices = template["spec"]["spec"]["devices"]
    # Half of the 81559Mi NVIDIA's driver publishes, rounded down to a MiB: two fit.
    assert devices["requests"][0]["exactly"]["capacity"] == {"requests": {"memory": "40779Mi"}}
    (config,) = devices["config"]
    assert config["opaque"]["parameters"]["sharing"] == {
        "strategy": "TimeSlicing",
        "timeSlicingConfig": {"interval": "Default"},
    }


def test_the_kai_example_gets_kais_annotations_scheduler_and_queue(
    capsys: pytest.CaptureFixture[str],
) -> None:
    example = BACKEND_EXAMPLES / "kai.yaml"
    assert main(["review", str(example), "--policy", str(BACKEND_POLICY), "-o", "json"]) == 0
    stored = json.loads(capsys.readouterr().out)["pod"]
    assert stored["spec"]["containers"][0]["resources"] == {}
    annotations = stored["metadata"]["annotations"]
    assert annotations["gpu-fraction"] == "0.5"
    assert annotations["gpu-fraction-container-name"] == "main"
    assert stored["metadata"]["labels"]["kai.scheduler/queue"] == "research"
    assert stored["spec"]["schedulerName"] == "kai-scheduler"


@pytest.mark.parametrize(
    "example", sorted(p.name for p in (ROOT / "examples" / "pods").glob("*.yaml"))
)
def test_the_pod_examples_are_admitted(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    path: Path = ROOT / "examples" / "pods" / example
    policy, quotas = ROOT / "examples" / "policy.yaml", ROOT / "examples" / "quotas.yaml"
    assert main(["review", str(path), "--policy", str(policy), "--quotas", str(quotas)]) == 0
    assert "verdict: allowed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("strategy", "config"),
    [
        pytest.param("capacity", None, id="capacity"),
        pytest.param(
            "time-slicing",
            {
                "strategy": "TimeSlicing",
                "timeSlicingConfig": {"interval": "Short"},
            },
            id="time-slicing",
        ),
    ],
)
def test_review_shows_the_claim_and_the_charge_of_each_dra_sharing_strategy(
    strategy: str,
    config: dict[str, object] | None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    interval = "\n      interval: Short" if strategy == "time-slicing" else ""
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "classes:\n  h100:\n    backend: dra\n    sharing:\n"
        f"      strategy: {strategy}{interval}\n      capacity: {{memory: 80Gi, shares: 8}}\n"
    )
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("namespaces:\n  team-a: {h100: 1}\n")
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team-a}\nspec:\n"
        "  containers:\n  - name: main\n    image: x\n"
        "    resources: {limits: {gpuadm.io/h100-memory: 30Gi}}\n"
    )
    arguments = ["review", str(manifest), "--policy", str(policy), "--quotas", str(quotas)]
    assert main([*arguments, "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    # 30Gi is 37.5 hundredths, so 37: 30310.4Mi and 2.96 of 8 shares, each rounded down.
    assert result["demand"] == "h100=0.37"
    (template,) = result["claimTemplates"]
    assert template["metadata"]["name"].startswith("gpuadm-h100-p37-")
    devices = template["spec"]["spec"]["devices"]
    requests = devices["requests"][0]["exactly"]["capacity"]["requests"]
    assert requests == {"memory": "30310Mi", "shares": "2"}
    if config is None:
        assert "config" not in devices
    else:
        assert devices["config"][0]["opaque"]["parameters"]["sharing"] == config
    # The text form says the charge, and why it is less than was asked.
    assert main(arguments) == 0
    text = capsys.readouterr().out
    assert "demand: h100=0.37" in text
    assert (
        "30Gi of GPU memory of h100 rounded down to 0.37 GPU (a claim for memory 30310Mi of "
        "80Gi, shares 2 of 8), so that shares adding up to one GPU fit on one; quota is "
        "charged 0.37"
    ) in text


def test_review_shows_why_mps_cannot_share_a_dra_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "classes:\n  h100:\n    backend: dra\n"
        "    sharing: {strategy: mps, capacity: {memory: 80Gi}}\n"
    )
    assert main(["check-config", str(policy)]) == 1
    assert "mps cannot share a device between pods" in capsys.readouterr().out
