"""N shares of 1/N pack onto one GPU, on every sharing stack.

For each stack and N in 2, 3, 4, 5, 8 and 10, N pods that each ask for 1/N of a GPU (as a
share, or as 1/N of its memory) are rewritten; what gpuadm writes must fit one GPU as the
stack's own scheduler fits it (`tests.scheduler_fit`), in every dimension the stack counts,
and a quota of one GPU must admit exactly N of them: quota charges what the stack grants, so
it admits exactly the shares that fit.

The classes' memory is the GPU's as NVML reports it (143771 MiB for an H200, 81559 MiB for an
H100 80GB HBM3), which is what the stacks register: a class whose memory is larger than the
GPU's makes every share ask more than its part.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import jsonpatch
import pytest

from policies import load_policy, plan, pod_charge
from policies.quantity import format_amount, parse_quantity
from policies.quota.judge import judge
from tests import scheduler_fit
from tests.apiserver_rules import violations
from tests.builders import pod

POLICY = load_policy(
    """
domain: gpuadm.io
classes:
  a100:
    backend: hami
    memory: 80Gi
    models: [NVIDIA A100-SXM4-80GB]
  h200:
    backend: hami
    memory: 143771Mi
    models: [NVIDIA H200]
  a10:
    backend: volcano
    memory: 24Gi
    models: [NVIDIA A10]
  h100-volcano:
    backend: volcano
    memory: 81559Mi
    models: [NVIDIA H100 80GB HBM3]
  t4:
    backend: gpu-manager
    memory: 16Gi
  h200-gpu-manager:
    backend: gpu-manager
    memory: 143771Mi
  v100:
    backend: gpushare
    memory: 16Gi
  h200-gpushare:
    backend: gpushare
    memory: 143771Mi
  a100-kai:
    backend: kai
    memory: 80Gi
    models: [NVIDIA A100-SXM4-80GB]
  h200-kai:
    backend: kai
    memory: 143771Mi
    models: [NVIDIA H200]
  t4-qgpu:
    backend: qgpu
    memory: 16G
  h200-cgpu:
    backend: cgpu
    memory: 143771Mi
  h100-mgpu:
    backend: mgpu
    memory: 81559Mi
  h100-egpu:
    backend: elastic-gpu
    memory: 81559Mi
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
  h100-dra:
    backend: dra
    models: [NVIDIA H100 80GB HBM3]
    sharing:
      strategy: capacity
      capacity: {memory: 81559Mi}
  a10-hami-dra:
    backend: dra
    deviceClassName: hami-core-gpu.project-hami.io
    driver: hami-core-gpu.project-hami.io
    sharing:
      strategy: capacity
      capacity: {cores: 100, memory: 23028Mi}
  h100-slots:
    backend: dra
    models: [NVIDIA H100 80GB HBM3]
    sharing:
      strategy: capacity
      capacity: {memory: 81559Mi, shares: 4}
"""
)
NS = (2, 3, 4, 5, 8, 10)
NPU = scheduler_fit.Declared(
    "example.com/npu-core", "example.com/npu-memory", 1000, Fraction(scheduler_fit.GiB)
)


def _claims(capacity: Mapping[str, str]) -> Callable[[Sequence[Any], Fraction], Any]:
    held = {name: parse_quantity(value) for name, value in capacity.items()}

    def usage(specs: Sequence[Any], _: Fraction) -> scheduler_fit.Usage:
        return scheduler_fit.dra(specs, held)

    return usage


@dataclass(frozen=True)
class Stack:
    """A class of the policy, and its stack's scheduler on one of the class's GPUs."""

    class_name: str
    fit: Callable[[Sequence[Any], Fraction], scheduler_fit.Usage]
    claims: bool = False

    @property
    def gpu_memory(self) -> Fraction:
        """The memory of one GPU of the class, as NVML reports it."""
        gpu_class = POLICY.classes[self.class_name]
        if gpu_class.memory is not None:
            return gpu_class.memory
        sharing = getattr(gpu_class, "sharing", None)
        assert sharing is not None
        return Fraction(sharing.capacity["memory"].value)


STACKS = [
    Stack("a100", scheduler_fit.hami),
    Stack("h200", scheduler_fit.hami),
    Stack("a10", scheduler_fit.volcano),
    Stack("h100-volcano", scheduler_fit.volcano),
    Stack("t4", scheduler_fit.gpu_manager),
    Stack("h200-gpu-manager", scheduler_fit.gpu_manager),
    Stack("v100", scheduler_fit.gpushare),
    Stack("h200-gpushare", scheduler_fit.gpushare),
    Stack("a100-kai", scheduler_fit.kai),
    Stack("h200-kai", scheduler_fit.kai),
    Stack("t4-qgpu", scheduler_fit.QGPU.usage),
    Stack("h200-cgpu", scheduler_fit.CGPU.usage),
    Stack("h100-mgpu", scheduler_fit.MGPU.usage),
    Stack("h100-egpu", scheduler_fit.ELASTIC_GPU.usage),
    Stack("npu", NPU.usage),
    Stack("h100-dra", _claims({"memory": "81559Mi"}), claims=True),
    Stack("a10-hami-dra", _claims({"cores": "100", "memory": "23028Mi"}), claims=True),
]


def one_nth(stack: Stack, n: int, form: str) -> dict[str, str]:
    """Return the limits of a pod that asks for 1/n of a GPU of the class, as a user would
    write them: a share in at most four decimals (`0.3333`), or 1/n of its memory, exactly
    where a quantity can say it (`3276.8Mi`), else in whole MiB (`27306Mi`)."""
    if form == "share":
        return {f"gpuadm.io/{stack.class_name}": format_amount(Fraction(10_000 // n, 10_000))}
    mib = stack.gpu_memory / n / 2**20
    exact = format_amount(mib)
    memory = f"{math.floor(mib)}Mi" if "/" in exact else f"{exact}Mi"
    return {f"gpuadm.io/{stack.class_name}-memory": memory}


def admit(stack: Stack, limits: dict[str, str], count: int) -> tuple[list[Any], list[Fraction]]:
    """Rewrite `count` pods asking for `limits`; return what the stack's scheduler reads of
    each (the stored pod, or its claim's spec) and what quota charges each."""
    written, charges = [], []
    for _ in range(count):
        body = pod(limits)
        result = plan(body, POLICY)
        stored = jsonpatch.apply_patch(body, result.patch)
        assert violations(stored, POLICY.domain) == []
        assert plan(stored, POLICY).patch == [], "the rewrite is not idempotent"
        assert pod_charge(stored, POLICY) == (stack.class_name, result.charge)
        if stack.claims:
            (template,) = result.claim_templates
            written.append(template.spec)
        else:
            written.append(stored)
        charges.append(result.charge)
    return written, charges


CASES = [
    pytest.param(stack, n, form, id=f"{stack.class_name}-{form}-{n}")
    for stack in STACKS
    for form in ("share", "memory")
    for n in NS
]


@pytest.mark.parametrize(("stack", "n", "form"), CASES)
def test_n_shares_of_one_nth_fit_one_gpu_as_the_stack_fits_them(
    stack: Stack, n: int, form: str
) -> None:
    written, _ = admit(stack, one_nth(stack, n, form), n)
    usage = stack.fit(written, stack.gpu_memory)
    assert scheduler_fit.fits(usage), f"{n} shares overfill one GPU: {usage}"


# Where the stack's unit is coarser than 1/N of a GPU, 1/N rounds down to less, and more
# than N fit: a tenth of 16 GiB is 1 GiB to gpushare, and 16 of them fit one GPU.
MORE_FIT = {("v100", 10): 16}


@pytest.mark.parametrize(("stack", "n", "form"), CASES)
def test_a_limit_of_one_gpu_admits_exactly_the_n_shares_that_fit(
    stack: Stack, n: int, form: str
) -> None:
    fit = MORE_FIT.get((stack.class_name, n), n)
    written, charges = admit(stack, one_nth(stack, n, form), fit + 1)
    assert count_admitted(charges, Fraction(1)) == fit
    assert scheduler_fit.fits(stack.fit(written[:fit], stack.gpu_memory))
    # The one refused would not have fitted either.
    assert not scheduler_fit.fits(stack.fit(written, stack.gpu_memory))


def count_admitted(charges: Sequence[Fraction], limit: Fraction) -> int:
    """Judge the charges one after another against `limit`; return how many are admitted."""
    in_use = Fraction(0)
    admitted = 0
    for charge in charges:
        verdict = judge(
            namespace="team-a",
            class_name="c",
            requested=charge,
            in_use={"c": in_use},
            limits={"c": limit},
        )
        if verdict.allowed:
            in_use += charge
            admitted += 1
    return admitted


@pytest.mark.parametrize("n", NS)
def test_a_device_of_four_slots_takes_four_shares_and_quota_admits_four(n: int) -> None:
    # A claim takes one of the device's 4 `shares` at least: however small the share, no
    # more than 4 fit, and a limit of one GPU admits exactly as many as fit.
    stack = Stack("h100-slots", _claims({"memory": "81559Mi", "shares": "4"}), claims=True)
    written, charges = admit(stack, one_nth(stack, n, "share"), n)
    fit = max(k for k in range(n + 1) if scheduler_fit.fits(stack.fit(written[:k], Fraction(0))))
    assert fit == min(n, 4)
    assert count_admitted(charges, Fraction(1)) == fit


def test_two_halves_of_an_h200_fit_its_143771_mib() -> None:
    # Half of 143771 MiB is 71885.5 MiB: written as 71886, two would not fit.
    for limits in ({"gpuadm.io/h200": "0.5"}, {"gpuadm.io/h200-memory": "71885.5Mi"}):
        written, _ = admit(STACKS[1], limits, 2)
        assert [p["spec"]["containers"][0]["resources"]["limits"] for p in written] == [
            {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "50", "nvidia.com/gpumem": "71885"}
        ] * 2
        assert scheduler_fit.fits(scheduler_fit.hami(written, Fraction(143771 * 2**20)))


def test_kai_is_written_the_hundredths_it_keeps() -> None:
    # KAI rounds a fraction to the nearest hundredth: 0.333 is written 0.33 (three fit), and
    # 0.125 as 0.12, which KAI keeps (0.125 it would count as 0.13, and eight would not fit).
    for share, written in (("0.333", "0.33"), ("0.125", "0.12"), ("0.5", "0.5")):
        result = plan(pod({"gpuadm.io/a100-kai": share}), POLICY)
        stored = jsonpatch.apply_patch(pod({"gpuadm.io/a100-kai": share}), result.patch)
        assert stored["metadata"]["annotations"]["gpu-fraction"] == written
        assert result.charge == Fraction(written)


def test_a_memory_warning_names_its_unit() -> None:
    result = plan(pod({"gpuadm.io/a100-kai-memory": "79.99Gi"}), POLICY)
    (warning,) = result.warnings
    assert "79.99Gi of GPU memory" in warning, warning
    assert "85888608501.76" not in warning


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        pytest.param(
            {"gpuadm.io/a100": "0.3333"},
            'container "main": a share of 0.3333 of a100 rounded down to 0.33328857421875 GPU '
            "(nvidia.com/gpu: 1, nvidia.com/gpucores: 33, nvidia.com/gpumem: 27303 MiB), so that "
            "shares adding up to one GPU fit on one; quota is charged 0.33328857421875",
            id="hami",
        ),
        pytest.param(
            {"gpuadm.io/t4-memory": "5461Mi"},
            'container "main": 5461Mi of GPU memory of t4 rounded down to 0.33 GPU '
            "(tencent.com/vcuda-core: 33, tencent.com/vcuda-memory: 21 blocks of 256Mi), so that "
            "shares adding up to one GPU fit on one; quota is charged 0.33",
            id="gpu-manager",
        ),
        pytest.param(
            {"gpuadm.io/h200-kai-memory": "10Gi"},
            'container "main": 10Gi of GPU memory of h200-kai rounded down to 0.07 GPU '
            "(annotation gpu-memory: 10058 MiB), so that shares adding up to one GPU fit on "
            "one; quota is charged 0.07",
            id="kai",
        ),
    ],
)
def test_a_share_rounded_down_says_so_with_units(limits: dict[str, str], expected: str) -> None:
    assert plan(pod(limits), POLICY).warnings == (expected,)


@pytest.mark.parametrize(
    ("limits", "written", "charge"),
    [
        # A thousandth of a GPU is 0.1 cores: a share never rounds to none (HAMi reads 0 cores
        # as no limit at all), so it takes one core, and is charged it.
        pytest.param(
            {"gpuadm.io/a100": "1m"},
            {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "1", "nvidia.com/gpumem": "81"},
            Fraction(1, 100),
            id="a-core-at-least",
        ),
        pytest.param(
            {"gpuadm.io/a100-memory": "512Ki"},
            {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "1", "nvidia.com/gpumem": "1"},
            Fraction(1, 100),
            id="a-mib-at-least",
        ),
        pytest.param(
            {"gpuadm.io/t4": "1m"},
            {"tencent.com/vcuda-core": "1", "tencent.com/vcuda-memory": "1"},
            Fraction(1, 64),
            id="a-block-at-least",
        ),
        pytest.param(
            {"gpuadm.io/v100": "1m"},
            {"aliyun.com/gpu-mem": "1"},
            Fraction(1, 16),
            id="a-gib-at-least",
        ),
        # gpushare counts a GPU's memory in whole GiB, rounded down: 143771 MiB is 140 GiB,
        # all of which a whole GPU asks (141 would fit no GPU).
        pytest.param(
            {"gpuadm.io/h200-gpushare": "1"}, {"aliyun.com/gpu-mem": "140"}, 1, id="gpushare-whole"
        ),
    ],
)
def test_a_share_never_rounds_to_nothing_and_a_whole_gpu_fits_its_gpu(
    limits: dict[str, str], written: dict[str, str], charge: Fraction
) -> None:
    body = pod(limits)
    result = plan(body, POLICY)
    stored = jsonpatch.apply_patch(body, result.patch)
    assert stored["spec"]["containers"][0]["resources"]["limits"] == written
    assert result.charge == charge
    assert pod_charge(stored, POLICY) == (result.class_name, charge)
