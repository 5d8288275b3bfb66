"""The dra backend: whole GPUs through ResourceClaimTemplates that gpuadm names and keeps."""

from __future__ import annotations

import copy
import hashlib
import json
from fractions import Fraction
from typing import Any

import jsonpatch
import pytest
import yaml

from policies import (
    ConfigError,
    Denial,
    Plan,
    Policy,
    check_added_containers,
    load_policy,
    plan,
    pod_charge,
)
from policies.classes.backends.dra import DraClass
from policies.pods.dra_templates import (
    ClaimTemplate,
    Held,
    TemplateName,
    entry_name,
    is_entry_name,
    parse_template_name,
)
from tests.apiserver_rules import violations
from tests.builders import POLICY_YAML, container, pod

PRODUCT_SELECTOR = 'device.attributes["gpu.nvidia.com"].productName in ["NVIDIA B200"]'
MEMORY_SELECTOR = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("180Gi")) >= 0'
# Two dra classes beside the one class per backend of the shared test policy: b200 picks its
# model and adds a selector of its own; any-gpu takes any device of the DeviceClass.
DRA_CLASSES = f"""
  b200:
    backend: dra
    models: [NVIDIA B200]
    selectors:
      - '{MEMORY_SELECTOR}'
  any-gpu:
    backend: dra
"""
DRA_POLICY = load_policy(POLICY_YAML + DRA_CLASSES)
DRA_ANNOTATIONS = {"gpuadm.io/class": "b200"}
# A template name of gpuadm's whose digest no policy writes: a pod stored under an older one.
STALE_DIGEST = "0123456789"


def dra_class(policy: Policy, name: str) -> DraClass:
    gpu_class = policy.classes[name]
    assert isinstance(gpu_class, DraClass)
    return gpu_class


def template_of(count: int, class_name: str = "b200", policy: Policy = DRA_POLICY) -> ClaimTemplate:
    template = dra_class(policy, class_name).claim_template(class_name, Held(count))
    assert template is not None
    return template


def b200_spec(count: int) -> dict[str, Any]:
    """Return the ResourceClaimSpec the b200 class must write, as the contract gives it."""
    selectors = [{"cel": {"expression": e}} for e in (PRODUCT_SELECTOR, MEMORY_SELECTOR)]
    exactly = {
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": count,
        "selectors": selectors,
    }
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def digest_of(spec: dict[str, Any]) -> str:
    """Return the first ten hex digits of the SHA-256 of a spec as canonical JSON."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def with_claims(c: dict[str, Any], *names: str) -> dict[str, Any]:
    """Return the container listing the `spec.resourceClaims` entries `names`."""
    c["resources"]["claims"] = [{"name": name} for name in names]
    return c


def entry(name: str, template: str) -> dict[str, str]:
    return {"name": name, "resourceClaimTemplateName": template}


def stored_pod(
    template: str,
    *,
    limits: dict[str, Any] | None = None,
    annotations: dict[str, str] = DRA_ANNOTATIONS,
    extra: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Return a pod as gpuadm stores it: its container holds `template` under gpuadm-c0."""
    body = pod(annotations=annotations, resourceClaims=[entry("gpuadm-c0", template)])
    main = with_claims(container("main", limits or {}), "gpuadm-c0")
    body["spec"]["containers"] = [main, *(extra or [])]
    return body


def apply(
    body: dict[str, Any], policy: Policy = DRA_POLICY, **kwargs: Any
) -> tuple[dict[str, Any], Plan]:
    """Plan, apply the patch, and check the result is a valid fixed point of the rewrite."""
    result = plan(body, policy, **kwargs)
    mutated = jsonpatch.apply_patch(body, result.patch)
    assert violations(mutated, policy.domain) == []
    again = plan(mutated, policy, **kwargs)
    assert again.patch == [], "the rewrite is not idempotent"
    assert (again.class_name, again.charge) == (result.class_name, result.charge)
    assert again.claim_templates == result.claim_templates
    assert pod_charge(mutated, policy, **kwargs) == (result.class_name, result.charge)
    return mutated, result


# The policy --------------------------------------------------------------------------------


def test_a_dra_class_loads_with_nvidias_device_class_and_driver() -> None:
    b200 = dra_class(DRA_POLICY, "b200")
    assert b200.backend_name() == "dra"
    assert b200.device_class_name == "gpu.nvidia.com"
    assert b200.driver == "gpu.nvidia.com"
    assert b200.selectors == [MEMORY_SELECTOR]
    assert dra_class(DRA_POLICY, "any-gpu").selectors == []
    # Its GPUs come through claims: no extended resource but the DeviceClass's own (DRA
    # extended resources), and no node affinity from `models`.
    assert b200.resource_names() == {"deviceclass.resource.kubernetes.io/gpu.nvidia.com"}
    assert b200.node_expressions == []
    assert b200.scheduler is None
    assert DRA_POLICY.gpu_device_class_names == {"gpu.nvidia.com", "mig.nvidia.com"}


def test_a_dra_class_takes_its_own_device_class_and_driver() -> None:
    policy = load_policy(
        "classes:\n"
        "  mi300:\n"
        "    backend: dra\n"
        "    deviceClassName: gpu.amd.com\n"
        "    driver: gpu.amd.com\n"
        "    models: [AMD Instinct MI300X]\n"
    )
    template = template_of(4, "mi300", policy)
    exactly = template.spec["devices"]["requests"][0]["exactly"]
    assert exactly == {
        "deviceClassName": "gpu.amd.com",
        "allocationMode": "ExactCount",
        "count": 4,
        "selectors": [
            {
                "cel": {
                    "expression": 'device.attributes["gpu.amd.com"].productName in '
                    '["AMD Instinct MI300X"]'
                }
            }
        ],
    }
    assert policy.gpu_device_class_names == {"gpu.nvidia.com", "mig.nvidia.com", "gpu.amd.com"}


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        pytest.param(
            "deviceClassName: GPU.nvidia.com",
            "policy.yaml:4: classes.g.deviceClassName: 'GPU.nvidia.com' is not a DNS subdomain",
            id="device-class-in-capitals",
        ),
        pytest.param(
            "deviceClassName: gpu..nvidia.com",
            "policy.yaml:4: classes.g.deviceClassName: 'gpu..nvidia.com' is not a DNS subdomain",
            id="device-class-with-an-empty-label",
        ),
        pytest.param(
            "deviceClassName: gpu_nvidia",
            "policy.yaml:4: classes.g.deviceClassName: 'gpu_nvidia' is not a DNS subdomain",
            id="device-class-with-an-underscore",
        ),
        pytest.param(
            "driver: ''",
            "policy.yaml:4: classes.g.driver: '' is not a DNS subdomain",
            id="empty-driver",
        ),
        pytest.param(
            "driver: -gpu.nvidia.com",
            "policy.yaml:4: classes.g.driver: '-gpu.nvidia.com' is not a DNS subdomain",
            id="driver-starting-with-a-dash",
        ),
        pytest.param(
            f"driver: {'a' * 254}",
            f"policy.yaml:4: classes.g.driver: '{'a' * 254}' is not a DNS subdomain",
            id="driver-longer-than-253",
        ),
        pytest.param(
            "selectors: ['   ']",
            "policy.yaml:4: classes.g.selectors: a selector is an empty CEL expression",
            id="blank-selector",
        ),
        pytest.param(
            "selectors: ['device.driver == \"gpu.nvidia.com\"', '']",
            "policy.yaml:4: classes.g.selectors: a selector is an empty CEL expression",
            id="empty-selector-after-a-good-one",
        ),
        pytest.param(
            "deviceClass: gpu.nvidia.com",
            "policy.yaml:4: classes.g.deviceClass: `deviceClass` is not a key of a dra class; "
            "did you mean `deviceClassName`?",
            id="misspelt-key",
        ),
    ],
)
def test_an_invalid_dra_class_is_refused(key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_policy(f"classes:\n  g:\n    backend: dra\n    {key}\n")
    assert len(error.value.problems) == 1
    assert error.value.problems[0].startswith(expected)


# The rewrite -------------------------------------------------------------------------------


def test_a_dra_ask_becomes_gpuadms_claim_in_the_container() -> None:
    body = pod({"gpuadm.io/b200": "2", "cpu": "1"})
    template = template_of(2)
    mutated, result = apply(body)
    assert result.patch == [
        {
            "op": "add",
            "path": "/spec/containers/0/resources",
            "value": {
                "limits": {"cpu": "1"},
                "requests": {"cpu": "1"},
                "claims": [{"name": "gpuadm-c0"}],
            },
        },
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {"gpuadm.io/class": "b200", "gpuadm.io/demand": "b200=2"},
        },
        {"op": "add", "path": "/metadata/labels", "value": {"gpuadm.io/class": "b200"}},
        {
            "op": "add",
            "path": "/spec/resourceClaims",
            "value": [{"name": "gpuadm-c0", "resourceClaimTemplateName": template.name}],
        },
    ]
    assert (result.class_name, result.charge, result.demand) == ("b200", Fraction(2), "b200=2")
    assert result.warnings == ()
    assert result.claim_templates == (template,)
    # No scheduler, affinity or toleration: the claim's selector picks the GPU model.
    assert set(mutated["spec"]) == {"containers", "resourceClaims"}


def test_the_template_requests_exactly_the_count_of_the_classs_devices() -> None:
    (template,) = plan(pod({"gpuadm.io/b200": "2"}), DRA_POLICY).claim_templates
    assert template.class_name == "b200"
    assert template.held == Held(2)
    assert template.spec == b200_spec(2)
    assert template.name == f"gpuadm-b200-2-{digest_of(b200_spec(2))}"
    assert parse_template_name(template.name) == TemplateName("b200", Held(2))


def test_a_dra_class_without_models_or_selectors_asks_for_any_device_of_its_class() -> None:
    (template,) = plan(pod({"gpuadm.io/any-gpu": "1"}), DRA_POLICY).claim_templates
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.nvidia.com",
                        "allocationMode": "ExactCount",
                        "count": 1,
                    },
                }
            ]
        }
    }
    assert template.spec == spec
    assert template.name == f"gpuadm-any-gpu-1-{digest_of(spec)}"
    assert parse_template_name(template.name) == TemplateName("any-gpu", Held(1))


def test_the_template_manifest_is_a_resource_claim_template_of_the_namespace() -> None:
    template = template_of(3)
    labels = {"app.kubernetes.io/managed-by": "gpuadm"}
    manifest = template.manifest("team-x", labels=labels)
    assert manifest == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template.name, "namespace": "team-x", "labels": labels},
        "spec": {"spec": b200_spec(3)},
    }
    assert manifest["metadata"]["labels"] is not labels


@pytest.mark.parametrize(
    ("body", "namespace_default"),
    [
        pytest.param(
            pod({"nvidia.com/gpu": "1"}, annotations=DRA_ANNOTATIONS), None, id="annotated"
        ),
        pytest.param(pod({"nvidia.com/gpu": "1"}), "b200", id="namespace-default-class"),
    ],
)
def test_an_untyped_gpu_count_of_a_dra_class_becomes_a_claim(
    body: dict[str, Any], namespace_default: str | None
) -> None:
    mutated, result = apply(body, namespace_default_class=namespace_default)
    assert mutated["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpuadm-c0"}]}
    assert mutated["spec"]["resourceClaims"] == [entry("gpuadm-c0", template_of(1).name)]
    assert (result.class_name, result.charge) == ("b200", Fraction(1))


def test_each_container_gets_its_own_entry_init_containers_by_their_index() -> None:
    sidecar = container("proxy", {"gpuadm.io/b200": "1"}, restartPolicy="Always")
    body = pod(
        {"gpuadm.io/b200": "2"},
        init=[container("setup", {"gpuadm.io/b200": "1"}), container("fetch", {}), sidecar],
        extra=[container("plain", {"cpu": "1"}), container("second", {"gpuadm.io/b200": "4"})],
    )
    mutated, result = apply(body)
    spec = mutated["spec"]
    claims = [
        [claim["name"] for claim in c["resources"].get("claims", ())]
        for c in (*spec["initContainers"], *spec["containers"])
    ]
    assert claims == [["gpuadm-i0"], [], ["gpuadm-i2"], ["gpuadm-c0"], [], ["gpuadm-c2"]]
    # Init containers first, each list in order, as the containers are read.
    assert spec["resourceClaims"] == [
        entry("gpuadm-i0", template_of(1).name),
        entry("gpuadm-i2", template_of(1).name),
        entry("gpuadm-c0", template_of(2).name),
        entry("gpuadm-c2", template_of(4).name),
    ]
    assert {t.name for t in result.claim_templates} == {template_of(n).name for n in (1, 2, 4)}
    assert result.charge == 1 + 1 + 2 + 4


@pytest.mark.parametrize(
    ("init", "app", "dra_charge", "nvidia_charge"),
    [
        pytest.param(["2"], ["1"], 3, 2, id="init-larger-than-app"),
        pytest.param(["1"], ["3"], 4, 3, id="app-larger-than-init"),
        pytest.param(["2", "2"], ["1"], 5, 2, id="two-init-steps"),
        pytest.param(["1"], ["1", "2"], 4, 3, id="two-app-containers"),
        pytest.param([], ["1", "2"], 3, 3, id="no-init-container"),
    ],
)
def test_a_dra_pod_is_charged_the_sum_of_every_containers_devices(
    init: list[str], app: list[str], dra_charge: int, nvidia_charge: int
) -> None:
    # The claims of init containers are allocated at scheduling and held for the pod's life;
    # a device plugin's GPUs go back when the init container ends (the effective request).
    def shaped(class_name: str) -> dict[str, Any]:
        key = f"gpuadm.io/{class_name}"
        return pod(
            {key: app[0]},
            init=[container(f"init{i}", {key: count}) for i, count in enumerate(init)],
            extra=[container(f"app{i}", {key: count}) for i, count in enumerate(app[1:])],
        )

    _, dra = apply(shaped("b200"))
    assert dra.charge == dra_charge
    assert dra.demand == f"b200={dra_charge}"
    _, nvidia = apply(shaped("h100"), DRA_POLICY)
    assert nvidia.charge == nvidia_charge
    assert pod_charge(shaped("b200"), DRA_POLICY) == ("b200", Fraction(dra_charge))
    assert pod_charge(shaped("h100"), DRA_POLICY) == ("h100", Fraction(nvidia_charge))


def test_the_pods_own_claims_stay_in_their_order_before_gpuadms() -> None:
    own = [
        {"name": "nic", "resourceClaimTemplateName": "rdma-nic"},
        {"name": "scratch", "resourceClaimName": "fast-disk"},
    ]
    main = with_claims(container("main", {"gpuadm.io/b200": "1"}), "nic", "scratch")
    body = pod(resourceClaims=[dict(e) for e in own])
    body["spec"]["containers"] = [main]
    mutated, _ = apply(body)
    assert mutated["spec"]["resourceClaims"] == [*own, entry("gpuadm-c0", template_of(1).name)]
    assert mutated["spec"]["containers"][0]["resources"]["claims"] == [
        {"name": "nic"},
        {"name": "scratch"},
        {"name": "gpuadm-c0"},
    ]


def test_gpuadms_entry_moves_after_the_pods_own() -> None:
    template = template_of(1).name
    own = {"name": "nic", "resourceClaimTemplateName": "rdma-nic"}
    body = stored_pod(template)
    body["metadata"]["annotations"] = {"gpuadm.io/class": "b200", "gpuadm.io/demand": "b200=1"}
    body["metadata"]["labels"] = {"gpuadm.io/class": "b200"}
    body["spec"]["resourceClaims"] = [entry("gpuadm-c0", template), own]
    assert plan(body, DRA_POLICY).patch == [
        {"op": "add", "path": "/spec/resourceClaims", "value": [own, entry("gpuadm-c0", template)]}
    ]


def test_an_entry_of_gpuadms_that_no_container_lists_is_denied() -> None:
    # gpuadm-c1 names a template of gpuadm's, but no container lists it: the scheduler would
    # still allocate its devices, so the pod would hold GPUs that no container asks for.
    for limits in ({"gpuadm.io/b200": "1"}, {"cpu": "1"}):
        body = pod(limits, resourceClaims=[entry("gpuadm-c1", template_of(2).name)])
        for judge in (plan, pod_charge):
            with pytest.raises(Denial) as denied:
                judge(body, DRA_POLICY)
            assert denied.value.message == (
                f"spec.resourceClaims 'gpuadm-c1' names ResourceClaimTemplate "
                f"{template_of(2).name} of gpuadm's, which no container lists; ask for "
                "gpuadm.io/<class> in the container instead"
            )


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        pytest.param(
            {"gpuadm.io/b200": "0.5"},
            'container "main" asks for a share of 0.5, but the class gives whole GPUs only: '
            "it sets no `sharing`",
            id="share",
        ),
        pytest.param(
            {"gpuadm.io/b200": "250m"},
            'container "main" asks for a share of 0.25, but the class gives whole GPUs only: '
            "it sets no `sharing`",
            id="share-in-millis",
        ),
        pytest.param(
            {"gpuadm.io/b200-memory": "10Gi"},
            'container "main" asks for 10Gi of GPU memory, but the class gives whole GPUs only: '
            "it sets no `sharing`",
            id="memory",
        ),
    ],
)
def test_a_share_of_a_dra_gpu_is_denied(limits: dict[str, str], message: str) -> None:
    for reader in (plan, pod_charge):
        with pytest.raises(Denial) as denied:
            reader(pod(limits), DRA_POLICY)
        assert denied.value.message.startswith(message)
        assert denied.value.message.endswith("; ask for 1 or more (class b200)")


def test_a_memory_cap_on_whole_dra_gpus_is_dropped_with_a_warning() -> None:
    mutated, result = apply(pod({"gpuadm.io/b200": "1", "gpuadm.io/b200-memory": "40Gi"}))
    assert result.warnings == ("backend dra cannot cap GPU memory: the memory request is ignored",)
    assert mutated["spec"]["containers"][0]["resources"] == {"claims": [{"name": "gpuadm-c0"}]}
    assert result.charge == 1


def test_a_claim_holds_at_most_32_devices() -> None:
    _, result = apply(pod({"gpuadm.io/b200": "32"}))
    assert result.charge == 32
    assert result.claim_templates == (template_of(32),)
    with pytest.raises(Denial) as denied:
        plan(pod({"gpuadm.io/b200": "33"}), DRA_POLICY)
    assert denied.value.message == (
        'container "main" asks for 33 GPUs; a claim holds at most 32 devices (class b200)'
    )


# Template names ----------------------------------------------------------------------------

BASE_B200 = {"backend": "dra", "models": ["NVIDIA B200"]}


@pytest.mark.parametrize(
    ("classes", "same"),
    [
        pytest.param({"b200": BASE_B200}, True, id="same-policy-loaded-again"),
        pytest.param(
            {"b200": BASE_B200, "h100": {"backend": "nvidia"}}, True, id="another-class-added"
        ),
        pytest.param(
            {"b200": {**BASE_B200, "nodeSelector": {"pool": ["gpu"]}}},
            True,
            id="node-selector-is-not-in-the-template",
        ),
        pytest.param(
            {"b200": {**BASE_B200, "deviceClassName": "gpu.nvidia.com"}},
            True,
            id="default-device-class-written-out",
        ),
        pytest.param(
            {"b200": {**BASE_B200, "models": ["NVIDIA B200", "NVIDIA B300"]}},
            False,
            id="model-added",
        ),
        pytest.param(
            {"b200": {**BASE_B200, "models": ["NVIDIA B300"]}}, False, id="model-replaced"
        ),
        pytest.param(
            {"b200": {**BASE_B200, "selectors": [MEMORY_SELECTOR]}}, False, id="selector-added"
        ),
        pytest.param(
            {"b200": {**BASE_B200, "deviceClassName": "gpu.example.com"}},
            False,
            id="device-class-changed",
        ),
        pytest.param(
            {"b200": {**BASE_B200, "driver": "gpu.example.com"}}, False, id="driver-changed"
        ),
    ],
)
def test_the_template_name_changes_with_what_the_template_selects(
    classes: dict[str, Any], same: bool
) -> None:
    before = load_policy(yaml.safe_dump({"classes": {"b200": BASE_B200}}))
    after = load_policy(yaml.safe_dump({"classes": classes}))
    old, new = template_of(2, policy=before), template_of(2, policy=after)
    assert old.name.startswith("gpuadm-b200-2-")
    assert new.name.startswith("gpuadm-b200-2-")
    assert (old.name == new.name) is same
    assert (old.spec == new.spec) is same


def test_the_template_name_differs_by_count_and_class() -> None:
    names = {template_of(n).name for n in (1, 2, 3)}
    names |= {template_of(n, "any-gpu").name for n in (1, 2, 3)}
    assert len(names) == 6
    for count in (1, 2, 3):
        assert parse_template_name(template_of(count).name) == TemplateName("b200", Held(count))


def test_a_stale_template_name_is_charged_by_its_name_and_rewritten_to_todays() -> None:
    stale = f"gpuadm-b200-3-{STALE_DIGEST}"
    body = stored_pod(stale)
    body["metadata"]["annotations"] = {"gpuadm.io/class": "b200", "gpuadm.io/demand": "b200=3"}
    body["metadata"]["labels"] = {"gpuadm.io/class": "b200"}
    assert pod_charge(body, DRA_POLICY) == ("b200", Fraction(3))
    result = plan(body, DRA_POLICY)
    current = template_of(3)
    assert current.name != stale
    assert result.patch == [
        {"op": "add", "path": "/spec/resourceClaims", "value": [entry("gpuadm-c0", current.name)]}
    ]
    assert (result.class_name, result.charge) == ("b200", Fraction(3))
    assert result.claim_templates == (current,)


def test_a_stale_template_is_charged_to_the_class_its_name_gives() -> None:
    body = stored_pod(
        f"gpuadm-any-gpu-5-{STALE_DIGEST}", annotations={"gpuadm.io/class": "any-gpu"}
    )
    assert pod_charge(body, DRA_POLICY) == ("any-gpu", Fraction(5))
    mutated, _ = apply(body)
    assert mutated["spec"]["resourceClaims"] == [entry("gpuadm-c0", template_of(5, "any-gpu").name)]
    assert mutated["metadata"]["annotations"]["gpuadm.io/demand"] == "any-gpu=5"


def test_a_class_key_beside_gpuadms_claim_asks_anew() -> None:
    # A stored pod copied with a new ask: the class key wins, and the entry follows it.
    body = stored_pod(template_of(1).name, limits={"gpuadm.io/b200": "2"})
    mutated, result = apply(body)
    assert mutated["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpuadm-c0"}]
    assert mutated["spec"]["resourceClaims"] == [entry("gpuadm-c0", template_of(2).name)]
    assert result.charge == 2


# Denials -----------------------------------------------------------------------------------

B200_1 = template_of(1).name


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            pod(
                {"gpuadm.io/b200": "1"},
                resourceClaims=[entry("gpuadm-c0", "my-template")],
            ),
            "spec.resourceClaims: the entry name 'gpuadm-c0' is gpuadm's, and names a claim "
            "gpuadm did not write; rename the entry",
            id="gpuadm-entry-on-a-foreign-template",
        ),
        pytest.param(
            pod(resourceClaims=[{"name": "gpuadm-i3", "resourceClaimName": "shared-gpus"}]),
            "spec.resourceClaims: the entry name 'gpuadm-i3' is gpuadm's, and names a claim "
            "gpuadm did not write; rename the entry",
            id="gpuadm-entry-on-a-claim-even-without-gpu-demand",
        ),
        pytest.param(
            pod({"gpuadm.io/b200": "1"}, resourceClaims=[entry("gpus", B200_1)]),
            f"spec.resourceClaims 'gpus': ResourceClaimTemplate {B200_1} is gpuadm's, for one "
            "container's GPUs; ask for gpuadm.io/<class> in the container instead",
            id="own-entry-on-gpuadms-template",
        ),
        pytest.param(
            pod(resourceClaims=[entry("gpus", f"gpuadm-b200-8-{STALE_DIGEST}")]),
            f"spec.resourceClaims 'gpus': ResourceClaimTemplate gpuadm-b200-8-{STALE_DIGEST} "
            "is gpuadm's, for one container's GPUs; ask for gpuadm.io/<class> in the "
            "container instead",
            id="own-entry-on-a-stale-gpuadm-template",
        ),
        pytest.param(
            pod(
                annotations=DRA_ANNOTATIONS,
                resourceClaims=[entry("gpuadm-c0", B200_1)],
                extra=[with_claims(container("side", {}), "gpuadm-c0")],
            ),
            "container \"side\" lists the claim 'gpuadm-c0', which holds another container's "
            "GPUs; ask for gpuadm.io/<class> in each container that needs GPUs",
            id="container-lists-another-containers-entry",
        ),
        pytest.param(
            pod(
                init=[with_claims(container("setup", {}), "gpuadm-c0")],
                resourceClaims=[entry("gpuadm-c0", B200_1)],
            ),
            "init container \"setup\" lists the claim 'gpuadm-c0', which holds another "
            "container's GPUs; ask for gpuadm.io/<class> in each container that needs GPUs",
            id="init-container-lists-the-app-containers-entry",
        ),
        pytest.param(
            stored_pod(f"gpuadm-h100-1-{STALE_DIGEST}"),
            f'container "main": ResourceClaimTemplate gpuadm-h100-1-{STALE_DIGEST} was written '
            "for class h100, which is not a dra class of the policy",
            id="template-of-a-class-that-is-not-dra",
        ),
        pytest.param(
            stored_pod(f"gpuadm-gone-1-{STALE_DIGEST}"),
            f'container "main": ResourceClaimTemplate gpuadm-gone-1-{STALE_DIGEST} was written '
            "for class gone, which is not a dra class of the policy",
            id="template-of-a-class-not-in-the-policy",
        ),
        pytest.param(
            stored_pod(B200_1, limits={"nvidia.com/gpu": "1"}),
            'container "main" holds devices of class b200 through a claim and asks for raw GPU '
            "resources (nvidia.com/gpu) too; ask through the class alone",
            id="claim-and-raw-gpus-in-one-container",
        ),
        pytest.param(
            stored_pod(B200_1, extra=[container("side", {"gpuadm.io/h100": "1"})]),
            'the pod asks for two GPU classes (b200 in container "main", h100 in container '
            '"side"); a pod uses one class',
            id="dra-claim-and-another-class",
        ),
        pytest.param(
            pod({"gpuadm.io/b200": "1"}, extra=[container("side", {"gpuadm.io/any-gpu": "1"})]),
            'the pod asks for two GPU classes (any-gpu in container "side", b200 in container '
            '"main"); a pod uses one class',
            id="two-dra-classes",
        ),
        pytest.param(
            stored_pod(B200_1, annotations={"gpuadm.io/class": "h100"}),
            "annotation gpuadm.io/class: 'h100' contradicts gpuadm.io/b200 in container \"main\"",
            id="class-annotation-contradicts-the-claim",
        ),
        pytest.param(
            pod({"nvidia.com/gpumem": "1024"}, annotations=DRA_ANNOTATIONS),
            'container "main": nvidia.com/gpumem does not belong to class b200, whose backend '
            "dra uses ",
            id="raw-resource-of-another-stack",
        ),
        pytest.param(
            pod({"gpuadm.io/b200": "1.5"}),
            "container \"main\": gpuadm.io/b200: '1.5' is neither a whole number of GPUs",
            id="more-than-one-not-whole",
        ),
    ],
)
def test_a_pod_that_misuses_gpuadms_claims_is_denied(body: dict[str, Any], message: str) -> None:
    for reader in (plan, pod_charge):
        with pytest.raises(Denial) as denied:
            reader(body, DRA_POLICY)
        assert denied.value.message.startswith(message)


# Types -------------------------------------------------------------------------------------


def claims_in(kind: str, value: object) -> dict[str, Any]:
    """Return a b200 pod whose first container of `kind` has `resources.claims: value`."""
    c = container("setup" if kind == "initContainers" else "main", {"gpuadm.io/b200": "1"})
    c["resources"]["claims"] = value
    body = pod({"gpuadm.io/b200": "1"})
    body["spec"][kind] = [c]
    return body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            pod({"gpuadm.io/b200": "1"}, resourceClaims="gpuadm-c0"),
            "spec.resourceClaims: 'gpuadm-c0' is not a list",
            id="resource-claims-a-string",
        ),
        pytest.param(
            pod({"gpuadm.io/b200": "1"}, resourceClaims={"name": "gpuadm-c0"}),
            "spec.resourceClaims: {'name': 'gpuadm-c0'} is not a list",
            id="resource-claims-an-object",
        ),
        pytest.param(
            pod({"gpuadm.io/b200": "1"}, resourceClaims=["gpuadm-c0"]),
            "spec.resourceClaims[0]: 'gpuadm-c0' is not a claim (an object with a name)",
            id="entry-a-string",
        ),
        pytest.param(
            pod({"gpuadm.io/b200": "1"}, resourceClaims=[{"name": "nic"}, None]),
            "spec.resourceClaims[1]: null is not a claim (an object with a name)",
            id="entry-null",
        ),
        pytest.param(
            pod({"gpuadm.io/b200": "1"}, resourceClaims=[{"name": 0}]),
            "spec.resourceClaims[0].name: 0 is not a string",
            id="entry-name-a-number",
        ),
        pytest.param(
            pod(
                {"gpuadm.io/b200": "1"},
                resourceClaims=[{"name": "gpuadm-c0", "resourceClaimTemplateName": 7}],
            ),
            "spec.resourceClaims[0].resourceClaimTemplateName: 7 is not a string",
            id="template-name-a-number",
        ),
        pytest.param(
            pod(
                {"gpuadm.io/b200": "1"},
                resourceClaims=[{"name": "gpuadm-c0", "resourceClaimTemplateName": [B200_1]}],
            ),
            f"spec.resourceClaims[0].resourceClaimTemplateName: ['{B200_1}'] is not a string",
            id="template-name-a-list",
        ),
        pytest.param(
            pod(resourceClaims=[{"name": "gpus", "resourceClaimName": {"name": "x"}}]),
            "spec.resourceClaims[0].resourceClaimName: {'name': 'x'} is not a string",
            id="claim-name-an-object",
        ),
        pytest.param(
            claims_in("containers", [{"name": 5}]),
            'container "main": resources.claims[0].name: 5 is not a string',
            id="container-claim-name-a-number",
        ),
        pytest.param(
            claims_in("containers", [{"name": "nic", "request": True}]),
            'container "main": resources.claims[0].request: true is not a string',
            id="container-claim-request-a-boolean",
        ),
        pytest.param(
            claims_in("containers", "gpuadm-c0"),
            "container \"main\": resources.claims: 'gpuadm-c0' is not a list",
            id="container-claims-a-string",
        ),
        pytest.param(
            claims_in("containers", ["gpuadm-c0"]),
            "container \"main\": resources.claims[0]: 'gpuadm-c0' is not a claim (an object "
            "with a name)",
            id="container-claim-a-string",
        ),
        pytest.param(
            claims_in("initContainers", [{"name": ["gpuadm-i0"]}]),
            "init container \"setup\": resources.claims[0].name: ['gpuadm-i0'] is not a string",
            id="init-container-claim-name-a-list",
        ),
    ],
)
def test_a_claim_field_of_the_wrong_type_is_denied_naming_it(
    body: dict[str, Any], message: str
) -> None:
    for reader in (plan, pod_charge):
        with pytest.raises(Denial) as denied:
            reader(body, DRA_POLICY)
        assert denied.value.message == message


# Names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        pytest.param("gpuadm-b200-2-0123456789", TemplateName("b200", Held(2)), id="plain"),
        pytest.param(
            "gpuadm-a-1-2-abcdef0123", TemplateName("a-1", Held(2)), id="class-with-digits"
        ),
        pytest.param(
            "gpuadm-h100-9999-0123456789", TemplateName("h100", Held(9999)), id="4-digits"
        ),
        pytest.param("gpuadm-h100-p50-0123456789", TemplateName("h100", Held(1, 50)), id="share"),
        pytest.param("gpuadm-h100-p1-0123456789", TemplateName("h100", Held(1, 1)), id="share-1"),
        pytest.param("gpuadm-h-p5-p99-0123456789", TemplateName("h-p5", Held(1, 99)), id="p-class"),
        pytest.param("gpuadm-h100-p0-0123456789", None, id="share-0"),
        pytest.param("gpuadm-h100-p100-0123456789", None, id="share-100"),
        pytest.param("gpuadm-h100-p05-0123456789", None, id="share-leading-zero"),
        pytest.param("gpuadm-h100-10000-0123456789", None, id="5-digit-count"),
        pytest.param("gpuadm-h100-0-0123456789", None, id="zero-count"),
        pytest.param("gpuadm-h100-01-0123456789", None, id="leading-zero"),
        pytest.param("gpuadm-h100-1-012345678", None, id="9-digit-digest"),
        pytest.param("gpuadm-h100-1-0123456789a", None, id="11-digit-digest"),
        pytest.param("gpuadm-h100-1-ABCDEF0123", None, id="capital-digest"),
        pytest.param("gpuadm-H100-1-0123456789", None, id="capital-class"),
        pytest.param("gpuadm-h100-1", None, id="no-digest"),
        pytest.param("my-gpuadm-h100-1-0123456789", None, id="prefixed"),
        pytest.param("gpuadm-c0", None, id="entry-name"),
    ],
)
def test_a_template_name_is_gpuadms_by_its_exact_form(
    name: str, parsed: TemplateName | None
) -> None:
    assert parse_template_name(name) == parsed


@pytest.mark.parametrize(
    ("name", "ours"),
    [
        pytest.param("gpuadm-c0", True, id="app"),
        pytest.param("gpuadm-i12", True, id="init"),
        pytest.param("gpuadm-c9999", True, id="4-digits"),
        pytest.param("gpuadm-c01", False, id="leading-zero"),
        pytest.param("gpuadm-x0", False, id="other-kind"),
        pytest.param("gpuadm-c", False, id="no-index"),
        pytest.param("gpuadm-c0-extra", False, id="suffixed"),
        pytest.param("GPUADM-c0", False, id="capitals"),
        pytest.param("", False, id="empty"),
    ],
)
def test_an_entry_name_is_gpuadms_by_its_exact_form(name: str, ours: bool) -> None:
    assert is_entry_name(name) is ours


def test_entry_names_are_written_by_kind_and_index() -> None:
    assert entry_name("containers", 0) == "gpuadm-c0"
    assert entry_name("containers", 17) == "gpuadm-c17"
    assert entry_name("initContainers", 3) == "gpuadm-i3"
    for kind in ("containers", "initContainers"):
        for index in (0, 1, 10, 999, 9999):
            assert is_entry_name(entry_name(kind, index))


def test_a_privileged_ephemeral_container_is_refused_in_a_dra_pod() -> None:
    # A stored dra pod holds no GPU resource, only gpuadm's claim: the guard must still see
    # a GPU pod, or `kubectl debug --profile=sysadmin` would reach every GPU of the node.
    stored, _ = apply(pod({"gpuadm.io/b200": "1"}))
    debugged = copy.deepcopy(stored)
    debugged["spec"]["ephemeralContainers"] = [
        {"name": "debug", "image": "busybox", "securityContext": {"privileged": True}}
    ]
    with pytest.raises(Denial) as denied:
        check_added_containers(stored, debugged, DRA_POLICY)
    assert 'ephemeral container "debug": securityContext.privileged=true in a GPU pod' in (
        denied.value.message
    )
