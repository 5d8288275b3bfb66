"""What the hardware reports of each model, and a class's memory and MIG profiles checked
against it: memory above the real figure, profiles a model does not offer or that hold less
than declared."""

from __future__ import annotations

import pytest

from policies import ConfigError, load_policy, plan, policy_warnings
from policies.classes.backends.device_plugins import MigClass
from policies.classes.catalogue import GPU_NAMES
from policies.classes.hardware import HARDWARE, MigProfile


def test_every_model_with_figures_is_a_name_of_the_catalogue() -> None:
    assert set(HARDWARE) <= set(GPU_NAMES)


def test_the_h200_is_as_measured_on_a_real_one() -> None:
    # nvidia-smi --query-gpu=name,memory.total and nvidia-smi mig -lgip, driver 580.159.04.
    h200 = HARDWARE["NVIDIA H200"]
    assert h200.memory_mib == 143771
    gib = {p.name: (p.memory_mib / 1024 if p.memory_mib else None, p.instances) for p in h200.mig}
    assert gib == {
        "1g.18gb": (16.00, 7),
        "1g.18gb+me": (16.00, 1),
        "1g.35gb": (32.50, 4),
        "2g.35gb": (32.50, 3),
        "3g.71gb": (69.75, 2),
        "4g.71gb": (69.75, 1),
        "7g.141gb": (140.00, 1),
    }


# The MIG-capable data-centre GPUs whose profiles the catalogue holds, each with the profile
# that takes the whole GPU.
MIG_CAPABLE = {
    "NVIDIA A30": "4g.24gb",
    "NVIDIA A100-SXM4-40GB": "7g.40gb",
    "NVIDIA A100-PCIE-40GB": "7g.40gb",
    "NVIDIA A100-SXM4-80GB": "7g.80gb",
    "NVIDIA A100 80GB PCIe": "7g.80gb",
    "NVIDIA H100 80GB HBM3": "7g.80gb",
    "NVIDIA H100 PCIe": "7g.80gb",
    "NVIDIA H100 NVL": "7g.94gb",
    "NVIDIA H200": "7g.141gb",
    "NVIDIA H200 NVL": "7g.141gb",
    "NVIDIA GH200 480GB": "7g.96gb",
    "NVIDIA H20": "7g.96gb",
    "NVIDIA GH200 144G HBM3e": "7g.144gb",
    "NVIDIA B200": "7g.180gb",
}


@pytest.mark.parametrize(("name", "whole"), sorted(MIG_CAPABLE.items()))
def test_each_mig_capable_gpu_lists_its_profiles(name: str, whole: str) -> None:
    profile = HARDWARE[name].profile(whole)
    assert profile is not None
    assert profile.instances == 1
    # The smallest slice fits 4 (A30) or 7 times.
    assert max(p.instances for p in HARDWARE[name].mig) == (4 if name == "NVIDIA A30" else 7)


def test_a_gh200s_profiles_are_as_its_driver_lists_them() -> None:
    gh200 = HARDWARE["NVIDIA GH200 480GB"]
    assert gh200.memory_mib == 97871
    gib = {p.name: (p.memory_mib / 1024 if p.memory_mib else None, p.instances) for p in gh200.mig}
    assert gib == {
        "1g.12gb": (11.00, 7),
        "1g.12gb+me": (11.00, 1),
        "1g.24gb": (23.00, 4),
        "2g.24gb": (23.00, 3),
        "3g.48gb": (46.50, 2),
        "4g.48gb": (46.50, 1),
        "7g.96gb": (93.00, 1),
    }


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_each_models_profiles_fit_its_memory(name: str) -> None:
    hardware = HARDWARE[name]
    profiles: tuple[MigProfile, ...] = hardware.mig
    assert len({p.name for p in profiles}) == len(profiles)
    for profile in profiles:
        assert 1 <= profile.instances <= 7
        if profile.memory_mib is not None and hardware.memory_mib is not None:
            assert profile.memory_mib * profile.instances <= hardware.memory_mib


def memory_warnings(classes: str) -> list[str]:
    policy = load_policy(f"classes:\n{classes}")
    said = ("as NVML reports it", "MIG profile", "offers no MIG profile")
    return [w for w in policy_warnings(policy) if any(s in w for s in said)]


@pytest.mark.parametrize(
    ("classes", "expected"),
    [
        pytest.param(
            "  h200: {backend: hami, memory: 141Gi, models: [NVIDIA H200]}\n",
            [
                "class h200: memory 141Gi is more than NVIDIA H200 has (143771Mi, as NVML "
                "reports it and the stacks count it): shares are sized from it, so two halves "
                "(72192Mi each) never share one such GPU; write `memory: 143771Mi`"
            ],
            id="the-marketing-figure",
        ),
        pytest.param(
            "  h200: {backend: hami, memory: 143771Mi, models: [NVIDIA H200]}\n", [], id="real"
        ),
        pytest.param(
            "  gh200: {backend: hami, memory: 96Gi, models: [NVIDIA GH200 480GB]}\n",
            ["class gh200: memory 96Gi is more than NVIDIA GH200 480GB has (97871Mi"],
            id="a-gh200-sold-as-96gb",
        ),
        pytest.param(
            "  h200: {backend: hami, memory: 143772Mi, models: [NVIDIA H200]}\n",
            ["class h200: memory 143772Mi is more than NVIDIA H200 has (143771Mi"],
            id="one-mib-over",
        ),
        pytest.param(
            "  a100: {backend: hami, memory: 80Gi, "
            "models: [NVIDIA A100-SXM4-80GB, NVIDIA A100-SXM4-40GB]}\n",
            ["class a100: memory 80Gi is more than NVIDIA A100-SXM4-40GB has (40960Mi"],
            id="the-smallest-model-counts",
        ),
        pytest.param(
            "  h100: {backend: hami, memory: 80Gi, models: [NVIDIA H100 PCIe]}\n",
            [],
            id="no-figure-no-word",
        ),
        pytest.param(
            "  h200: {backend: hami, memory: 141Gi, shareable: false, models: [NVIDIA H200]}\n",
            [],
            id="whole-gpus-only",
        ),
        pytest.param(
            "  h200:\n    backend: mig\n    memory: 141Gi\n    models: [NVIDIA H200]\n"
            "    profiles: {1g.18gb: 18Gi, 1g.35gb: 32Gi, 1g.10gb: 10Gi}\n",
            [
                "class h200: MIG profile 1g.18gb holds 16Gi on NVIDIA H200 (as nvidia-smi mig "
                "-lgip reports it), less than the 18Gi declared: an ask between the two is "
                "given a slice too small for it; declare what the slice holds",
                "class h200: NVIDIA H200 offers no MIG profile 1g.10gb (its profiles: 1g.18gb, "
                "1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb): no node of that "
                "model has such a slice",
            ],
            id="mig-profiles",
        ),
        pytest.param(
            "  h200:\n    backend: mig\n    memory: 141Gi\n    models: [NVIDIA H200]\n"
            "    profiles: {1g.18gb: 16Gi}\n",
            [],
            id="a-profile-as-it-holds",
        ),
        pytest.param(
            "  nvl:\n    backend: mig\n    memory: 141Gi\n    models: [NVIDIA H200 NVL]\n"
            "    profiles: {1g.18gb: 18Gi}\n",
            [],
            id="a-profile-of-no-seen-memory",
        ),
    ],
)
def test_memory_above_what_the_hardware_reports_is_warned_of(
    classes: str, expected: list[str]
) -> None:
    warnings = memory_warnings(classes)
    assert len(warnings) == len(expected)
    for warning, start in zip(warnings, expected, strict=True):
        assert warning.startswith(start)


# --- memory and profiles taken from the hardware ---------------------------------------------


@pytest.mark.parametrize(
    ("models", "memory", "source"),
    [
        pytest.param("[NVIDIA H200]", 143771, "NVIDIA H200", id="h200"),
        pytest.param(
            "[NVIDIA A100-SXM4-80GB, NVIDIA A100-SXM4-40GB]",
            40960,
            "NVIDIA A100-SXM4-40GB",
            id="the-least-of-its-models",
        ),
    ],
)
def test_memory_left_out_is_what_the_models_hardware_reports(
    models: str, memory: int, source: str
) -> None:
    policy = load_policy(f"classes:\n  a: {{backend: hami, models: {models}}}\n")
    gpu_class = policy.classes["a"]
    assert gpu_class.memory == memory * 2**20
    assert gpu_class.memory_source == source


def test_memory_given_is_the_policys_own() -> None:
    policy = load_policy("classes:\n  a: {backend: hami, memory: 80Gi, models: [NVIDIA H200]}\n")
    assert policy.classes["a"].memory == 80 * 2**30
    assert policy.classes["a"].memory_source is None


@pytest.mark.parametrize(
    "models", ["[NVIDIA H100 PCIe]", "[NVIDIA H200, NVIDIA H100 PCIe]", "[Acme Z9000]"]
)
def test_memory_is_needed_where_a_models_memory_is_not_known(models: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_policy(f"classes:\n  a: {{backend: hami, models: {models}}}\n")
    (said,) = error.value.problems
    assert "backend hami needs `memory`" in said
    assert "it may be left out only when gpuadm knows the memory of each" in said


def test_a_class_that_needs_no_memory_is_given_none() -> None:
    policy = load_policy("classes:\n  a: {backend: nvidia, models: [NVIDIA H200]}\n")
    assert policy.classes["a"].memory is None


def test_mig_profiles_by_name_hold_what_the_slices_hold() -> None:
    policy = load_policy(
        "classes:\n  h200:\n    backend: mig\n    models: [NVIDIA H200]\n"
        "    profiles: [1g.18gb, 1g.35gb, 3g.71gb]\n"
    )
    mig = policy.classes["h200"]
    assert isinstance(mig, MigClass)
    profiles = mig.profiles
    assert {name: memory / 2**30 for name, memory in profiles.items()} == {
        "1g.18gb": 16,
        "1g.35gb": 32.5,
        "3g.71gb": 69.75,
    }
    # 17Gi does not fit the slice called 1g.18gb, which holds 16Gi: the next one holds it.
    body = {
        "containers": [{"name": "m", "resources": {"limits": {"gpuadm.io/h200-memory": "17Gi"}}}]
    }
    (change,) = [
        p for p in plan({"metadata": {}, "spec": body}, policy).patch if "resources" in p["path"]
    ]
    assert change["value"]["limits"] == {"nvidia.com/mig-1g.35gb": "1"}


@pytest.mark.parametrize(
    ("classes", "problem"),
    [
        pytest.param(
            "    backend: mig\n    memory: 80Gi\n    profiles: [1g.10gb]\n",
            "profiles given by name take their memory from the class's `models`",
            id="no-models",
        ),
        pytest.param(
            "    backend: mig\n    models: [NVIDIA H200 NVL]\n    profiles: [1g.18gb]\n",
            "gpuadm does not know what profile 1g.18gb holds on NVIDIA H200 NVL",
            id="memory-not-seen",
        ),
        pytest.param(
            "    backend: mig\n    models: [NVIDIA H200]\n    profiles: [1g.10gb]\n",
            "gpuadm does not know what profile 1g.10gb holds on NVIDIA H200",
            id="not-offered",
        ),
    ],
)
def test_mig_profiles_by_name_need_what_the_hardware_is_known_to_hold(
    classes: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as error:
        load_policy(f"classes:\n  m:\n{classes}")
    assert problem in "; ".join(error.value.problems)
