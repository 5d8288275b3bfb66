"""The declarative backend and its presets: every request form, every denial, and properties."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import ConfigError, Denial, Policy, load_policy, plan
from policies.classes.asks import Ask, MemoryShare, Share, Whole
from policies.classes.backends.extended import ExtendedBase
from tests.apiserver_rules import violations
from tests.builders import container, pod
from tests.policies.test_rewrite import apply, limits_of

# One class per preset, and stacks declared by hand: one with a count, compute in thousandths
# and memory in steps of 2Gi; one with memory only and one GPU at most; one with compute
# only; one that gives shares only.
POLICY_YAML = """
classes:
  t4q:
    backend: qgpu
    memory: 16G
  v100c:
    backend: cgpu
    memory: 16Gi
  a10m:
    backend: mgpu
    memory: 24Gi
  l4e:
    backend: elastic-gpu
    memory: 24Gi
  npu:
    backend: extended
    memory: 32Gi
    resources:
      count: example.com/npu
      compute: example.com/npu-core
      memory: example.com/npu-memory
    computePerGpu: 1000
    computeStep: 10
    memoryUnit: 1Gi
    memoryStep: 2
    whole: count
    share: [compute, memory]
    schedulerName: npu-scheduler
    annotations: {example.com/isolation: strict}
  vram:
    backend: extended
    memory: 16Gi
    resources: {memory: example.com/vram}
    memoryUnit: 1Gi
    maxGpus: 1
  cores:
    backend: extended
    resources: {compute: example.com/cores}
  slices:
    backend: extended
    memory: 16Gi
    resources: {compute: example.com/slice-core, memory: example.com/slice-memory}
    memoryUnit: 1Mi
    whole: []
  t4q-whole:
    backend: qgpu
    memory: 16G
    shareable: false
"""

QCORE = "tke.cloud.tencent.com/qgpu-core"
QMEM = "tke.cloud.tencent.com/qgpu-memory"
CCORE = "aliyun.com/gpu-core.percentage"
CMEM = "aliyun.com/gpu-mem"
MCORE = "vke.volcengine.com/mgpu-core"
MMEM = "vke.volcengine.com/mgpu-memory"
ECORE = "elasticgpu.com/gpu-core"
EMEM = "elasticgpu.com/gpu-memory"


@pytest.fixture(scope="module")
def extended_policy() -> Policy:
    """Return the policy of this module: presets and hand-declared stacks."""
    return load_policy(POLICY_YAML)


def case(
    limits: dict[str, str],
    expected: dict[str, str],
    charge: Fraction | int,
    *,
    rounded: bool = False,
    annotations: dict[str, str] | None = None,
    id: str,
) -> Any:
    """One row of the table: what a container asks, what it gets, what it is charged."""
    return pytest.param(limits, annotations or {}, expected, Fraction(charge), rounded, id=id)


FORMS = [
    # Tencent qGPU: 16G of memory is 16 units of 1G; cores in steps of 5.
    case({"gpuadm.io/t4q": "2"}, {QCORE: "200"}, 2, id="qgpu-whole-is-100-cores-each"),
    case({"gpuadm.io/t4q": "0.5"}, {QCORE: "50", QMEM: "8"}, Fraction(1, 2), id="qgpu-share"),
    case(
        {"gpuadm.io/t4q": "0.33"},
        {QCORE: "30", QMEM: "5"},
        Fraction(5, 16),
        rounded=True,
        id="qgpu-share-rounds-cores-down-to-5-and-memory-down-to-1G",
    ),
    case(
        {"gpuadm.io/t4q-memory": "4G"}, {QCORE: "25", QMEM: "4"}, Fraction(1, 4), id="qgpu-memory"
    ),
    case(
        {"gpuadm.io/t4q": "0.999"},
        {QCORE: "95", QMEM: "15"},
        Fraction(95, 100),
        rounded=True,
        id="qgpu-share-of-0.999-rounds-down-to-95-cores",
    ),
    case(
        {"gpuadm.io/t4q-memory": "16G"},
        {QCORE: "100"},
        1,
        id="qgpu-all-of-the-memory-is-a-whole-gpu",
    ),
    case(
        {QCORE: "30", QMEM: "4"},
        {QCORE: "30", QMEM: "4"},
        Fraction(3, 10),
        annotations={"gpuadm.io/class": "t4q"},
        id="qgpu-raw-resources-charged-by-the-larger-dimension",
    ),
    case(
        {"nvidia.com/gpu": "2"},
        {QCORE: "200"},
        2,
        annotations={"gpuadm.io/class": "t4q"},
        id="qgpu-untyped-gpu-count",
    ),
    # Alibaba cGPU: memory in GiB, compute in percent in steps of 5; a whole GPU is both.
    case({"gpuadm.io/v100c": "1"}, {CMEM: "16", CCORE: "100"}, 1, id="cgpu-whole-is-all-memory"),
    case({"gpuadm.io/v100c": "0.5"}, {CMEM: "8", CCORE: "50"}, Fraction(1, 2), id="cgpu-share"),
    case(
        {"gpuadm.io/v100c-memory": "1500Mi"},
        {CMEM: "1", CCORE: "5"},
        Fraction(1, 16),
        rounded=True,
        id="cgpu-memory-rounds-down-to-GiB",
    ),
    case(
        {CMEM: "4", CCORE: "20"},
        {CMEM: "4", CCORE: "20"},
        Fraction(1, 4),
        annotations={"gpuadm.io/class": "v100c"},
        id="cgpu-raw-resources",
    ),
    case(
        {CMEM: "4"},
        {CMEM: "4"},
        1,
        annotations={"gpuadm.io/class": "v100c"},
        id="cgpu-raw-memory-alone-leaves-compute-unlimited-so-is-a-whole-gpu",
    ),
    case(
        {"nvidia.com/gpu": "1"},
        {CMEM: "16", CCORE: "100"},
        1,
        annotations={"gpuadm.io/class": "v100c"},
        id="cgpu-untyped-gpu-count",
    ),
    # Volcano Engine mGPU: memory in MiB, 256 at least.
    case({"gpuadm.io/a10m": "3"}, {MCORE: "300"}, 3, id="mgpu-whole"),
    case({"gpuadm.io/a10m": "0.5"}, {MCORE: "50", MMEM: "12288"}, Fraction(1, 2), id="mgpu-share"),
    case(
        {"gpuadm.io/a10m": "5m"},
        {MCORE: "1", MMEM: "256"},
        Fraction(1, 96),
        rounded=True,
        id="mgpu-tiny-share-gets-the-256MiB-minimum",
    ),
    case(
        {"gpuadm.io/a10m-memory": "6Gi"},
        {MCORE: "25", MMEM: "6144"},
        Fraction(1, 4),
        id="mgpu-memory",
    ),
    case(
        {MCORE: "20", MMEM: "4096"},
        {MCORE: "20", MMEM: "4096"},
        Fraction(1, 5),
        annotations={"gpuadm.io/class": "a10m"},
        id="mgpu-raw-resources",
    ),
    case(
        {"nvidia.com/gpu": "1"},
        {MCORE: "100"},
        1,
        annotations={"gpuadm.io/class": "a10m"},
        id="mgpu-untyped-gpu-count",
    ),
    # Elastic GPU: memory in MiB.
    case({"gpuadm.io/l4e": "1"}, {ECORE: "100"}, 1, id="elastic-gpu-whole"),
    case(
        {"gpuadm.io/l4e": "0.1"},
        {ECORE: "10", EMEM: "2457"},
        Fraction(1, 10),
        id="elastic-gpu-share-rounds-memory-down-to-MiB",
    ),
    case(
        {"gpuadm.io/l4e-memory": "12Gi"},
        {ECORE: "50", EMEM: "12288"},
        Fraction(1, 2),
        id="elastic-gpu-memory",
    ),
    case(
        {ECORE: "200"},
        {ECORE: "200"},
        2,
        annotations={"gpuadm.io/class": "l4e"},
        id="elastic-gpu-raw-whole-gpus",
    ),
    case(
        {"nvidia.com/gpu": "2"},
        {ECORE: "200"},
        2,
        annotations={"gpuadm.io/class": "l4e"},
        id="elastic-gpu-untyped-gpu-count",
    ),
    # A stack declared by hand, with a count for whole GPUs.
    case({"gpuadm.io/npu": "2"}, {"example.com/npu": "2"}, 2, id="extended-whole-by-count"),
    case(
        {"gpuadm.io/npu": "0.5"},
        {"example.com/npu-core": "500", "example.com/npu-memory": "16"},
        Fraction(1, 2),
        id="extended-share",
    ),
    case(
        {"gpuadm.io/npu-memory": "3Gi"},
        {"example.com/npu-core": "90", "example.com/npu-memory": "2"},
        Fraction(9, 100),
        rounded=True,
        id="extended-memory-rounds-down-to-its-step-of-2Gi",
    ),
    case(
        {"example.com/npu-core": "250", "example.com/npu-memory": "8"},
        {"example.com/npu-core": "250", "example.com/npu-memory": "8"},
        Fraction(1, 4),
        annotations={"gpuadm.io/class": "npu"},
        id="extended-raw-resources",
    ),
    case(
        {"nvidia.com/gpu": "3"},
        {"example.com/npu": "3"},
        3,
        annotations={"gpuadm.io/class": "npu"},
        id="extended-untyped-gpu-count",
    ),
    case({"gpuadm.io/vram": "1"}, {"example.com/vram": "16"}, 1, id="memory-only-whole-gpu"),
    case(
        {"gpuadm.io/vram": "0.5"}, {"example.com/vram": "8"}, Fraction(1, 2), id="memory-only-share"
    ),
    case(
        {"gpuadm.io/cores": "0.25"},
        {"example.com/cores": "25"},
        Fraction(1, 4),
        id="compute-only-share",
    ),
    case(
        {"gpuadm.io/slices": "0.999"},
        {"example.com/slice-core": "99", "example.com/slice-memory": "16367"},
        Fraction(16367, 16384),
        rounded=True,
        id="shares-only-stack-rounds-a-share-down",
    ),
    case(
        {"gpuadm.io/slices-memory": "16Gi"},
        {"example.com/slice-core": "100", "example.com/slice-memory": "16384"},
        1,
        id="shares-only-stack-keeps-a-share-of-all-of-its-memory",
    ),
]


@pytest.mark.parametrize(("limits", "annotations", "expected", "charge", "rounded"), FORMS)
def test_each_preset_and_form(
    extended_policy: Policy,
    limits: dict[str, str],
    annotations: dict[str, str],
    expected: dict[str, str],
    charge: Fraction,
    rounded: bool,
) -> None:
    mutated, result = apply(extended_policy, pod(limits, annotations=annotations))
    assert limits_of(mutated) == expected
    assert result.charge == charge
    assert mutated["metadata"]["annotations"]["gpuadm.io/demand"] == result.demand
    assert any(" rounded " in warning for warning in result.warnings) == rounded


@pytest.mark.parametrize(
    ("class_name", "scheduler"),
    [
        pytest.param("t4q", None, id="qgpu-keeps-the-scheduler-its-extender-serves"),
        pytest.param("v100c", None, id="cgpu-keeps-the-scheduler"),
        pytest.param("a10m", "volcano", id="mgpu-is-scheduled-by-volcano"),
        pytest.param("l4e", None, id="elastic-gpu-keeps-the-scheduler-its-extender-serves"),
        pytest.param("npu", "npu-scheduler", id="extended-declares-its-scheduler"),
    ],
)
def test_scheduler(extended_policy: Policy, class_name: str, scheduler: str | None) -> None:
    mutated, _ = apply(extended_policy, pod({f"gpuadm.io/{class_name}": "1"}))
    assert mutated["spec"].get("schedulerName") == scheduler


def test_declared_annotations_are_written(extended_policy: Policy) -> None:
    mutated, _ = apply(extended_policy, pod({"gpuadm.io/npu": "0.5"}))
    assert mutated["metadata"]["annotations"]["example.com/isolation"] == "strict"


def test_a_memory_cap_on_whole_gpus_is_ignored_with_a_warning(extended_policy: Policy) -> None:
    mutated, result = apply(
        extended_policy, pod({"gpuadm.io/t4q": "1", "gpuadm.io/t4q-memory": "4G"})
    )
    assert limits_of(mutated) == {QCORE: "100"}
    assert "the memory cap is ignored" in " ".join(result.warnings)


def test_init_containers_and_sidecars_follow_the_effective_request_rule(
    extended_policy: Policy,
) -> None:
    sidecar = container("proxy", {"gpuadm.io/v100c": "0.25"}, restartPolicy="Always")
    setup = container("setup", {"gpuadm.io/v100c": "0.5"})
    _, result = apply(extended_policy, pod({"gpuadm.io/v100c": "0.25"}, init=[sidecar, setup]))
    assert result.charge == Fraction(3, 4)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            pod({"gpuadm.io/t4q-whole": "0.5"}),
            "class t4q-whole gives whole GPUs only (shareable: false)",
            id="share-on-an-unshareable-class",
        ),
        pytest.param(
            pod({"gpuadm.io/t4q-whole-memory": "4G"}),
            "class t4q-whole gives whole GPUs only (shareable: false)",
            id="memory-on-an-unshareable-class",
        ),
        pytest.param(
            pod({"gpuadm.io/v100c": "2"}),
            "asks for 2 GPUs, but backend cgpu gives a container at most 1 GPU (maxGpus) "
            "(class v100c)",
            id="cgpu-cannot-give-two-whole-gpus",
        ),
        pytest.param(
            pod({"nvidia.com/gpu": "2"}, annotations={"gpuadm.io/class": "v100c"}),
            "backend cgpu gives a container at most 1 GPU",
            id="cgpu-cannot-give-two-untyped-gpus",
        ),
        pytest.param(
            pod({"gpuadm.io/vram": "2"}),
            "backend extended gives a container at most 1 GPU (maxGpus) (class vram)",
            id="memory-only-stack-with-a-count-limit",
        ),
        pytest.param(
            pod({"gpuadm.io/slices": "1"}),
            "backend extended is declared without whole GPUs (`whole: []`)",
            id="whole-gpus-on-a-stack-that-gives-shares-only",
        ),
        pytest.param(
            pod({"gpuadm.io/cores-memory": "4Gi"}),
            "asks for a share, but the class has no `memory` to size it with (class cores)",
            id="memory-share-a-compute-only-stack-cannot-express",
        ),
        pytest.param(
            pod({"gpuadm.io/a10m-memory": "30Gi"}),
            "asks for 30Gi of GPU memory but one GPU of the class has 24Gi (class a10m)",
            id="memory-above-the-gpus",
        ),
        pytest.param(
            pod({"gpuadm.io/a10m": "1.5"}),
            "gpuadm.io/a10m: '1.5' is neither a whole number of GPUs",
            id="one-and-a-half-gpus",
        ),
        pytest.param(
            pod({"gpuadm.io/l4e": "0.5", "gpuadm.io/l4e-memory": "4Gi"}),
            "is a share and gpuadm.io/l4e-memory is a memory amount",
            id="share-and-memory-together",
        ),
        pytest.param(
            pod({"gpuadm.io/t4q": "1"}, extra=[container("b", {"gpuadm.io/v100c": "1"})]),
            'two GPU classes (t4q in container "main", v100c in container "b")',
            id="two-classes-in-one-pod",
        ),
        pytest.param(
            pod({CMEM: "4"}, annotations={"gpuadm.io/class": "t4q"}),
            f"{CMEM} does not belong to class t4q, whose backend qgpu uses {QCORE}, {QMEM}",
            id="raw-resource-of-another-stack",
        ),
        pytest.param(
            pod({QCORE: "50"}, annotations={"gpuadm.io/class": "npu"}),
            f"{QCORE} does not belong to class npu, whose backend extended uses",
            id="preset-resource-on-a-declared-stack",
        ),
        pytest.param(
            pod({"gpuadm.io/npu": "1", "example.com/npu-core": "10"}),
            "mixes gpuadm.io/npu with raw GPU resources (example.com/npu-core)",
            id="class-and-raw-in-one-container",
        ),
        pytest.param(
            pod({"gpuadm.io/a10m": "1"}, schedulerName="default-scheduler-2"),
            "scheduled by 'volcano', but the pod names schedulerName 'default-scheduler-2'",
            id="foreign-scheduler-where-mgpu-needs-volcano",
        ),
        pytest.param(
            pod({"gpuadm.io/npu": "1"}, nodeName="node-1"),
            "sets nodeName 'node-1', which bypasses it",
            id="node-name-bypasses-the-declared-scheduler",
        ),
    ],
)
def test_denials(extended_policy: Policy, body: dict[str, Any], message: str) -> None:
    with pytest.raises(Denial) as denial:
        plan(body, extended_policy)
    assert message in denial.value.message


def test_preset_resources_are_known_to_every_policy(policy: Policy) -> None:
    """A qGPU resource in a policy without a qGPU class is refused, not ignored."""
    body = pod({QCORE: "100"}, annotations={"gpuadm.io/class": "a100"})
    with pytest.raises(Denial, match=f"{QCORE} does not belong to class a100"):
        plan(body, policy)


# --- check-config ------------------------------------------------------------------------

BASE = "classes:\n  a:\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            BASE + "    backend: qgpu\n    memory: 16G\n    computeStep: 0\n",
            "policy.yaml:5: classes.a.computeStep: 0 must be a positive whole number",
            id="step-not-positive",
        ),
        pytest.param(
            BASE + "    backend: extended\n    resources: {compute: example.com/c}\n"
            "    memoryStep: -1\n",
            "policy.yaml:5: classes.a.memoryStep: -1 must be a positive whole number",
            id="memory-step-negative",
        ),
        pytest.param(
            BASE + "    backend: qgpu\n    memory: 16G\n    computeStep: 7\n",
            "policy.yaml:5: classes.a.computeStep: computeStep 7 does not divide computePerGpu 100",
            id="compute-worth-not-a-multiple-of-its-step",
        ),
        pytest.param(
            BASE + "    backend: qgpu\n    memory: 16G\n    computePerGpu: 98\n",
            "policy.yaml:2: classes.a: computeStep 5 does not divide computePerGpu 98",
            id="preset-step-does-not-divide-a-new-worth",
        ),
        pytest.param(
            BASE + "    backend: extended\n    resources: {}\n",
            "policy.yaml:4: classes.a.resources: declares no resource",
            id="no-dimension-at-all",
        ),
        pytest.param(
            BASE + "    backend: extended\n",
            "policy.yaml:2: classes.a.resources: missing: an extended class needs `resources`",
            id="no-resources",
        ),
        pytest.param(
            BASE + "    backend: extended\n    resources: {compute: example.com/c}\n"
            "    share: [compute, memory]\n",
            "policy.yaml:5: classes.a.share: share lists memory, but resources names no "
            "memory resource",
            id="share-needs-an-undeclared-dimension",
        ),
        pytest.param(
            BASE + "    backend: qgpu\n    resources: {memory: null}\n",
            "policy.yaml:2: classes.a: share lists memory, but resources names no memory",
            id="preset-share-needs-a-dimension-the-admin-removed",
        ),
        pytest.param(
            BASE + "    backend: extended\n    resources: {compute: example.com/c}\n"
            "    whole: count\n",
            "policy.yaml:5: classes.a.whole: whole lists count, but resources names no count",
            id="whole-by-an-undeclared-dimension",
        ),
        pytest.param(
            BASE + "    backend: extended\n    resources: {compute: example.com/c}\n"
            "    share: [count]\n",
            "classes.a.share.0: 'count' is not one of compute, memory",
            id="a-share-carries-no-count",
        ),
        pytest.param(
            BASE + "    backend: extended\n    resources: {count: example.com/gpu}\n",
            "policy.yaml:2: classes.a: a share must carry compute or memory",
            id="count-only-stack-must-be-unshareable",
        ),
        pytest.param(
            BASE + "    backend: extended\n    resources: {compute: Example.com/core}\n",
            "policy.yaml:4: classes.a.resources.compute: 'Example.com/core' is not an "
            "extended resource name",
            id="resource-name-not-lowercase-domain",
        ),
        pytest.param(
            BASE + "    backend: extended\n    resources: {compute: gpu-core}\n",
            "'gpu-core' is not an extended resource name",
            id="resource-name-without-domain",
        ),
        pytest.param(
            BASE + "    backend: extended\n    resources: {memory: kubernetes.io/gpu}\n",
            "'kubernetes.io/gpu' is not an extended resource name",
            id="resource-name-in-kubernetes-domain",
        ),
        pytest.param(
            BASE
            + "    backend: extended\n    memory: 16Gi\n    resources: {memory: example.com/m}\n",
            "policy.yaml:2: classes.a: resources.memory (example.com/m) is declared, so "
            "memoryUnit is needed",
            id="memory-without-a-unit",
        ),
        pytest.param(
            BASE + "    backend: cgpu\n",
            "policy.yaml:2: classes.a: backend cgpu declares GPU memory (aliyun.com/gpu-mem), "
            "so it needs `memory`",
            id="preset-needs-the-gpus-memory",
        ),
        pytest.param(
            BASE + "    backend: qgpu\n    memory: 16G\n    computeMin: 7\n",
            "policy.yaml:5: classes.a.computeMin: computeMin 7 must be a multiple of computeStep 5",
            id="minimum-between-steps",
        ),
        pytest.param(
            BASE + "    backend: mgpu\n    memory: 128Mi\n",
            "policy.yaml:2: classes.a: memoryMin 256 is more than one GPU holds",
            id="minimum-above-a-gpu",
        ),
        pytest.param(
            BASE + "    backend: cgpu\n    memory: 512Mi\n",
            "memory 512Mi is less than one memoryUnit (1Gi)",
            id="gpu-smaller-than-a-unit",
        ),
        pytest.param(
            BASE + "    backend: cgpu\n    memory: 16Gi\n    maxGpus: 0\n",
            "policy.yaml:5: classes.a.maxGpus: 0 must be a positive whole number",
            id="max-gpus-zero",
        ),
        pytest.param(
            BASE + "    backend: extended\n    resources: {compute: example.com/c}\n"
            "    annotations: {'not a key': x}\n",
            "'not a key' is not an annotation key",
            id="annotation-key-invalid",
        ),
        pytest.param(
            BASE + "    backend: qgpu\n    memory: 16G\n    memoryUnitt: 1Gi\n",
            "policy.yaml:5: classes.a.memoryUnitt: `memoryUnitt` is not a key of a qgpu class; "
            "did you mean `memoryUnit`?",
            id="misspelt-key",
        ),
    ],
)
def test_declaration_errors_point_at_the_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_policy(text)
    assert any(expected in problem for problem in error.value.problems), error.value.problems


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            BASE + "    backend: qgpu\n    memory: 16Gi\n    memoryUnit: 1Gi\n",
            id="qgpu-memory-in-GiB",
        ),
        pytest.param(
            BASE + "    backend: elastic-gpu\n    memory: 24Gi\n"
            "    resources: {compute: elasticgpu.io/gpu-core, memory: elasticgpu.io/gpu-memory}\n",
            id="elastic-gpu-older-names",
        ),
        pytest.param(
            BASE + "    backend: cgpu\n    memory: 16Gi\n    share: memory\n    whole: memory\n",
            id="cgpu-memory-isolation-only",
        ),
        pytest.param(
            BASE + "    backend: extended\n    shareable: false\n"
            "    resources: {count: example.com/gpu}\n",
            id="count-only-stack-for-whole-gpus",
        ),
    ],
)
def test_declarations_that_load(text: str) -> None:
    load_policy(text)


def test_a_preset_takes_partial_overrides() -> None:
    policy = load_policy(
        BASE + "    backend: elastic-gpu\n    memory: 24Gi\n"
        "    resources: {memory: elasticgpu.io/gpu-memory}\n"
    )
    mutated, _ = apply(policy, pod({"gpuadm.io/a": "0.5"}))
    assert limits_of(mutated) == {ECORE: "50", "elasticgpu.io/gpu-memory": "12288"}


# --- a preset is an `extended` declaration ------------------------------------------------


def written_out_presets() -> dict[str, dict[str, Any]]:
    """Return the presets as docs/configuration.md writes them out, as `extended`."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs/configuration.md").read_text()
    section = text.split("### The presets written out", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    presets: dict[str, dict[str, Any]] = yaml.safe_load(block)
    return presets


WRITTEN_OUT = written_out_presets()
PRESETS = sorted(WRITTEN_OUT)
GPU_MEMORY = "24Gi"


def preset_and_copy(preset: str) -> tuple[Policy, Policy]:
    """Return a policy with class `g` on the preset, and one with `g` written out."""
    declared = {"backend": "extended", "memory": GPU_MEMORY, **WRITTEN_OUT[preset]}
    return (
        load_policy(f"classes:\n  g:\n    backend: {preset}\n    memory: {GPU_MEMORY}\n"),
        load_policy(yaml.safe_dump({"classes": {"g": declared}})),
    )


POLICY_PAIRS = {preset: preset_and_copy(preset) for preset in PRESETS}

quantities = st.one_of(
    st.integers(min_value=1, max_value=4).map(str),
    st.integers(min_value=1, max_value=999).map(lambda n: f"{n}m"),
)
memories = st.integers(min_value=1, max_value=26 * 1024).map(lambda mib: f"{mib}Mi")


@st.composite
def class_limits(draw: st.DrawFn, class_name: str, raw_names: list[str]) -> dict[str, str]:
    """Draw what one container asks of a class, in any form, valid or not."""
    key = f"gpuadm.io/{class_name}"
    form = draw(st.sampled_from(["share-or-whole", "memory", "capped", "untyped", "raw"]))
    if form == "share-or-whole":
        return {key: draw(quantities)}
    if form == "memory":
        return {f"{key}-memory": draw(memories)}
    if form == "capped":
        return {key: str(draw(st.integers(min_value=1, max_value=3))), f"{key}-memory": "4Gi"}
    if form == "untyped":
        return {"nvidia.com/gpu": str(draw(st.integers(min_value=1, max_value=3)))}
    chosen = draw(st.lists(st.sampled_from(raw_names), min_size=1, unique=True))
    return {name: str(draw(st.integers(min_value=1, max_value=30000))) for name in chosen}


@st.composite
def pods_of(draw: st.DrawFn, policy: Policy, class_name: str) -> dict[str, Any]:
    """Draw a pod of one to three containers that ask for a class, raw resources included."""
    # A resource of another stack now and then, which must be refused.
    raw_names = [*sorted(policy.classes[class_name].resource_names()), QCORE, CMEM]
    containers = [
        container(f"c{index}", draw(class_limits(class_name, raw_names)))
        for index in range(draw(st.integers(min_value=1, max_value=3)))
    ]
    body = pod({}, annotations={"gpuadm.io/class": class_name})
    body["spec"]["containers"] = containers
    return body


def outcome(body: dict[str, Any], policy: Policy, backend: str) -> tuple[Any, ...]:
    """Return what gpuadm does to a pod: patch, charge, warnings; or the denial."""
    try:
        result = plan(body, policy)
    except Denial as denial:
        return ("denied", denial.message.replace(f"backend {backend} ", "backend extended "))
    return (result.patch, result.charge, result.warnings)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PRESETS), st.data())
def test_a_hand_declared_stack_behaves_as_the_preset_it_copies(
    preset: str, data: st.DataObject
) -> None:
    named, declared = POLICY_PAIRS[preset]
    body = data.draw(pods_of(named, "g"))
    assert outcome(body, named, preset) == outcome(body, declared, "extended")


def test_the_written_out_presets_resolve_to_the_same_values() -> None:
    for preset, (named, declared) in POLICY_PAIRS.items():
        a, b = named.classes["g"], declared.classes["g"]
        assert isinstance(a, ExtendedBase)
        assert isinstance(b, ExtendedBase)
        for what in (
            "compute_per_gpu",
            "compute_step",
            "compute_min",
            "memory_unit",
            "memory_step",
            "memory_min",
            "memory_per_gpu",
            "max_gpus",
            "annotations",
            "scheduler",
            "whole_dimensions",
            "share_dimensions",
        ):
            assert getattr(a, what) == getattr(b, what), f"{preset}: {what}"
        assert a.resource_names() == b.resource_names(), preset


# --- properties of grants -----------------------------------------------------------------

PROPERTY_POLICY = load_policy(POLICY_YAML)
SHAREABLE = sorted(
    name
    for name, gpu_class in PROPERTY_POLICY.classes.items()
    if isinstance(gpu_class, ExtendedBase) and gpu_class.shareable
)
shares = st.fractions(min_value=Fraction(1, 1000), max_value=Fraction(999, 1000))


@st.composite
def asks(draw: st.DrawFn, gpu_class: ExtendedBase) -> Ask:
    """Draw a share, an amount of memory up to the GPU's, or whole GPUs."""
    kinds = ["share", "whole"] + (["memory"] if gpu_class.memory is not None else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "share":
        return Share(draw(shares))
    if kind == "whole":
        return Whole(draw(st.integers(min_value=1, max_value=gpu_class.max_gpus or 4)))
    assert gpu_class.memory is not None
    return MemoryShare(Fraction(draw(st.integers(min_value=1, max_value=int(gpu_class.memory)))))


def per_gpu(gpu_class: ExtendedBase) -> dict[str, int]:
    """Return what one GPU is worth in each declared resource, worked out from the config."""
    names, worth = gpu_class.resources, {}
    if names.count:
        worth[names.count] = 1
    if names.compute:
        worth[names.compute] = gpu_class.compute_per_gpu
    if names.memory:
        assert gpu_class.memory is not None
        assert gpu_class.memory_unit is not None
        worth[names.memory] = math.floor(gpu_class.memory / gpu_class.memory_unit)
    return worth


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SHAREABLE), st.data())
def test_shares_round_down_so_they_pack_and_are_charged_what_they_grant(
    class_name: str, data: st.DataObject
) -> None:
    gpu_class = PROPERTY_POLICY.classes[class_name]
    assert isinstance(gpu_class, ExtendedBase)
    ask = data.draw(asks(gpu_class))
    try:
        grant = gpu_class.grant(ask)
    except Denial:
        # Only a stack declared without whole GPUs refuses one of these asks.
        assert isinstance(ask, Whole)
        assert not gpu_class.whole_dimensions
        return
    worth = per_gpu(gpu_class)
    asked = gpu_class.share_of(ask)
    # The charge is exactly the largest fraction of one GPU granted in any dimension.
    granted = {name: Fraction(amount, worth[name]) for name, amount in grant.resources.items()}
    assert grant.charge == max(granted.values())
    assert all(amount > 0 for amount in grant.resources.values()), "nothing rounds to zero"
    if isinstance(ask, Whole):
        assert grant.charge == asked
        assert granted == dict.fromkeys(granted, Fraction(ask.count))
        return
    assert grant.charge <= 1
    if grant.charge == 1 and gpu_class.whole_dimensions:
        return  # all of a GPU in some dimension: the stack's whole-GPU form
    # Each dimension a share carries holds less than a step below the ask, and no more than
    # it unless that is the dimension's minimum: so as many shares of it as add up to one
    # GPU fit on one, in every dimension.
    names = gpu_class.resources
    fit = math.floor(1 / asked)
    if names.compute in grant.resources:
        amount = grant.resources[names.compute]
        least = gpu_class.compute_min or gpu_class.compute_step
        assert granted[names.compute] > asked - Fraction(
            gpu_class.compute_step, worth[names.compute]
        )
        assert granted[names.compute] <= asked or amount == least
        assert fit * amount <= worth[names.compute] or amount == least
    if names.memory in grant.resources:
        assert gpu_class.memory is not None
        assert gpu_class.memory_unit is not None
        amount = grant.resources[names.memory]
        least = gpu_class.memory_min or gpu_class.memory_step
        wanted = ask.memory if isinstance(ask, MemoryShare) else ask.fraction * gpu_class.memory
        held = amount * gpu_class.memory_unit
        assert held > wanted - gpu_class.memory_step * gpu_class.memory_unit
        assert held <= wanted or amount == least
        assert fit * amount <= worth[names.memory] or amount == least


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(PROPERTY_POLICY.classes)), st.data())
def test_every_patch_applies_is_valid_and_idempotent(class_name: str, data: st.DataObject) -> None:
    body = data.draw(pods_of(PROPERTY_POLICY, class_name))
    try:
        result = plan(body, PROPERTY_POLICY)
    except Denial:
        return
    mutated = jsonpatch.apply_patch(body, result.patch)
    assert violations(mutated, PROPERTY_POLICY.domain) == []
    again = plan(mutated, PROPERTY_POLICY)
    assert again.patch == []
    assert again.charge == result.charge
