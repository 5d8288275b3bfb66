"""Who may write GPU claims: templates and claims only gpuadm writes, claims a pod may name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies import Denial, Policy, load_policy
from policies.access.claims import check_claim, check_named_claim, check_template, named_claims
from policies.classes.backends.dra import DraClass
from policies.pods.dra_templates import Held, requested_device_classes
from tests.builders import POLICY_YAML, pod

# A policy whose dra class has a DeviceClass of its own, and that lists one more GPU class.
OWN_CLASSES_POLICY = load_policy(
    "gpuDeviceClasses: [gpu.example.com]\n"
    "classes:\n"
    "  b200:\n"
    "    backend: dra\n"
    "    deviceClassName: b200.example.com\n"
)
GPUADMS_NAME = "gpuadm-h100-1-0123456789"
NOT_OURS = "ResourceClaimTemplate requests DeviceClass"


def exactly(device_class: str) -> dict[str, Any]:
    return {"name": "r", "exactly": {"deviceClassName": device_class}}


def first_available(*device_classes: str) -> dict[str, Any]:
    return {
        "name": "r",
        "firstAvailable": [
            {"name": f"alt{i}", "deviceClassName": c} for i, c in enumerate(device_classes)
        ],
    }


def claim_spec(*requests: object) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


def template(
    *requests: object, name: str = "nic-template", labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """Return a ResourceClaimTemplate as the apiserver sends it."""
    metadata: dict[str, Any] = {"name": name, "namespace": "team-x"}
    if labels is not None:
        metadata["labels"] = labels
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": {"spec": claim_spec(*requests)},
    }


def claim(*requests: object, name: str = "nic") -> dict[str, Any]:
    """Return a ResourceClaim as the apiserver sends it."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-x"},
        "spec": claim_spec(*requests),
    }


# Templates ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "classes"),
    [
        pytest.param(template(exactly("gpu.nvidia.com")), "gpu.nvidia.com", id="whole-gpus"),
        pytest.param(template(exactly("mig.nvidia.com")), "mig.nvidia.com", id="mig-slices"),
        pytest.param(
            template(first_available("nic.example.com", "gpu.nvidia.com")),
            "gpu.nvidia.com",
            id="whole-gpus-as-an-alternative",
        ),
        pytest.param(
            template(first_available("mig.nvidia.com")),
            "mig.nvidia.com",
            id="mig-as-the-only-alternative",
        ),
        pytest.param(
            template(exactly("nic.example.com"), exactly("gpu.nvidia.com")),
            "gpu.nvidia.com",
            id="gpus-in-a-second-request",
        ),
        pytest.param(
            template(
                exactly("mig.nvidia.com"),
                first_available("gpu.nvidia.com", "mig.nvidia.com"),
                exactly("gpu.nvidia.com"),
            ),
            "mig.nvidia.com, gpu.nvidia.com",
            id="each-class-named-once",
        ),
        pytest.param(
            template("junk", None, exactly("gpu.nvidia.com")),
            "gpu.nvidia.com",
            id="gpus-after-requests-that-are-not-objects",
        ),
    ],
)
def test_a_template_for_gpus_is_refused(policy: Policy, body: dict[str, Any], classes: str) -> None:
    with pytest.raises(Denial) as denied:
        check_template(body, policy)
    assert denied.value.message == (
        f"{NOT_OURS} {classes}: in this namespace GPUs come through gpuadm's classes; ask "
        "for gpuadm.io/<class> in a pod's container instead"
    )


@pytest.mark.parametrize(
    ("body", "old", "shown_name"),
    [
        pytest.param(
            template(exactly("nic.example.com"), name=GPUADMS_NAME),
            None,
            GPUADMS_NAME,
            id="gpuadms-name",
        ),
        pytest.param(
            template(name="gpus", labels={"app.kubernetes.io/managed-by": "gpuadm"}),
            None,
            "gpus",
            id="gpuadms-label",
        ),
        pytest.param(
            template(exactly("nic.example.com"), name="gpus"),
            template(name="gpus", labels={"app.kubernetes.io/managed-by": "gpuadm"}),
            "gpus",
            id="gpuadms-label-on-the-old-template",
        ),
        pytest.param(
            template(exactly("nic.example.com"), name="nics"),
            template(exactly("nic.example.com"), name=GPUADMS_NAME),
            GPUADMS_NAME,
            id="gpuadms-name-on-the-old-template",
        ),
    ],
)
def test_a_template_that_is_gpuadms_is_refused(
    policy: Policy, body: dict[str, Any], old: dict[str, Any] | None, shown_name: str
) -> None:
    with pytest.raises(Denial) as denied:
        check_template(body, policy, old=old)
    assert denied.value.message == (
        f"ResourceClaimTemplate '{shown_name}' is gpuadm's (by its name or its "
        "app.kubernetes.io/managed-by label): only gpuadm writes it; ask for gpuadm.io/<class> "
        "in a pod's container and gpuadm names the template"
    )


def test_gpuadms_own_template_is_refused_to_anyone_else() -> None:
    policy = load_policy(POLICY_YAML + "  b200:\n    backend: dra\n")
    b200 = policy.classes["b200"]
    assert isinstance(b200, DraClass)
    template = b200.claim_template("b200", Held(2))
    assert template is not None
    manifest = template.manifest("team-x", labels={"app.kubernetes.io/managed-by": "gpuadm"})
    with pytest.raises(Denial) as denied:
        check_template(manifest, policy)
    assert denied.value.message.startswith(
        f"ResourceClaimTemplate '{manifest['metadata']['name']}'"
    )


@pytest.mark.parametrize(
    ("body", "old"),
    [
        pytest.param(template(exactly("nic.example.com")), None, id="nic"),
        pytest.param(
            template(first_available("nic.example.com", "fpga.example.com")),
            None,
            id="alternatives-without-gpus",
        ),
        pytest.param(
            template(exactly("nic.example.com"), labels={"app.kubernetes.io/managed-by": "helm"}),
            template(exactly("nic.example.com"), labels={"app.kubernetes.io/managed-by": "helm"}),
            id="another-manager",
        ),
        pytest.param(
            template(exactly("nic.example.com"), labels={"app": "gpuadm"}), None, id="other-label"
        ),
        pytest.param(template(name="gpuadm-h100"), None, id="name-without-count-and-digest"),
        pytest.param(template(name="gpuadm-c0"), None, id="name-of-a-pods-entry"),
        pytest.param(template(exactly("gpu.example.com")), None, id="gpu-class-not-listed"),
        pytest.param(template(), None, id="no-requests"),
    ],
)
def test_a_template_for_other_devices_is_allowed(
    policy: Policy, body: dict[str, Any], old: dict[str, Any] | None
) -> None:
    check_template(body, policy, old=old)


@pytest.mark.parametrize(
    "device_class",
    [
        pytest.param("gpu.example.com", id="listed-in-gpuDeviceClasses"),
        pytest.param("b200.example.com", id="device-class-of-a-dra-class"),
    ],
)
def test_the_policys_device_classes_are_gpus_too(device_class: str) -> None:
    assert {"gpu.example.com", "b200.example.com"} <= OWN_CLASSES_POLICY.gpu_device_class_names
    with pytest.raises(Denial) as denied:
        check_template(template(exactly(device_class)), OWN_CLASSES_POLICY)
    assert denied.value.message.startswith(f"{NOT_OURS} {device_class}: ")
    with pytest.raises(Denial):
        check_template(
            template(first_available("nic.example.com", device_class)), OWN_CLASSES_POLICY
        )
    with pytest.raises(Denial):
        check_claim(claim(exactly(device_class)), OWN_CLASSES_POLICY)


def test_nvidias_and_a_dra_classs_device_classes_are_always_gpus() -> None:
    policy = load_policy(
        "gpuDeviceClasses: []\nclasses:\n  b200:\n    backend: dra\n    deviceClassName: b200.x\n"
    )
    assert policy.gpu_device_class_names == {"b200.x", "gpu.nvidia.com", "mig.nvidia.com"}
    with pytest.raises(Denial):
        check_template(template(exactly("b200.x")), policy)


@pytest.mark.parametrize(
    ("body", "old", "message"),
    [
        pytest.param(
            {"metadata": {"name": "t"}, "spec": "gpu.nvidia.com"},
            None,
            "spec: 'gpu.nvidia.com' is not an object",
            id="spec-a-string",
        ),
        pytest.param(
            {"metadata": {"name": "t"}, "spec": ["gpu.nvidia.com"]},
            None,
            "spec: ['gpu.nvidia.com'] is not an object",
            id="spec-a-list",
        ),
        pytest.param(
            {"metadata": "t", "spec": {}},
            None,
            "metadata: 't' is not an object",
            id="metadata-a-string",
        ),
        pytest.param(
            {"metadata": {"name": 5}},
            None,
            "metadata.name: 5 is not a string",
            id="name-a-number",
        ),
        pytest.param(
            {"metadata": {"name": "t", "labels": ["app.kubernetes.io/managed-by"]}},
            None,
            "metadata.labels: ['app.kubernetes.io/managed-by'] is not an object of strings",
            id="labels-a-list",
        ),
        pytest.param(
            template(exactly("nic.example.com")),
            {"metadata": {"name": "t", "labels": {"app.kubernetes.io/managed-by": 1}}},
            "the old template's metadata.labels['app.kubernetes.io/managed-by']: 1 is not a string",
            id="old-label-a-number",
        ),
    ],
)
def test_a_malformed_template_is_denied_naming_the_field(
    policy: Policy, body: dict[str, Any], old: dict[str, Any] | None, message: str
) -> None:
    with pytest.raises(Denial) as denied:
        check_template(body, policy, old=old)
    assert denied.value.message == message


MALFORMED_SPECS = [
    pytest.param("gpu.nvidia.com", id="spec-a-string"),
    pytest.param(None, id="spec-null"),
    pytest.param({"devices": "gpu.nvidia.com"}, id="devices-a-string"),
    pytest.param({"devices": {"requests": "gpu.nvidia.com"}}, id="requests-a-string"),
    pytest.param(
        {"devices": {"requests": {"gpu": exactly("gpu.nvidia.com")}}}, id="requests-a-map"
    ),
    pytest.param(claim_spec("gpu.nvidia.com", 7, None), id="requests-not-objects"),
    pytest.param(claim_spec({"exactly": "gpu.nvidia.com"}), id="exactly-a-string"),
    pytest.param(claim_spec({"firstAvailable": "gpu.nvidia.com"}), id="alternatives-a-string"),
    pytest.param(claim_spec({"firstAvailable": ["gpu.nvidia.com"]}), id="alternative-a-string"),
    pytest.param(claim_spec({"exactly": {"deviceClassName": None}}), id="class-null"),
    pytest.param(claim_spec({"exactly": {}}), id="class-missing"),
]


@pytest.mark.parametrize("spec", MALFORMED_SPECS)
def test_a_malformed_claim_spec_requests_no_gpus(policy: Policy, spec: object) -> None:
    # The apiserver refuses such a spec itself; gpuadm reads no GPU in it, and fails in nothing.
    check_template({"metadata": {"name": "t"}, "spec": {"spec": spec}}, policy)
    check_claim({"metadata": {"name": "c"}, "spec": spec}, policy)
    check_named_claim("c", {"metadata": {"name": "c"}, "spec": spec}, policy)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(["gpu.nvidia.com", "mig.nvidia.com", "nic.example.com", GPUADMS_NAME]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["spec", "devices", "requests", "exactly", "firstAvailable", "deviceClassName"]
            ),
            inner,
            max_size=3,
        )
    ),
    max_leaves=20,
)


def denial_of(check: Callable[[], None]) -> str | None:
    """Return the message of the `Denial` a check raises, or None if it passes."""
    try:
        check()
    except Denial as denial:
        return denial.message
    return None


@given(spec=JSON)
def test_any_claim_spec_is_judged_without_failing(spec: object) -> None:
    policy = OWN_CLASSES_POLICY
    checks: list[tuple[Callable[[], None], str]] = [
        (
            lambda: check_template({"metadata": {"name": "t"}, "spec": {"spec": spec}}, policy),
            f"{NOT_OURS} ",
        ),
        (lambda: check_claim({"spec": spec}, policy), "ResourceClaim requests DeviceClass "),
        (
            lambda: check_named_claim("c", {"spec": spec}, policy),
            "spec.resourceClaims names ResourceClaim 'c', which holds devices of DeviceClass ",
        ),
    ]
    for check, prefix in checks:
        message = denial_of(check)
        assert message is None or message.startswith(prefix)


@given(spec=JSON)
def test_any_template_spec_is_judged_without_failing(spec: object) -> None:
    message = denial_of(
        lambda: check_template({"metadata": {"name": "t"}, "spec": spec}, OWN_CLASSES_POLICY)
    )
    assert message is None or message.startswith(("spec: ", f"{NOT_OURS} "))


# Claims ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "classes"),
    [
        pytest.param(claim(exactly("gpu.nvidia.com")), "gpu.nvidia.com", id="whole-gpus"),
        pytest.param(claim(exactly("mig.nvidia.com")), "mig.nvidia.com", id="mig-slices"),
        pytest.param(
            claim(first_available("nic.example.com", "mig.nvidia.com")),
            "mig.nvidia.com",
            id="mig-as-an-alternative",
        ),
        pytest.param(
            claim(exactly("gpu.nvidia.com"), first_available("gpu.nvidia.com")),
            "gpu.nvidia.com",
            id="named-once",
        ),
    ],
)
def test_a_claim_for_gpus_is_refused(policy: Policy, body: dict[str, Any], classes: str) -> None:
    with pytest.raises(Denial) as denied:
        check_claim(body, policy)
    assert denied.value.message == (
        f"ResourceClaim requests DeviceClass {classes}: in this namespace GPUs come through "
        "gpuadm's classes; ask for gpuadm.io/<class> in a pod's container instead"
    )


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(claim(exactly("nic.example.com")), id="nic"),
        pytest.param(claim(first_available("nic.example.com")), id="nic-as-an-alternative"),
        # Only a template is gpuadm's by its name: a claim's name is the controller's to give.
        pytest.param(claim(exactly("nic.example.com"), name=GPUADMS_NAME), id="gpuadm-like-name"),
        pytest.param({"metadata": {"name": "c"}}, id="no-spec"),
    ],
)
def test_a_claim_for_other_devices_is_allowed(policy: Policy, body: dict[str, Any]) -> None:
    check_claim(body, policy)


# Claims a pod names ------------------------------------------------------------------------


def test_named_claims_are_the_resource_claim_names_in_order() -> None:
    body = pod(
        resourceClaims=[
            {"name": "a", "resourceClaimName": "claim-a"},
            {"name": "gpuadm-c0", "resourceClaimTemplateName": GPUADMS_NAME},
            {"name": "b", "resourceClaimTemplateName": "nic-template"},
            {"name": "c", "resourceClaimName": "claim-c"},
            {"name": "d", "resourceClaimName": ""},
            {"name": "e", "resourceClaimName": None},
            {"name": "f", "resourceClaimName": "claim-a"},
        ]
    )
    assert named_claims(body) == ["claim-a", "claim-c", "claim-a"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(pod(), id="no-resource-claims"),
        pytest.param(pod(resourceClaims=None), id="resource-claims-null"),
        pytest.param(pod(resourceClaims=[]), id="resource-claims-empty"),
        pytest.param({"metadata": {"name": "p"}}, id="no-spec"),
        pytest.param({"metadata": {"name": "p"}, "spec": None}, id="spec-null"),
    ],
)
def test_a_pod_without_claim_names_names_none(body: dict[str, Any]) -> None:
    assert named_claims(body) == []


def test_naming_a_claim_that_does_not_exist_is_denied(policy: Policy) -> None:
    with pytest.raises(Denial) as denied:
        check_named_claim("shared-gpus", None, policy)
    assert denied.value.message == (
        "spec.resourceClaims names ResourceClaim 'shared-gpus', which does not exist; create "
        "the claim first, then the pod"
    )


@pytest.mark.parametrize(
    ("body", "classes"),
    [
        pytest.param(claim(exactly("gpu.nvidia.com")), "gpu.nvidia.com", id="whole-gpus"),
        pytest.param(
            claim(first_available("nic.example.com", "mig.nvidia.com"), exactly("gpu.nvidia.com")),
            "mig.nvidia.com, gpu.nvidia.com",
            id="both-nvidia-classes",
        ),
    ],
)
def test_naming_a_claim_for_gpus_is_denied(
    policy: Policy, body: dict[str, Any], classes: str
) -> None:
    with pytest.raises(Denial) as denied:
        check_named_claim("shared-gpus", body, policy)
    assert denied.value.message == (
        f"spec.resourceClaims names ResourceClaim 'shared-gpus', which holds devices of "
        f"DeviceClass {classes}: GPUs come through gpuadm's classes, one claim per pod; ask for "
        "gpuadm.io/<class> in the container instead"
    )


def test_naming_a_claim_for_the_policys_own_gpu_class_is_denied() -> None:
    with pytest.raises(Denial) as denied:
        check_named_claim("mine", claim(exactly("b200.example.com")), OWN_CLASSES_POLICY)
    assert "DeviceClass b200.example.com: " in denied.value.message


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(claim(exactly("nic.example.com")), id="nic"),
        pytest.param(claim(first_available("fpga.example.com")), id="fpga-as-an-alternative"),
        pytest.param({"metadata": {"name": "c"}}, id="no-spec"),
    ],
)
def test_naming_a_claim_for_other_devices_is_allowed(policy: Policy, body: dict[str, Any]) -> None:
    check_named_claim("nic", body, policy)


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        pytest.param(claim_spec(exactly("a.x")), ["a.x"], id="exactly"),
        pytest.param(claim_spec(first_available("a.x", "b.x")), ["a.x", "b.x"], id="alternatives"),
        pytest.param(
            claim_spec(exactly("a.x"), first_available("b.x"), exactly("a.x")),
            ["a.x", "b.x", "a.x"],
            id="in-request-order-repeats-kept",
        ),
        pytest.param(
            claim_spec(
                {
                    "exactly": {"deviceClassName": "a.x"},
                    "firstAvailable": [{"deviceClassName": "b.x"}],
                }
            ),
            ["a.x", "b.x"],
            id="both-forms-in-one-request",
        ),
        pytest.param({"devices": {}}, [], id="no-requests"),
    ],
)
def test_requested_device_classes_reads_both_request_forms(spec: object, names: list[str]) -> None:
    assert requested_device_classes(spec) == names
