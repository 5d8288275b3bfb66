"""What a newcomer's valid-looking config gets wrong, and what check-config says of it: memory
without a unit, model names in another spelling, classes nothing tells apart, a limit under
its class's smallest pod, a budget its limits never let a namespace spend, and `defaultBudget`.
"""

from __future__ import annotations

import pytest

from policies import ConfigError, load_policy, load_quotas, policy_warnings
from policies.config_advice import quota_warnings

POLICY = """\
classes:
  a100: {backend: hami, memory: 80Gi, models: [NVIDIA A100-SXM4-80GB]}
  h100: {backend: nvidia, models: [NVIDIA H100 80GB HBM3]}
  a100-mig:
    backend: mig
    memory: 80Gi
    profiles: {1g.10gb: 10Gi, 3g.40gb: 40Gi}
    nodeSelector: {nvidia.com/mig.strategy: [mixed]}
"""


@pytest.mark.parametrize(
    ("memory", "problem"),
    [
        pytest.param(
            "80",
            "80 bytes is less memory than any GPU has; give a unit (did you mean 80Gi?)",
            id="80",
        ),
        pytest.param("81920", "(did you mean 81920Mi?)", id="81920-is-mib"),
        pytest.param("1048575", "(did you mean 1048575Mi?)", id="just-under-1Mi"),
    ],
)
def test_memory_without_a_unit_is_refused(memory: str, problem: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_policy(f"classes:\n  a: {{backend: hami, memory: {memory}}}\n")
    (said,) = error.value.problems
    assert said.startswith("policy.yaml:2: classes.a.memory: ")
    assert problem in said


@pytest.mark.parametrize("memory", ["1Mi", "1048576", "16Gi", "85899345920"])
def test_memory_of_any_gpu_is_taken(memory: str) -> None:
    load_policy(f"classes:\n  a: {{backend: hami, memory: {memory}}}\n")


def model_warnings(model: str) -> list[str]:
    policy = load_policy(f"classes:\n  a: {{backend: hami, memory: 80Gi, models: ['{model}']}}\n")
    return [w for w in policy_warnings(policy) if "is not a GPU name gpuadm knows" in w]


@pytest.mark.parametrize(
    ("model", "hint"),
    [
        pytest.param(
            "NVIDIA A100 SXM4 80GB", "(did you mean `NVIDIA A100-SXM4-80GB` or ", id="typo"
        ),
        pytest.param(
            "NVIDIA-A100-SXM4-80GB",
            "(it is the node label's spelling, as in nvidia.com/gpu.product; the driver's name "
            "is `NVIDIA A100-SXM4-80GB`",
            id="node-label-spelling",
        ),
        pytest.param(
            "H100",
            "(did you mean `NVIDIA H100` or `NVIDIA H100 80GB HBM3` or `NVIDIA H100 PCIe`?)",
            id="bare-name",
        ),
        pytest.param("Acme Z9000", "knows; nodes of", id="unknown-without-a-guess"),
    ],
)
def test_a_model_gpuadm_does_not_know_is_warned_of_with_what_it_may_mean(
    model: str, hint: str
) -> None:
    (warning,) = model_warnings(model)
    assert warning.startswith(f"class a: model '{model}' is not a GPU name gpuadm knows")
    assert hint in warning


@pytest.mark.parametrize("model", ["NVIDIA A100-SXM4-80GB", "Tesla T4", "NVIDIA H200 NVL"])
def test_a_model_of_the_catalogue_is_not_warned_of(model: str) -> None:
    assert model_warnings(model) == []


def overlap_warnings(classes: str) -> list[str]:
    policy = load_policy(f"classes:\n{classes}")
    return [w for w in policy_warnings(policy) if "nothing tells their nodes apart" in w]


A100 = "models: [NVIDIA A100-SXM4-80GB]"


@pytest.mark.parametrize(
    ("classes", "warned"),
    [
        pytest.param(
            f"  a: {{backend: hami, memory: 80Gi, {A100}}}\n"
            f"  b: {{backend: hami, memory: 80Gi, shareable: false, {A100}}}\n",
            True,
            id="two-hami-classes-one-model",
        ),
        pytest.param(
            f"  a: {{backend: hami, memory: 80Gi, {A100}}}\n"
            f"  b: {{backend: hami, memory: 80Gi, {A100}, nodeSelector: {{pool: [b]}}}}\n",
            False,
            id="a-node-selector-tells-them-apart",
        ),
        pytest.param(
            f"  a: {{backend: hami, memory: 80Gi, {A100}}}\n"
            "  b: {backend: hami, memory: 80Gi, models: [NVIDIA A100 80GB PCIe]}\n",
            False,
            id="other-models",
        ),
        pytest.param(
            f"  a: {{backend: hami, memory: 80Gi, {A100}}}\n  b: {{backend: nvidia, {A100}}}\n",
            False,
            id="other-backends",
        ),
    ],
)
def test_classes_nothing_tells_apart_are_warned_of(classes: str, warned: bool) -> None:
    warnings = overlap_warnings(classes)
    assert bool(warnings) is warned
    if warned:
        assert warnings == [
            "class a and class b (hami) both select NVIDIA A100-SXM4-80GB, with the same "
            "nodeSelector: nothing tells their nodes apart, so pods of either run on the "
            "other's GPUs; give each its own models or nodeSelector"
        ]


def advice(quotas: str) -> list[tuple[str, str]]:
    return [(".".join(p), w) for p, w in quota_warnings(load_quotas(quotas), load_policy(POLICY))]


@pytest.mark.parametrize(
    ("quotas", "expected"),
    [
        pytest.param(
            "namespaces:\n  team-a: {h100: 500m}\n",
            [
                (
                    "namespaces.team-a.h100",
                    "0.5 is less than the least a pod of class h100 is charged (1: the class "
                    "gives whole GPUs only), so it admits no pod; write 0 to forbid the class, "
                    "or at least 1",
                )
            ],
            id="a-share-of-a-whole-gpu-class",
        ),
        pytest.param(
            "default: {a100-mig: 0.125}\n",
            [
                (
                    "default.a100-mig",
                    "0.125 is less than the least a pod of class a100-mig is charged (1/3: its "
                    "smallest share), so it admits no pod; write 0 to forbid the class, or at "
                    "least 0.334",
                )
            ],
            id="under-the-smallest-mig-profile",
        ),
        pytest.param("default: {a100-mig: 334m}\n", [], id="the-smallest-profile"),
        pytest.param("namespaces:\n  team-a: {h100: 1, a100: 0.01}\n", [], id="what-fits"),
        pytest.param("namespaces:\n  team-a: {h100: 0}\n", [], id="0-forbids"),
    ],
)
def test_a_limit_under_its_classs_smallest_pod_is_warned_of(
    quotas: str, expected: list[tuple[str, str]]
) -> None:
    assert advice(quotas) == expected


@pytest.mark.parametrize(
    ("quotas", "expected"),
    [
        pytest.param(
            "namespaces:\n  team-a: {h100: 2, budget: {h100: 500h/1d}}\n",
            [
                (
                    "namespaces.team-a.budget.h100",
                    "500h/1d can never be spent: a limit of 2 GPUs holds at most 48h in 1d; "
                    "lower the budget, or raise the limit",
                )
            ],
            id="a-class",
        ),
        pytest.param(
            "namespaces:\n  team-a: {h100: 4, '*': 1, budget: {h100: 25h/1d}}\n",
            [
                (
                    "namespaces.team-a.budget.h100",
                    "25h/1d can never be spent: a limit of 1 GPU holds at most 24h in 1d; "
                    "lower the budget, or raise the limit",
                )
            ],
            id="the-cap-is-lower",
        ),
        pytest.param(
            "default: {'*': 3, budget: {'*': 100h/1d}}\n",
            [
                (
                    "default.budget.*",
                    "100h/1d can never be spent: a limit of 3 GPUs holds at most 72h in 1d; "
                    "lower the budget, or raise the limit",
                )
            ],
            id="all-classes-by-default",
        ),
        pytest.param(
            "namespaces:\n  team-a: {h100: 2, budget: {h100: 48h/1d}}\n", [], id="just-reachable"
        ),
        pytest.param(
            "namespaces:\n  team-a: {budget: {h100: 500h/1d}}\n", [], id="no-limit-no-bound"
        ),
    ],
)
def test_a_budget_its_limits_never_let_be_spent_is_warned_of(
    quotas: str, expected: list[tuple[str, str]]
) -> None:
    assert advice(quotas) == expected


@pytest.mark.parametrize("key", ["defaultBudget", "default_budget"])
def test_default_budget_is_not_a_key_of_the_file(key: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_quotas(f"{key}: {{h100: 10h/1d}}\n")
    (said,) = error.value.problems
    assert said == (
        f"quotas.yaml:1: {key}: the budgets of namespaces without an entry go under "
        "`default`, as `default: {budget: {a100: 500h/7d}}`: this key is not one of a quota "
        "config"
    )


def test_a_misspelt_key_is_never_offered_the_one_the_file_cannot_hold() -> None:
    with pytest.raises(ConfigError) as error:
        load_quotas("defaultBuget: {h100: 10h/1d}\n")
    (said,) = error.value.problems
    assert "defaultBudget" not in said
    assert "`defaultBuget` is not a key of a quota config" in said
