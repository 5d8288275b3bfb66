"""GPU models: each stack's spelling, and classes that select exactly their own models.

The stacks' matching rules come from `tests.device_matching`, written from the stacks' code
apart from `policies.classes.models`: a class is exact when, under its stack's rule, the annotations
gpuadm writes keep every GPU of the class's models and no GPU of any other model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from cel_expr_python import cel
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import ConfigError, Denial, Policy, load_policy, plan, policy_warnings
from policies.classes.catalogue import GPU_NAMES
from policies.classes.models import dra_selector, gfd_product, hami_device_type, volcano_device_type
from tests import device_matching
from tests.builders import POLICY_YAML, pod
from tests.device_matching import hami_selects, volcano_selects

# Driver names (`nvidia-smi --query-gpu=name`) of GPUs found in today's clusters.
MODELS = (
    "NVIDIA A10",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100 80GB PCIe",
    "NVIDIA A100-PCIE-40GB",
    "NVIDIA H100 80GB HBM3",
    "NVIDIA H100 NVL",
    "NVIDIA L4",
    "NVIDIA L40",
    "NVIDIA L40S",
    "Tesla T4",
    "Tesla V100-SXM2-32GB",
)

# Every stack, both sizes of class, and each way to be exact: HAMi's use-list alone (a100,
# t4), HAMi's use-list with a nouse-list (l4: `NVIDIA L40` is inside `NVIDIA L40S`), Volcano's
# use-list alone (l40s, h100, v100) and Volcano's nouse-list alone (a10, whose use-list would
# also match the A100s).
PARTITION: dict[str, tuple[str, tuple[str, ...]]] = {
    "a100": (
        "hami",
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB"),
    ),
    "l4": ("hami", ("NVIDIA L4", "NVIDIA L40")),
    "t4": ("hami", ("Tesla T4",)),
    "a10": ("volcano", ("NVIDIA A10",)),
    "l40s": ("volcano", ("NVIDIA L40S",)),
    "h100": ("volcano", ("NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL")),
    "v100": ("volcano", ("Tesla V100-SXM2-32GB",)),
}

# The example of the product contract (SPEC "Policy: GPU classes"), as it is written there.
SPEC_EXAMPLE = """
domain: gpuadm.io
defaultClass: t4
exemptNamespaces: [kube-system]
classes:
  a100:
    backend: hami
    memory: 80Gi
    models: [NVIDIA A100-SXM4-80GB, NVIDIA A100 80GB PCIe]
  t4:
    backend: gpu-manager
    memory: 16Gi
    nodeSelector:
      gaia.tencent.com/gpu-model: [Tesla-T4]
  h100:
    backend: nvidia
    models: [NVIDIA H100 80GB HBM3]
  a100-mig:
    backend: mig
    memory: 80Gi
    profiles: {1g.10gb: 10Gi, 2g.20gb: 20Gi, 3g.40gb: 40Gi, 7g.80gb: 80Gi}
    nodeSelector:
      nvidia.com/mig.strategy: [mixed]
"""

Selects = Callable[[Mapping[str, str], str], bool]
RULES: dict[str, tuple[Selects, Callable[[str], str]]] = {
    "hami": (hami_selects, device_matching.hami_device_type),
    "volcano": (volcano_selects, device_matching.volcano_device_type),
}


def policy_of(classes: Mapping[str, tuple[str, Sequence[str]]], **extra: Any) -> Policy:
    """Load a policy of HAMi and Volcano classes, each listing its models."""
    body = {
        name: {"backend": backend, "memory": "16Gi", "models": list(models), **extra}
        for name, (backend, models) in classes.items()
    }
    return load_policy(yaml.safe_dump({"classes": body}))


def mutated_pod(policy: Policy, class_name: str, **spec: Any) -> tuple[dict[str, Any], Any]:
    """Plan a pod of the class, apply the patch, and check that a second plan changes nothing."""
    body = pod({f"{policy.domain}/{class_name}": "0.5"}, **spec)
    result = plan(body, policy)
    mutated = jsonpatch.apply_patch(body, result.patch)
    assert plan(mutated, policy).patch == [], "the rewrite is not idempotent"
    return mutated, result


def selected(backend: str, annotations: Mapping[str, str]) -> set[str]:
    """Return the models whose GPUs the stack may give a pod with these annotations."""
    selects, device_type = RULES[backend]
    return {model for model in MODELS if selects(annotations, device_type(model))}


def annotations_of(mutated: Mapping[str, Any]) -> dict[str, str]:
    return dict(mutated["metadata"].get("annotations") or {})


# --- each stack's spelling --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "gfd", "hami", "volcano"),
    [
        pytest.param(
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA-A100-SXM4-80GB",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA-NVIDIA A100-SXM4-80GB",
            id="nvidia-name",
        ),
        pytest.param(
            "NVIDIA A100 80GB PCIe",
            "NVIDIA-A100-80GB-PCIe",
            "NVIDIA A100 80GB PCIe",
            "NVIDIA-NVIDIA A100 80GB PCIe",
            id="spaces-become-dashes-for-gfd-only",
        ),
        pytest.param(
            "Tesla T4", "Tesla-T4", "NVIDIA-Tesla T4", "NVIDIA-Tesla T4", id="tesla-gets-prefix"
        ),
        pytest.param("NVIDIA L4", "NVIDIA-L4", "NVIDIA L4", "NVIDIA-NVIDIA L4", id="short-name"),
    ],
)
def test_each_stack_spells_the_driver_name_its_own_way(
    name: str, gfd: str, hami: str, volcano: str
) -> None:
    assert gfd_product(name) == gfd
    assert hami_device_type(name) == hami == device_matching.hami_device_type(name)
    assert volcano_device_type(name) == volcano == device_matching.volcano_device_type(name)


def test_gfd_marks_a_time_sliced_gpu_whose_resource_keeps_its_name() -> None:
    assert gfd_product("NVIDIA L4", shared=True) == "NVIDIA-L4-SHARED"


def test_dra_selector_picks_exactly_the_listed_product_names() -> None:
    assert dra_selector(["NVIDIA H100 80GB HBM3"]) == (
        'device.attributes["gpu.nvidia.com"].productName in ["NVIDIA H100 80GB HBM3"]'
    )
    env = cel.NewEnv(variables={"device": cel.Type.DYN})
    program = env.compile(dra_selector(["NVIDIA H100 80GB HBM3", 'Odd "quoted" \\ name']))
    for product, expected in [
        ("NVIDIA H100 80GB HBM3", True),
        ("NVIDIA H100 NVL", False),
        ("NVIDIA H100 80GB HBM3e", False),
        ('Odd "quoted" \\ name', True),
    ]:
        device = {"attributes": {"gpu.nvidia.com": {"productName": product}}}
        assert program.eval(data={"device": device}).value() is expected, product


# --- exact classes ------------------------------------------------------------------------------


def test_the_partition_covers_every_model_once() -> None:
    listed = [model for _, models in PARTITION.values() for model in models]
    assert sorted(listed) == sorted(MODELS)


@pytest.mark.parametrize("class_name", list(PARTITION))
def test_each_class_selects_exactly_its_own_models(class_name: str) -> None:
    policy = policy_of(PARTITION)
    backend, models = PARTITION[class_name]
    mutated, _ = mutated_pod(policy, class_name)
    annotations = annotations_of(mutated)
    assert selected(backend, annotations) == set(models)
    if backend == "volcano":
        # Should Volcano one day read nouse-gputype beside use-gputype, as HAMi does, the
        # annotations still hold: they are exact under both rules.
        volcano_types = {m: device_matching.volcano_device_type(m) for m in MODELS}
        under_hami_rule = {m for m, t in volcano_types.items() if hami_selects(annotations, t)}
        assert under_hami_rule == set(models)


@pytest.mark.parametrize(
    ("class_name", "expected"),
    [
        pytest.param(
            "a100",
            {
                "nvidia.com/use-gputype": (
                    "NVIDIA A100-SXM4-80GB,NVIDIA A100 80GB PCIe,NVIDIA A100-PCIE-40GB"
                )
            },
            id="hami-use-list-alone",
        ),
        pytest.param(
            "l4",
            {
                "nvidia.com/use-gputype": "NVIDIA L4,NVIDIA L40",
                "nvidia.com/nouse-gputype": "NVIDIA L40S",
            },
            id="hami-nouse-names-what-the-use-list-also-matches",
        ),
        pytest.param("t4", {"nvidia.com/use-gputype": "NVIDIA-Tesla T4"}, id="hami-tesla"),
        pytest.param(
            "a10",
            {
                "nvidia.com/nouse-gputype": ",".join(
                    hami_device_type(m) for m in {*MODELS, *GPU_NAMES} if m != "NVIDIA A10"
                )
            },
            id="volcano-nouse-alone-where-use-would-match-more",
        ),
        pytest.param("l40s", {"nvidia.com/use-gputype": "NVIDIA L40S"}, id="volcano-use-alone"),
    ],
)
def test_what_each_class_writes(class_name: str, expected: dict[str, str]) -> None:
    policy = policy_of(PARTITION)
    annotations = annotations_of(mutated_pod(policy, class_name)[0])
    written = {k: set(v.split(",")) for k, v in annotations.items() if k.startswith("nvidia.com/")}
    assert written == {k: set(v.split(",")) for k, v in expected.items()}


def impossible(classes: Mapping[str, tuple[str, Sequence[str]]]) -> bool:
    """Tell, from the stacks' rules alone, whether some class can select exactly its models.

    Any entry that selects a model m is a substring of m's type; any entry that rejects a
    model o is a substring of o's type. So under HAMi's rule a class cannot be exact when
    type(m) is inside type(o) and type(o) inside type(m') for models m, m' of the class and o
    of another: no use-entry avoids o, no nouse-entry rejects o and keeps m'. Under Volcano's,
    a use-list cannot be exact when some type(m) is inside a type(o), nor a nouse-list alone
    when some type(o) is inside a type(m').
    """
    for name, (backend, models) in classes.items():
        device_type = RULES[backend][1]
        own = [device_type(m).upper() for m in models]
        foreign = [
            device_type(o).upper()
            for other, (_, others) in classes.items()
            if other != name
            for o in others
        ]
        use_fails = any(m in o for m in own for o in foreign)
        nouse_fails = any(o in m for o in foreign for m in own)
        if backend == "hami" and any(
            m in o and o in m2 for m in own for o in foreign for m2 in own
        ):
            return True
        if backend == "volcano" and use_fails and nouse_fails:
            return True
    return False


@st.composite
def partitions(draw: st.DrawFn) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Draw a partition of MODELS into classes, each served by HAMi or Volcano."""
    count = draw(st.integers(min_value=1, max_value=6))
    owner = draw(st.lists(st.integers(0, count - 1), min_size=len(MODELS), max_size=len(MODELS)))
    classes = {}
    for index in sorted(set(owner)):
        backend = draw(st.sampled_from(["hami", "volcano"]))
        models = tuple(m for m, o in zip(MODELS, owner, strict=True) if o == index)
        classes[f"c{index}"] = (backend, models)
    return classes


@settings(max_examples=300)
@given(partitions())
def test_every_partition_is_exact_or_refused_because_it_cannot_be(
    classes: dict[str, tuple[str, tuple[str, ...]]],
) -> None:
    if impossible(classes):
        with pytest.raises(ConfigError, match="cannot be held to exactly its models"):
            policy_of(classes)
        return
    policy = policy_of(classes)
    for name, (backend, models) in classes.items():
        annotations = annotations_of(mutated_pod(policy, name)[0])
        assert selected(backend, annotations) == set(models), (name, annotations)


@pytest.mark.parametrize(
    ("classes", "named"),
    [
        pytest.param(
            {"l4": ("hami", ["NVIDIA L4", "NVIDIA L40S"]), "l40": ("hami", ["NVIDIA L40"])},
            ["'l4'", "'l40'", "'NVIDIA L40'", "'NVIDIA L40S'"],
            id="hami-model-to-exclude-is-inside-one-of-the-class",
        ),
        pytest.param(
            {
                "l40": ("volcano", ["NVIDIA L40"]),
                "l40s": ("hami", ["NVIDIA L40S"]),
                "l4": ("hami", ["NVIDIA L4"]),
            },
            ["'l40'", "'l4'", "'NVIDIA L4'", "'NVIDIA L40S'", "Volcano ignores nouse-gputype"],
            id="volcano-can-neither-use-nor-nouse",
        ),
    ],
)
def test_a_policy_that_cannot_be_exact_is_refused_naming_both_classes_and_models(
    classes: dict[str, tuple[str, list[str]]], named: list[str]
) -> None:
    with pytest.raises(ConfigError) as error:
        policy_of(classes)
    message = "; ".join(error.value.problems)
    assert "policy.yaml:1: classes: class" in message
    for part in named:
        assert part in message


def test_models_of_every_backend_are_kept_off() -> None:
    policy = load_policy(
        "classes:\n"
        "  a10: {backend: hami, memory: 24Gi, models: [NVIDIA A10]}\n"
        "  a100: {backend: nvidia, models: [NVIDIA A100-SXM4-80GB]}\n"
    )
    annotations = policy.backend_annotations("a10")
    assert annotations["nvidia.com/use-gputype"] == "NVIDIA A10"
    # The other class's model first, then every catalogue name that `NVIDIA A10` is inside.
    nouse = annotations["nvidia.com/nouse-gputype"].split(",")
    assert nouse[0] == "NVIDIA A100-SXM4-80GB"
    assert set(nouse) == {n for n in GPU_NAMES if "NVIDIA A10" in n and n != "NVIDIA A10"}


def test_a_model_two_classes_share_is_not_excluded_from_either() -> None:
    policy = load_policy(
        "classes:\n"
        "  a100: {backend: hami, memory: 80Gi, models: [NVIDIA A100-SXM4-80GB]}\n"
        "  a100-mig:\n"
        "    backend: mig\n    memory: 80Gi\n    profiles: {1g.10gb: 10Gi}\n"
        "    models: [NVIDIA A100-SXM4-80GB]\n"
        "    nodeSelector: {nvidia.com/mig.strategy: [mixed]}\n"
    )
    assert policy.backend_annotations("a100") == {"nvidia.com/use-gputype": "NVIDIA A100-SXM4-80GB"}


# --- node affinity ------------------------------------------------------------------------------


def required_terms(mutated: Mapping[str, Any]) -> list[Any]:
    affinity = mutated["spec"]["affinity"]["nodeAffinity"]
    terms: list[Any] = affinity["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


def product_in(*values: str) -> dict[str, Any]:
    return {"key": "nvidia.com/gpu.product", "operator": "In", "values": list(values)}


def test_models_become_a_node_affinity_in_gfd_spelling() -> None:
    policy = policy_of(PARTITION)
    mutated, _ = mutated_pod(policy, "a100")
    expected = product_in("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe", "NVIDIA-A100-PCIE-40GB")
    assert required_terms(mutated) == [{"matchExpressions": [expected]}]


def test_the_models_affinity_is_anded_into_every_term_beside_the_node_selector() -> None:
    policy = load_policy(
        "classes:\n  h100:\n    backend: nvidia\n    models: [NVIDIA H100 80GB HBM3]\n"
        "    nodeSelector: {pool: [gpu]}\n"
    )
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    rack = {"key": "rack", "operator": "In", "values": ["r1"]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchExpressions": [rack]}]
            }
        }
    }
    body = pod({"gpuadm.io/h100": "1"}, affinity=affinity)
    mutated = jsonpatch.apply_patch(body, plan(body, policy).patch)
    assert plan(mutated, policy).patch == []
    h100 = product_in("NVIDIA-H100-80GB-HBM3")
    pool = {"key": "pool", "operator": "In", "values": ["gpu"]}
    assert required_terms(mutated) == [
        {"matchExpressions": [zone, h100, pool]},
        {"matchExpressions": [rack, h100, pool]},
    ]


def test_a_node_selector_on_the_product_label_wins_over_models() -> None:
    policy = load_policy(
        "classes:\n  a100:\n    backend: hami\n    memory: 80Gi\n"
        "    models: [NVIDIA A100-SXM4-80GB]\n"
        "    nodeSelector: {nvidia.com/gpu.product: [A100-Custom-Label]}\n"
    )
    mutated, _ = mutated_pod(policy, "a100")
    assert required_terms(mutated) == [{"matchExpressions": [product_in("A100-Custom-Label")]}]
    assert annotations_of(mutated)["nvidia.com/use-gputype"] == "NVIDIA A100-SXM4-80GB"


@pytest.mark.parametrize(
    ("resource", "product"),
    [
        pytest.param("nvidia.com/gpu.shared", "NVIDIA-L4", id="renamed-resource"),
        pytest.param("nvidia.com/gpu", "NVIDIA-L4-SHARED", id="resource-keeps-its-name"),
    ],
)
def test_time_slicing_models_follow_gfd_sharing_suffix(resource: str, product: str) -> None:
    policy = load_policy(
        f"classes:\n  l4:\n    backend: time-slicing\n    resource: {resource}\n"
        "    models: [NVIDIA L4]\n"
    )
    assert policy.classes["l4"].node_expressions == [product_in(product)]


def test_the_old_node_selector_form_still_places_pods() -> None:
    policy = load_policy(POLICY_YAML)
    mutated, _ = mutated_pod(policy, "l4")
    assert required_terms(mutated) == [{"matchExpressions": [product_in("NVIDIA-L4")]}]


# --- what the policy accepts ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("class_yaml", "expected"),
    [
        pytest.param(
            "{backend: hami, memory: 80Gi, models: [NVIDIA A100-SXM4-80GB], gpuTypes: [A100]}",
            "set `models` (gpuadm derives use-gputype and nouse-gputype from them) or `gpuTypes`",
            id="models-and-gpu-types-together",
        ),
        pytest.param(
            "{backend: nvidia, models: []}", "`models` lists no GPU model", id="empty-models"
        ),
        pytest.param(
            "{backend: nvidia, models: [NVIDIA L4, NVIDIA L4]}",
            "`models` lists a model twice",
            id="model-twice",
        ),
        pytest.param(
            "{backend: nvidia, models: ['NVIDIA L4,NVIDIA L40']}",
            "is not a GPU name",
            id="comma-in-a-name",
        ),
        pytest.param(
            "{backend: nvidia, models: [' NVIDIA L4']}", "is not a GPU name", id="padded-name"
        ),
        pytest.param(
            "{backend: nvidia, models: [NVIDIA RTX (Laptop)]}",
            "would be labelled nvidia.com/gpu.product=NVIDIA-RTX-(Laptop), which is not a "
            "valid label value",
            id="no-valid-gfd-label",
        ),
        pytest.param(
            "{backend: volcano, memory: 24Gi, gpuTypes: ['']}",
            "is not a GPU name",
            id="empty-gpu-type",
        ),
    ],
)
def test_model_lists_that_cannot_work_are_refused(class_yaml: str, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_policy(f"classes:\n  a:\n    {class_yaml}\n")
    assert any(expected in problem for problem in error.value.problems), error.value.problems


def test_gpu_types_are_written_as_they_are() -> None:
    policy = load_policy(
        "classes:\n  a:\n    backend: volcano\n    memory: 24Gi\n    gpuTypes: [A10-custom]\n"
    )
    assert policy.backend_annotations("a") == {"nvidia.com/use-gputype": "A10-custom"}


def test_gpu_types_that_match_another_class_s_models_are_refused() -> None:
    with pytest.raises(ConfigError, match="GPU type 'A10' is a substring of 'NVIDIA A100"):
        load_policy(
            "classes:\n"
            "  a10: {backend: hami, memory: 24Gi, gpuTypes: [A10]}\n"
            "  a100: {backend: hami, memory: 80Gi, models: [NVIDIA A100-SXM4-80GB]}\n"
        )


# --- the example policies ------------------------------------------------------------------------


def test_the_spec_example_loads_and_writes_each_stack_s_spelling() -> None:
    policy = load_policy(SPEC_EXAMPLE)
    assert policy_warnings(policy) == []
    a100, _ = mutated_pod(policy, "a100")
    assert annotations_of(a100)["nvidia.com/use-gputype"] == (
        "NVIDIA A100-SXM4-80GB,NVIDIA A100 80GB PCIe"
    )
    assert "nvidia.com/nouse-gputype" not in annotations_of(a100)
    assert required_terms(a100) == [
        {"matchExpressions": [product_in("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe")]}
    ]
    body = pod({"gpuadm.io/h100": "1"})
    h100 = jsonpatch.apply_patch(body, plan(body, policy).patch)
    assert required_terms(h100) == [{"matchExpressions": [product_in("NVIDIA-H100-80GB-HBM3")]}]
    assert "nvidia.com/use-gputype" not in annotations_of(h100)


def test_the_bundled_example_is_the_spec_example_with_the_gpu_stacks_exempt() -> None:
    """The install's default policy is the spec's example, exempting besides kube-system the
    GPU stacks' own namespaces and gpuadm's (docs/deploy.md#exempt-namespaces)."""
    root = Path(__file__).resolve().parents[2]
    bundled = yaml.safe_load((root / "examples/policy.yaml").read_text())
    spec = yaml.safe_load(SPEC_EXAMPLE)
    exempt = bundled.pop("exemptNamespaces")
    assert exempt[: len(spec["exemptNamespaces"])] == spec.pop("exemptNamespaces")
    assert bundled == spec


# --- warnings ------------------------------------------------------------------------------------


def test_warnings_name_classes_not_held_to_a_gpu_model() -> None:
    policy = load_policy(
        "classes:\n"
        "  any: {backend: hami, memory: 80Gi}\n"
        "  old:\n    backend: volcano\n    memory: 24Gi\n"
        "    nodeSelector: {nvidia.com/gpu.product: [NVIDIA-A10]}\n"
        "  typed: {backend: hami, memory: 16Gi, gpuTypes: [NVIDIA-Tesla T4]}\n"
        "  h100: {backend: nvidia}\n"
    )
    warnings = policy_warnings(policy)
    assert len(warnings) == 2
    assert warnings[0].startswith("class any (hami) lists neither `models` nor `gpuTypes`")
    assert "its pods may land on any GPU model;" in warnings[0]
    assert warnings[1].startswith("class old (volcano) lists neither")
    assert "volcano does not read node labels when it picks a GPU" in warnings[1]


def test_a_volcano_class_on_nouse_alone_is_warned_about(policy: Policy) -> None:
    assert policy_warnings(policy) == [
        "class a10 (volcano): Volcano ignores nouse-gputype whenever use-gputype is set, and "
        "use-gputype would also match other GPU models, so the class's pods get nouse-gputype "
        "alone, naming every other GPU model gpuadm knows (the policy's and its "
        "catalogue's): they may also land on a GPU model that gpuadm does not know",
        # The test policy's A10 is the round 24Gi, not the 23028Mi the hardware reports.
        "class a10: memory 24Gi is more than NVIDIA A10 has (23028Mi, as NVML reports it and "
        "the stacks count it): shares are sized from it, so two halves (12Gi each) never "
        "share one such GPU; write `memory: 23028Mi`",
    ]


# --- annotations that only gpuadm writes -----------------------------------------------------


def test_a_brought_annotation_the_class_writes_is_replaced_and_the_user_told() -> None:
    policy = policy_of(PARTITION)
    body = pod({"gpuadm.io/a100": "1"}, annotations={"nvidia.com/use-gputype": "H100"})
    result = plan(body, policy)
    mutated = jsonpatch.apply_patch(body, result.patch)
    assert annotations_of(mutated)["nvidia.com/use-gputype"].startswith("NVIDIA A100-SXM4-80GB")
    assert any(
        "annotation nvidia.com/use-gputype: 'H100' replaced by" in w for w in result.warnings
    )
    assert plan(mutated, policy).patch == []


@pytest.mark.parametrize(
    ("class_name", "key"),
    [
        pytest.param("a100", "nvidia.com/nouse-gputype", id="nouse-where-the-class-writes-none"),
        pytest.param("a10", "nvidia.com/use-gputype", id="use-on-volcano-nouse-alone"),
        pytest.param("a100", "nvidia.com/use-gpuuuid", id="gpu-by-uuid"),
        pytest.param("a100", "nvidia.com/nouse-gpuuuid", id="gpu-not-by-uuid"),
        pytest.param("a100", "nvidia.com/vgpu-mode", id="hami-mode"),
        pytest.param("h100", "volcano.sh/vgpu-mode", id="volcano-mode"),
    ],
)
def test_a_brought_annotation_the_class_does_not_write_is_refused(
    class_name: str, key: str
) -> None:
    policy = policy_of(PARTITION)
    body = pod({f"gpuadm.io/{class_name}": "1"}, annotations={key: "anything"})
    with pytest.raises(Denial) as denial:
        plan(body, policy)
    assert f"annotation {key} chooses the devices" in denial.value.message
    assert f"class {class_name} does not set it: remove it" in denial.value.message


def test_a_pod_without_gpus_may_carry_them_since_it_can_never_get_a_gpu() -> None:
    # Extended resources cannot be added to an existing pod, so the annotation steers nothing.
    policy = policy_of(PARTITION)
    body = pod({"cpu": "1"}, annotations={"nvidia.com/use-gputype": "NVIDIA A100"})
    result = plan(body, policy)
    assert result.patch == []
    assert result.class_name is None
