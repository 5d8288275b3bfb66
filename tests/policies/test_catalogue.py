"""GPU-type annotations against every GPU gpuadm knows, not only the policy's models.

A node may hold a GPU model that no class lists (an `NVIDIA A100-PCIE-40GB` beside a policy of
`NVIDIA A10` and SXM A100s). HAMi and Volcano match `use-gputype` by substring, so each class's
annotations must keep its pods off every catalogue name too. The stacks' rules are those of
`tests.device_matching`, written from their code apart from `policies.classes.models`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import pytest
import yaml

from policies import Policy, load_policy, policy_warnings
from policies.classes.catalogue import GPU_NAMES
from policies.classes.models import NOUSE_GPUTYPE, USE_GPUTYPE, hami_device_type
from tests import device_matching

Selects = Callable[[Mapping[str, str], str], bool]
# Each stack's rule and the type it registers a GPU under; HAMi in both its versions.
RULES: dict[str, list[tuple[Selects, Callable[[str], str]]]] = {
    "hami": [
        (device_matching.hami_selects, device_matching.hami_device_type),
        (device_matching.hami_selects_before_2_10, device_matching.hami_device_type),
    ],
    "volcano": [(device_matching.volcano_selects, device_matching.volcano_device_type)],
}

# A cluster's classes as an admin writes them: each lists some models of a family, and the
# catalogue holds the rest (the A100-PCIE-40GB, the H200, the L40S, ...).
REALISTIC: dict[str, tuple[str, ...]] = {
    "a10": ("NVIDIA A10",),
    "a100": ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
    "h20": ("NVIDIA H20",),
    "h100": ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL"),
    "l4": ("NVIDIA L4",),
    "l40": ("NVIDIA L40",),
    "t4": ("Tesla T4",),
    "v100": ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"),
    "rtx": ("NVIDIA RTX A6000", "NVIDIA RTX 6000 Ada Generation"),
}

# What no annotations can do under Volcano, which reads nouse-gputype only without
# use-gputype: `NVIDIA L40`'s use-entry also matches `NVIDIA L40S`, and a nouse-list alone
# cannot exclude `NVIDIA L4`, which is inside `NVIDIA L40`. gpuadm picks the use-list (the
# L4 is the policy's) and warns that the class may land on L40S GPUs.
VOLCANO_CANNOT: dict[str, set[str]] = {"l40": {"NVIDIA L40S"}}


def policy_of(classes: Mapping[str, Sequence[str]], stack: str) -> Policy:
    body = {
        name: {"backend": stack, "memory": "16Gi", "models": list(models)}
        for name, models in classes.items()
    }
    return load_policy(yaml.safe_dump({"classes": body}))


def landing(stack: str, annotations: Mapping[str, str], names: set[str]) -> set[str]:
    """Return the GPUs the stack may give a pod with these annotations, the same by every rule."""
    found = [
        {name for name in names if selects(annotations, device_type(name))}
        for selects, device_type in RULES[stack]
    ]
    assert all(one == found[0] for one in found), found
    return found[0]


def test_the_catalogue_names_each_gpu_once_in_the_driver_s_spelling() -> None:
    assert len(set(GPU_NAMES)) == len(GPU_NAMES)
    for name in GPU_NAMES:
        assert name == name.strip(), name
        assert "," not in name, name
        assert "  " not in name, name
        assert name.startswith(("NVIDIA ", "Tesla ", "Quadro ")), name


def test_the_catalogue_holds_the_names_that_hide_inside_others() -> None:
    # The pairs the review and public threads found (HAMi-core#137: H20 and H200).
    for short, long in [
        ("NVIDIA A10", "NVIDIA A100-PCIE-40GB"),
        ("NVIDIA A10", "NVIDIA A10G"),
        ("NVIDIA H20", "NVIDIA H200"),
        ("NVIDIA L4", "NVIDIA L40S"),
        ("Tesla P4", "Tesla P40"),
        ("NVIDIA H100", "NVIDIA H100 PCIe"),
    ]:
        assert {short, long} <= set(GPU_NAMES)
        assert short in long


@pytest.mark.parametrize("stack", ["hami", "volcano"])
@pytest.mark.parametrize("class_name", list(REALISTIC))
def test_each_class_lands_on_exactly_its_models_among_every_known_gpu(
    stack: str, class_name: str
) -> None:
    policy = policy_of(REALISTIC, stack)
    annotations = policy.backend_annotations(class_name)
    known = set(GPU_NAMES) | {model for models in REALISTIC.values() for model in models}
    models = set(REALISTIC[class_name])
    extra = VOLCANO_CANNOT.get(class_name, set()) if stack == "volcano" else set()
    assert landing(stack, annotations, known) == models | extra, annotations


def test_an_a10_class_keeps_off_an_a100_no_class_lists() -> None:
    # The review's case: `NVIDIA A10` is inside `NVIDIA A100-PCIE-40GB`, which no class names.
    for stack in ("hami", "volcano"):
        annotations = policy_of(REALISTIC, stack).backend_annotations("a10")
        assert "NVIDIA A100-PCIE-40GB" in annotations[NOUSE_GPUTYPE].split(",")
        assert landing(stack, annotations, {"NVIDIA A100-PCIE-40GB", "NVIDIA A10G"}) == set()


def test_h20_keeps_off_the_h200s_and_h200_off_the_h200_nvl() -> None:
    policy = policy_of({"h20": ["NVIDIA H20"], "h200": ["NVIDIA H200"]}, "hami")
    h20 = policy.backend_annotations("h20")
    assert h20[USE_GPUTYPE] == "NVIDIA H20"
    assert set(h20[NOUSE_GPUTYPE].split(",")) == {"NVIDIA H200", "NVIDIA H200 NVL"}
    assert policy.backend_annotations("h200") == {
        USE_GPUTYPE: "NVIDIA H200",
        NOUSE_GPUTYPE: "NVIDIA H200 NVL",
    }
    assert policy_warnings(policy) == []


@pytest.mark.parametrize("stack", ["hami", "volcano"])
@pytest.mark.parametrize("name", GPU_NAMES)
def test_a_class_of_any_one_gpu_gets_it_and_what_it_gets_besides_is_warned(
    stack: str, name: str
) -> None:
    policy = policy_of({"one": [name]}, stack)
    annotations = policy.backend_annotations("one")
    # No nouse-entry ever excludes the class's own model.
    assert name in landing(stack, annotations, {name})
    besides = landing(stack, annotations, set(GPU_NAMES)) - {name}
    warned = " ".join(
        w for w in policy_warnings(policy) if "may also land on GPU models it does not list" in w
    )
    for other in besides:
        assert repr(other) in warned, (name, other)
    if not besides:
        assert warned == ""


def test_a_catalogue_gpu_inside_one_of_the_class_s_own_is_warned_about_by_name() -> None:
    # `NVIDIA L4` is inside `NVIDIA L40`, which is inside `NVIDIA L40S`: no nouse-entry keeps
    # the L40 off without the L40S. The L40 is no class's, so the policy loads, with a warning.
    policy = policy_of({"ada": ["NVIDIA L4", "NVIDIA L40S"]}, "hami")
    annotations = policy.backend_annotations("ada")
    assert annotations == {USE_GPUTYPE: "NVIDIA L4,NVIDIA L40S"}
    assert policy_warnings(policy) == [
        "class ada (hami): its pods may also land on GPU models it does not list, since HAMi "
        "matches GPU types by case-insensitive substring: 'NVIDIA L40' (use-gputype entry "
        "'NVIDIA L4' matches it and excluding it would exclude 'NVIDIA L40S' too). List them "
        "in the class if they belong to it"
    ]


def test_a_volcano_class_that_cannot_be_exact_names_what_it_may_get() -> None:
    policy = policy_of(REALISTIC, "volcano")
    assert policy.backend_annotations("l40") == {USE_GPUTYPE: "NVIDIA L40"}
    warnings = [w for w in policy_warnings(policy) if w.startswith("class l40 ")]
    assert warnings == [
        "class l40 (volcano): its pods may also land on GPU models it does not list, since "
        "Volcano matches GPU types by case-insensitive substring: 'NVIDIA L40S' (use-gputype "
        "entry 'NVIDIA L40' matches it and Volcano ignores nouse-gputype beside use-gputype). "
        "List them in the class if they belong to it"
    ]


def test_nouse_entries_are_in_the_spelling_the_stacks_register() -> None:
    policy = policy_of({"p4": ["Tesla P4"]}, "hami")
    assert policy.backend_annotations("p4") == {
        USE_GPUTYPE: hami_device_type("Tesla P4"),
        NOUSE_GPUTYPE: "NVIDIA-Tesla P40",
    }
