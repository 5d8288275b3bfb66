"""Odd pods: fields of the wrong type, values too long or too deep, are denied by name."""

from __future__ import annotations

from typing import Any

import pytest

from policies import Denial, Policy, check_update, plan, pod_charge
from policies.pods.pod_shape import shown
from tests.builders import container, pod

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
TERMS = f"spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms"
QUANTITY = "is not a quantity (a string such as 500m, 2 or 10Gi, or a number)"
TOO_DEEP = "nests lists and objects more than 16 levels deep, deeper than any field of a pod"


def nested(depth: int) -> Any:
    value: Any = "1"
    for _ in range(depth):
        value = {"a": value}
    return value


def gpu_pod(*path: str | int, value: object) -> dict[str, Any]:
    """Return a pod asking for one A100, with `value` put at `path`."""
    body = pod({"gpuadm.io/a100": "1"})
    *parents, last = path
    target: Any = body
    for step in parents:
        target = target[step]
    target[last] = value
    return body


def in_resources(*path: str | int, value: object) -> dict[str, Any]:
    """Return a pod asking for one A100, with `value` put at `path` in its resources."""
    return gpu_pod("spec", "containers", 0, "resources", *path, value=value)


def with_terms(terms: Any) -> dict[str, Any]:
    return pod({"gpuadm.io/t4": "1"}, affinity={"nodeAffinity": {REQUIRED: terms}})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            gpu_pod("metadata", "annotations", value=["a", "b"]),
            "metadata.annotations: ['a', 'b'] is not an object of strings",
            id="annotations-as-a-list",
        ),
        pytest.param(
            gpu_pod("metadata", "labels", value="team=a"),
            "metadata.labels: 'team=a' is not an object of strings",
            id="labels-as-a-string",
        ),
        pytest.param(
            gpu_pod("metadata", "annotations", value={"gpuadm.io/class": 5}),
            "metadata.annotations['gpuadm.io/class']: 5 is not a string",
            id="annotation-value-a-number",
        ),
        pytest.param(
            gpu_pod("metadata", "labels", value={1: "a"}),
            "metadata.labels: the key 1 is not a string",
            id="label-key-a-number-from-yaml",
        ),
        pytest.param(
            in_resources("limits", value={True: "1"}),
            'container "main": resources.limits: the key true is not a string',
            id="resource-key-a-boolean-from-yaml",
        ),
        pytest.param(
            gpu_pod("metadata", "name", value=["p"]),
            "metadata.name: ['p'] is not a string",
            id="name-a-list",
        ),
        pytest.param(
            gpu_pod("metadata", value=[]), "metadata: [] is not an object", id="metadata-a-list"
        ),
        pytest.param(gpu_pod("spec", value="x"), "spec: 'x' is not an object", id="spec-a-string"),
        pytest.param(
            gpu_pod("spec", "containers", value={"name": "main"}),
            "spec.containers: {'name': 'main'} is not a list",
            id="containers-not-a-list",
        ),
        pytest.param(
            gpu_pod("spec", "containers", value=["main"]),
            "spec.containers[0]: 'main' is not a container (an object with a name)",
            id="container-not-an-object",
        ),
        pytest.param(
            gpu_pod("spec", "initContainers", value=[None]),
            "spec.initContainers[0]: null is not a container (an object with a name)",
            id="init-container-null",
        ),
        pytest.param(
            gpu_pod("spec", "containers", 0, "name", value=7),
            "spec.containers[0].name: 7 is not a string",
            id="container-name-a-number",
        ),
        pytest.param(
            pod({}, init=[container("i", {}, restartPolicy=True)]),
            'init container "i": restartPolicy: true is not a string',
            id="restart-policy-a-boolean",
        ),
        pytest.param(
            in_resources(value="1 GPU"),
            "container \"main\": resources: '1 GPU' is not an object",
            id="resources-not-an-object",
        ),
        pytest.param(
            in_resources("limits", value=[{"gpuadm.io/a100": "1"}]),
            "container \"main\": resources.limits: [{'gpuadm.io/a100': '1'}] is not an object",
            id="limits-a-list",
        ),
        pytest.param(
            in_resources("limits", "gpuadm.io/a100", value=["1"]),
            f"container \"main\": resources.limits['gpuadm.io/a100']: ['1'] {QUANTITY}",
            id="quantity-a-list",
        ),
        pytest.param(
            in_resources("requests", "gpuadm.io/a100", value=True),
            f"container \"main\": resources.requests['gpuadm.io/a100']: true {QUANTITY}",
            id="quantity-a-boolean",
        ),
        pytest.param(
            in_resources("requests", "cpu", value={"a": 1}),
            f"container \"main\": resources.requests['cpu']: {{'a': 1}} {QUANTITY}",
            id="cpu-an-object",
        ),
        pytest.param(
            in_resources("limits", value={"gpuadm.io/a100": nested(255)}),
            f"container \"main\": resources.limits['gpuadm.io/a100']: {shown(nested(255))} "
            + QUANTITY,
            id="quantity-nested-255-deep",
        ),
        pytest.param(
            in_resources("claims", value=[nested(30)]),
            f'container "main": resources.claims[0].a: {shown(nested(30)["a"])} {TOO_DEEP}',
            id="resources-nested-30-deep",
        ),
        pytest.param(
            in_resources("limits", value={"example.com/" + "x" * 400: "1"}),
            f'container "main": resources.limits: {shown("example.com/" + "x" * 400)} '
            "(412 characters) is not a resource name, which has at most 317",
            id="resource-name-too-long",
        ),
        pytest.param(
            with_terms({"nodeSelectorTerms": [None]}),
            f"{TERMS}[0]: null is not a node selector term (an object with matchExpressions)",
            id="node-selector-terms-null",
        ),
        pytest.param(
            with_terms({"nodeSelectorTerms": "zone=a"}),
            f"{TERMS}: 'zone=a' is not a list",
            id="node-selector-terms-a-string",
        ),
        pytest.param(
            with_terms({"nodeSelectorTerms": [{"matchFields": ["zone in (a)"]}]}),
            f"{TERMS}[0].matchFields[0]: 'zone in (a)' is not a node selector requirement "
            "(an object with key, operator and values)",
            id="match-fields-item-a-string",
        ),
        pytest.param(
            with_terms([{"matchExpressions": []}]),
            f"spec.affinity.nodeAffinity.{REQUIRED}: [{{'matchExpressions': []}}] is not an object",
            id="required-a-list",
        ),
        pytest.param(
            pod({"gpuadm.io/t4": "1"}, affinity="zone=a"),
            "spec.affinity: 'zone=a' is not an object",
            id="affinity-a-string",
        ),
        pytest.param(
            pod({"gpuadm.io/t4": "1"}, affinity={"nodeAffinity": []}),
            "spec.affinity.nodeAffinity: [] is not an object",
            id="node-affinity-a-list",
        ),
        pytest.param(
            pod({"gpuadm.io/t4": "1"}, affinity={"podAffinity": nested(40)}),
            f"spec.affinity.podAffinity: {shown(nested(40))} {TOO_DEEP}",
            id="pod-affinity-nested-40-deep",
        ),
        pytest.param(
            pod({"gpuadm.io/t4": "1"}, tolerations={"key": "gpu"}),
            "spec.tolerations: {'key': 'gpu'} is not a list",
            id="tolerations-an-object",
        ),
        pytest.param(
            pod({"gpuadm.io/t4": "1"}, tolerations=["gpu"]),
            "spec.tolerations[0]: 'gpu' is not a toleration (an object)",
            id="toleration-a-string",
        ),
        pytest.param(
            pod({"gpuadm.io/t4": "1"}, schedulerName=3),
            "spec.schedulerName: 3 is not a string",
            id="scheduler-name-a-number",
        ),
        pytest.param(
            pod({"gpuadm.io/t4": "1"}, nodeName=["n1"]),
            "spec.nodeName: ['n1'] is not a string",
            id="node-name-a-list",
        ),
    ],
)
def test_an_odd_pod_is_denied_naming_the_field_and_value(
    policy: Policy, body: dict[str, Any], message: str
) -> None:
    for reader in (plan, pod_charge):
        with pytest.raises(Denial) as denied:
            reader(body, policy)
        assert denied.value.message == message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        pytest.param(
            "9" * 4301,
            "'99999999999999999999'… (4301 characters) is not a quantity: a quantity is a "
            "number with an optional suffix such as 500m, 2, 10Gi or 1e3, in at most 64 "
            "characters",
            id="quantity-of-4301-digits",
        ),
        pytest.param(
            "1e999999999",
            "'1e999999999' is out of range: the exponent of a quantity is between -83 and 83",
            id="quantity-with-an-absurd-exponent",
        ),
        pytest.param(
            2**64 - 1,
            "18446744073709551615 is out of range: a quantity is at most 2^63-1 "
            "(9223372036854775807)",
            id="quantity-past-2-to-the-63",
        ),
    ],
)
def test_an_absurd_quantity_is_denied_by_what_a_quantity_is(
    policy: Policy, value: object, message: str
) -> None:
    body = pod({"gpuadm.io/a100": value})
    with pytest.raises(Denial) as denied:
        plan(body, policy)
    assert denied.value.message == f'container "main": gpuadm.io/a100: {message}'


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            pod({"gpuadm.io/a100": "1"}, schedulerName="s" * 5000),
            "class a100 is scheduled by 'hami-scheduler', but the pod names schedulerName "
            f"{shown('s' * 5000)}; remove schedulerName or set it to 'hami-scheduler'",
            id="scheduler-name-of-5000-characters",
        ),
        pytest.param(
            pod({"nvidia.com/gpu": "1"}, annotations={"gpuadm.io/class": "c" * 5000}),
            f"annotation gpuadm.io/class: {shown('c' * 5000)} is not a GPU class "
            "(classes: a10, a100, a100-mig, h100, l4, t4, v100)",
            id="class-annotation-of-5000-characters",
        ),
    ],
)
def test_long_values_are_shown_shortened(
    policy: Policy, body: dict[str, Any], message: str
) -> None:
    with pytest.raises(Denial) as denied:
        plan(body, policy)
    assert denied.value.message == message
    assert len(message) < 300


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        pytest.param(
            pod({}),
            gpu_pod("metadata", "labels", value=["gpuadm.io/class=a100"]),
            "metadata.labels: ['gpuadm.io/class=a100'] is not an object of strings",
            id="new-labels-a-list",
        ),
        pytest.param(
            gpu_pod("metadata", "annotations", value="x"),
            pod({}),
            "the old pod's metadata.annotations: 'x' is not an object of strings",
            id="old-annotations-a-string",
        ),
    ],
)
def test_an_odd_update_is_denied_naming_the_pod_and_field(
    policy: Policy, old: dict[str, Any], new: dict[str, Any], message: str
) -> None:
    with pytest.raises(Denial) as denied:
        check_update(old, new, policy)
    assert denied.value.message == message


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param(None, "null", id="null"),
        pytest.param(True, "true", id="boolean"),
        pytest.param("500m", "'500m'", id="string"),
        pytest.param({"a": [1, None]}, "{'a': [1, null]}", id="object"),
        pytest.param("x" * 100, "'" + "x" * 58 + "…", id="long-string"),
        pytest.param(nested(1000), "{'a': " * 9 + "{'a':…", id="deep-object"),
        pytest.param(10**5000, "an integer of 16610 bits", id="huge-integer"),
        pytest.param(
            list(range(10**6)), "[" + ", ".join(map(str, range(17))) + ", …", id="long-list"
        ),
    ],
)
def test_shown_writes_only_what_the_message_shows(value: object, text: str) -> None:
    assert shown(value) == text
