"""The deploy manifests, as kustomize and Helm render them.

Every rendered object is checked against the Kubernetes API schema of the official Python
client, unknown fields included; the safe defaults are asserted one by one; the kustomize and
Helm renders must agree object for object; and the webhooks' matchConditions are evaluated
with a CEL runtime against sample admission requests.

kustomize and helm are built from their Go modules by deploy/tools/install.sh on first use
(about 11 minutes on two cores, then cached). Without Go these tests fail, saying so.
"""

from __future__ import annotations

import base64
import copy
import inspect
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from cel_expr_python import cel

from policies import Denial, check_guard, load_policy
from policies.access.guard import ALLOCATION_ANNOTATIONS
from policies.access.guard.allocation import KAI_ALLOCATION_ANNOTATIONS, KAI_GPU_GROUP
from policies.classes.backends.kai import SHARE_CONFIG_MAPS
from policies.classes.models import DEVICE_CHOICE_ANNOTATIONS, PLACEMENT_ANNOTATIONS
from policies.policy import GPU_STACK_NAMESPACES as STACK_NAMESPACES
from policies.policy import (
    ROUTED_DEVICES_CONFIG_MAPS,
    ROUTED_REQUEST_ANNOTATIONS,
    _default_resource_names,
)
from tests.builders import POLICY_YAML
from tests.gpu_stacks import STACK_PODS, StackPod

REPO = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO / "deploy" / "tools" / "install.sh"
EXAMPLES = REPO / "examples"
NAMESPACE = "gpuadm-system"
CERT_MANAGER_GROUP = "cert-manager.io"

Obj = dict[str, Any]

HELM_TEMPLATE = ("template", "gpuadm", "deploy/helm/gpuadm", "--include-crds")
# The example policy and quotas, which deploy/base installs too; the chart's defaults hold none
# (test_chart.py renders it without them).
EXAMPLE_VALUES = ("-f", "examples/values-example.yaml")
RENDERS: dict[str, tuple[str, ...]] = {
    "kustomize-base": ("kustomize", "build", "deploy/base"),
    "kustomize-cert-manager": ("kustomize", "build", "deploy/cert-manager"),
    "kustomize-mounted-secret": ("kustomize", "build", "deploy/mounted-secret"),
    "helm": ("helm", *HELM_TEMPLATE, *EXAMPLE_VALUES, "--namespace", NAMESPACE),
    "helm-cert-manager": (
        "helm",
        *HELM_TEMPLATE,
        *EXAMPLE_VALUES,
        "--namespace",
        NAMESPACE,
        "--set",
        "certManager.enabled=true",
    ),
    "helm-mounted-secret": (
        "helm",
        *HELM_TEMPLATE,
        *EXAMPLE_VALUES,
        "--namespace",
        NAMESPACE,
        "--set",
        "tls.existingSecret=gpuadm-tls",
    ),
    "kustomize-client-auth": ("kustomize", "build", "deploy/client-auth"),
    "helm-client-auth": (
        "helm",
        *HELM_TEMPLATE,
        *EXAMPLE_VALUES,
        "--namespace",
        NAMESPACE,
        "--set",
        "clientAuth.caConfigMap=gpuadm-client-ca",
    ),
}
# Renders whose gpuadm answers only callers with a client certificate of gpuadm-client-ca.
WITH_CLIENT_AUTH = {"kustomize-client-auth", "helm-client-auth"}
WITH_CERT_MANAGER = {"kustomize-cert-manager", "helm-cert-manager"}
# Renders whose pods serve a mounted Secret rather than managing their own TLS.
MOUNTING_THE_SECRET = {*WITH_CERT_MANAGER, "kustomize-mounted-secret", "helm-mounted-secret"}
# Each kustomize render and the Helm render that must match it.
COUNTERPARTS = [
    ("kustomize-base", "helm"),
    ("kustomize-cert-manager", "helm-cert-manager"),
    ("kustomize-mounted-secret", "helm-mounted-secret"),
    ("kustomize-client-auth", "helm-client-auth"),
]

# The namespaces of the GPU stacks' documented installs, exempt by default: the list
# check-config warns from, so that the shipped manifests and the warning never part.
GPU_STACK_NAMESPACES = set(STACK_NAMESPACES)

GPU_RESOURCE_NAMES = [
    "nvidia.com/gpu",
    "nvidia.com/gpumem",
    "nvidia.com/gpucores",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpu.shared",
    "tencent.com/vcuda-core",
    "tencent.com/vcuda-memory",
    "aliyun.com/gpu-mem",
    "volcano.sh/vgpu-number",
    "volcano.sh/vgpu-memory",
    "volcano.sh/vgpu-cores",
    "aliyun.com/gpu-core.percentage",
    "tke.cloud.tencent.com/qgpu-core",
    "tke.cloud.tencent.com/qgpu-memory",
    "vke.volcengine.com/mgpu-core",
    "vke.volcengine.com/mgpu-memory",
    "elasticgpu.com/gpu-core",
    "elasticgpu.com/gpu-memory",
]


# --- rendering ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tools() -> dict[str, Path]:
    """Paths of kustomize and helm, built by deploy/tools/install.sh if not yet cached."""
    result = subprocess.run(
        ["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        pytest.fail(
            f"deploy/tools/install.sh exited {result.returncode}:\n{result.stderr}",
            pytrace=False,
        )
    bin_dirs = [Path(d) for d in result.stdout.strip().splitlines()[-1].split(os.pathsep)]
    found = {}
    for name in ("kustomize", "helm"):
        paths = [d / name for d in bin_dirs if (d / name).is_file()]
        assert paths, f"install.sh printed {bin_dirs}, none of which holds {name}"
        found[name] = paths[0]
    return found


Render = Callable[..., list[Obj]]


@pytest.fixture(scope="session")
def render(tools: dict[str, Path]) -> Render:
    """render(NAME, *extra helm args) -> the objects of that render, a fresh copy each call."""
    outputs: dict[tuple[str, ...], str] = {}

    def run(name: str, *extra: str) -> list[Obj]:
        tool, *args = RENDERS[name]
        argv = (str(tools[tool]), *args, *extra)
        if argv not in outputs:
            result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
            assert result.returncode == 0, f"{' '.join(argv)} failed:\n{result.stderr}"
            outputs[argv] = result.stdout
        return [doc for doc in yaml.safe_load_all(outputs[argv]) if doc]

    return run


@dataclass
class Rendered:
    name: str
    objects: list[Obj]

    def all(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str = "gpuadm") -> Obj:
        matches = [o for o in self.all(kind) if o["metadata"]["name"] == name]
        assert len(matches) == 1, f"{self.name}: {len(matches)} {kind} named {name!r}"
        return matches[0]


@pytest.fixture(params=list(RENDERS))
def rendered(request: pytest.FixtureRequest, render: Render) -> Rendered:
    return Rendered(request.param, render(request.param))


# --- the schema check ---------------------------------------------------------------------


class _FakeResponse:
    """What ApiClient.deserialize reads before client 37: an object with the body in `.data`."""

    def __init__(self, text: str) -> None:
        self.data = text


def deserialize(api_client: kubernetes.client.ApiClient, obj: Obj, model: str) -> object:
    """Build the client's model of `obj`, as the client does with an API response."""
    text = json.dumps(obj)
    # Client 37 takes the body itself and its content type; earlier ones a response object.
    if "content_type" in inspect.signature(api_client.deserialize).parameters:
        return api_client.deserialize(text, model, "application/json")
    return api_client.deserialize(_FakeResponse(text), model)


def model_name(api_version: str, kind: str) -> str:
    """The client's model class for a kind: apps/v1 Deployment -> V1Deployment."""
    version = api_version.rpartition("/")[2]
    return version[0].upper() + version[1:] + kind


# The client spells its container types `list[T]` and `dict(str, T)` before version 37, and
# `List[T]` and `Dict[str, T]` from then on.
_LIST_TYPE = re.compile(r"[Ll]ist\[(.+)\]")
_DICT_TYPE = re.compile(r"(?:dict\(|Dict\[)str, (.+)[)\]]")


def unknown_fields(value: Any, openapi_type: str, path: str) -> Iterator[str]:
    """Fields of `value` that the client's model for `openapi_type` does not know.

    The client drops unknown fields silently when it deserializes, so this walk is what
    catches a typo such as `readinessProbes`. It also insists that int and bool fields hold
    ints and bools, which the deserializer would coerce.
    """
    if list_of := _LIST_TYPE.fullmatch(openapi_type):
        for i, item in enumerate(value):
            yield from unknown_fields(item, list_of[1], f"{path}[{i}]")
    elif dict_of := _DICT_TYPE.fullmatch(openapi_type):
        for key, item in value.items():
            yield from unknown_fields(item, dict_of[1], f"{path}.{key}")
    elif openapi_type == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            yield f"{path}: {value!r} is not an integer"
    elif openapi_type == "bool":
        if not isinstance(value, bool):
            yield f"{path}: {value!r} is not a boolean"
    elif hasattr(kubernetes.client.models, openapi_type):
        model = getattr(kubernetes.client.models, openapi_type)
        if not isinstance(value, dict):
            yield f"{path}: {value!r} is not an object ({openapi_type})"
            return
        attribute_of = {key: attribute for attribute, key in model.attribute_map.items()}
        for key, item in value.items():
            if key not in attribute_of:
                yield f"{path}.{key}: unknown field of {openapi_type}"
            else:
                child_type = model.openapi_types[attribute_of[key]]
                yield from unknown_fields(item, child_type, f"{path}.{key}")


def schema_errors(api_client: kubernetes.client.ApiClient, obj: Obj) -> list[str]:
    """Why the official client's model rejects `obj`, or [] if it fits."""
    name = model_name(obj["apiVersion"], obj["kind"])
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    if not hasattr(kubernetes.client.models, name):
        return [f"{where}: no model {name} in the kubernetes client"]
    try:
        deserialize(api_client, obj, name)
    except (ValueError, TypeError) as error:
        return [f"{where}: {error}"]
    return list(unknown_fields(obj, name, where))


# cert-manager's CRDs are not in the client: the fields these manifests may use, by hand,
# from the cert-manager.io/v1 API reference. A name maps to its own fields, or to None.
CERTIFICATE_FIELDS = {
    "secretName": None,
    "commonName": None,
    "dnsNames": None,
    "duration": None,
    "renewBefore": None,
    "isCA": None,
    "usages": None,
    "privateKey": {"algorithm": None, "size": None, "encoding": None, "rotationPolicy": None},
    "issuerRef": {"name": None, "kind": None, "group": None},
}
ISSUER_FIELDS = {"selfSigned": {}, "ca": {"secretName": None}}


def cert_manager_errors(obj: Obj) -> list[str]:
    """Missing required fields and unknown fields of a cert-manager Issuer or Certificate."""
    where = f"{obj['kind']}/{obj['metadata']['name']}"
    errors = []
    if obj["apiVersion"] != f"{CERT_MANAGER_GROUP}/v1":
        errors.append(f"{where}: apiVersion {obj['apiVersion']}, want {CERT_MANAGER_GROUP}/v1")
    if set(obj) - {"apiVersion", "kind", "metadata", "spec"}:
        errors.append(f"{where}: unknown top-level fields {set(obj) - {'spec', 'metadata'}}")
    spec = obj.get("spec", {})
    if obj["kind"] == "Certificate":
        fields: dict[str, Any] = CERTIFICATE_FIELDS
        for required in ("secretName", "issuerRef"):
            if required not in spec:
                errors.append(f"{where}: spec.{required} is required")
        if "name" not in spec.get("issuerRef", {}):
            errors.append(f"{where}: spec.issuerRef.name is required")
        if not (spec.get("commonName") or spec.get("dnsNames")):
            errors.append(f"{where}: needs a commonName or dnsNames")
    elif obj["kind"] == "Issuer":
        fields = ISSUER_FIELDS
        if len(spec) != 1:
            errors.append(f"{where}: spec must name exactly one issuer type, has {list(spec)}")
    else:
        return [f"{where}: unexpected cert-manager kind"]
    errors.extend(_unknown_keys(spec, fields, f"{where}.spec"))
    return errors


def _unknown_keys(value: Obj, fields: dict[str, Any], path: str) -> Iterator[str]:
    for key, item in value.items():
        if key not in fields:
            yield f"{path}.{key}: unknown field"
        elif fields[key] is not None:
            yield from _unknown_keys(item, fields[key], f"{path}.{key}")


@pytest.fixture(scope="session")
def api_client() -> Iterator[kubernetes.client.ApiClient]:
    with kubernetes.client.ApiClient() as client:
        yield client


def test_every_object_fits_its_api_schema(
    rendered: Rendered, api_client: kubernetes.client.ApiClient
) -> None:
    errors = []
    for obj in rendered.objects:
        if obj["apiVersion"].startswith(f"{CERT_MANAGER_GROUP}/"):
            errors.extend(cert_manager_errors(obj))
        else:
            errors.extend(schema_errors(api_client, obj))
    assert errors == []


def _first_container(deployment: Obj) -> Obj:
    container: Obj = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


# The expected errors are patterns: before version 37 the client's models report a missing
# field in their own words and leave type checks to unknown_fields; from 37 on they are
# pydantic models, which report both.
@pytest.mark.parametrize(
    ("break_it", "expected"),
    [
        pytest.param(
            lambda d: _first_container(d).update(
                readinessProbes=_first_container(d).pop("readinessProbe")
            ),
            r"containers\[0\]\.readinessProbes: unknown field of V1Container",
            id="misspelt-field",
        ),
        pytest.param(
            lambda d: _first_container(d).pop("name"),
            r"\bname\b.*\bNone",
            id="missing-required-field",
        ),
        pytest.param(
            lambda d: d["spec"].update(replicas="3"),
            r"replicas\b.*'3'",
            id="string-for-an-int",
        ),
    ],
)
def test_schema_check_catches_broken_objects(
    break_it: Callable[[Obj], object],
    expected: str,
    render: Render,
    api_client: kubernetes.client.ApiClient,
) -> None:
    deployment = Rendered("kustomize-base", render("kustomize-base")).one("Deployment")
    assert schema_errors(api_client, deployment) == []
    break_it(deployment)
    errors = schema_errors(api_client, deployment)
    assert any(re.search(expected, error, re.DOTALL) for error in errors), errors


def test_cert_manager_check_catches_a_misspelt_field(render: Render) -> None:
    certificate = Rendered("cm", render("kustomize-cert-manager")).one("Certificate")
    assert cert_manager_errors(certificate) == []
    certificate["spec"]["renewBefor"] = certificate["spec"].pop("renewBefore")
    assert cert_manager_errors(certificate) == ["Certificate/gpuadm.spec.renewBefor: unknown field"]


# --- safe defaults --------------------------------------------------------------------------


def test_namespaced_objects_are_in_gpuadm_namespace(rendered: Rendered) -> None:
    cluster_scoped = {
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    }
    for obj in rendered.objects:
        expected = None if obj["kind"] in cluster_scoped else NAMESPACE
        assert obj["metadata"].get("namespace") == expected, obj["metadata"]["name"]


def _excluded_namespaces(webhook: Obj) -> set[str]:
    (expression,) = webhook["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name"
    assert expression["operator"] == "NotIn"
    return set(expression["values"])


def _pod_rule(*operations: str) -> Obj:
    return {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "resources": ["pods"],
        "operations": list(operations),
        "scope": "Namespaced",
    }


def _check_common_webhook_settings(webhook: Obj, path: str) -> None:
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["sideEffects"] == "NoneOnDryRun"
    assert 1 <= webhook["timeoutSeconds"] <= 10
    assert webhook["clientConfig"]["service"] == {
        "name": "gpuadm",
        "namespace": NAMESPACE,
        "path": path,
        "port": 443,
    }
    assert "url" not in webhook["clientConfig"]
    assert _excluded_namespaces(webhook) == GPU_STACK_NAMESPACES | {NAMESPACE}
    assert webhook["matchConditions"]


def test_mutating_webhook_fails_open_and_is_reinvoked(rendered: Rendered) -> None:
    (webhook,) = rendered.one("MutatingWebhookConfiguration")["webhooks"]
    assert webhook["name"] == "mutate.gpuadm.io"
    _check_common_webhook_settings(webhook, "/mutate")
    assert webhook["rules"] == [_pod_rule("CREATE")]
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["reinvocationPolicy"] == "IfNeeded"


def test_validating_webhook_fails_closed(rendered: Rendered) -> None:
    webhook, claims, config_maps = rendered.one("ValidatingWebhookConfiguration")["webhooks"]
    assert webhook["name"] == "validate.gpuadm.io"
    _check_common_webhook_settings(webhook, "/validate")
    ephemeral = {**_pod_rule("UPDATE"), "resources": ["pods/ephemeralcontainers"]}
    assert webhook["rules"] == [_pod_rule("CREATE", "UPDATE"), ephemeral]
    assert webhook["failurePolicy"] == "Fail"
    # DRA claims and templates: every create (and a template's update), no delete, no
    # condition to skip one, failing closed, in the same namespaces as pods.
    assert claims["name"] == "validate-claims.gpuadm.io"
    assert claims["clientConfig"] == webhook["clientConfig"]
    assert claims["namespaceSelector"] == webhook["namespaceSelector"]
    assert claims["rules"] == [
        {
            **_pod_rule("CREATE", "UPDATE"),
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaimtemplates"],
        },
        {**_pod_rule("CREATE"), "apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"]},
    ]
    assert "matchConditions" not in claims
    assert claims["sideEffects"] == "None"
    assert claims["failurePolicy"] == "Fail"
    # KAI's share ConfigMaps: created or updated (never deleted), in the same namespaces,
    # failing closed, and only those whose name says so (the CEL tests below).
    assert config_maps["name"] == "validate-configmaps.gpuadm.io"
    assert config_maps["clientConfig"] == webhook["clientConfig"]
    assert config_maps["namespaceSelector"] == webhook["namespaceSelector"]
    assert config_maps["rules"] == [{**_pod_rule("CREATE", "UPDATE"), "resources": ["configmaps"]}]
    assert [c["name"] for c in config_maps["matchConditions"]] == ["kai-share-configmap"]
    assert config_maps["sideEffects"] == "None"
    assert config_maps["timeoutSeconds"] == claims["timeoutSeconds"] == webhook["timeoutSeconds"]
    assert config_maps["failurePolicy"] == "Fail"


def _pod_labels(rendered: Rendered) -> dict[str, str]:
    labels: dict[str, str] = rendered.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def _selects_gpuadm_pods(selector: dict[str, str], rendered: Rendered) -> bool:
    pod_labels = _pod_labels(rendered)
    return bool(selector) and all(pod_labels.get(k) == v for k, v in selector.items())


def test_deployment_runs_three_hardened_replicas(rendered: Rendered) -> None:
    deployment = rendered.one("Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert _selects_gpuadm_pods(deployment["spec"]["selector"]["matchLabels"], rendered)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpuadm"
    assert pod["automountServiceAccountToken"] is True
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert "nodeSelector" not in pod
    assert "tolerations" not in pod
    assert "imagePullSecrets" not in pod
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (anti_affinity,) = pod["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert anti_affinity["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert _selects_gpuadm_pods(
        anti_affinity["podAffinityTerm"]["labelSelector"]["matchLabels"], rendered
    )
    for spread in pod["topologySpreadConstraints"]:
        assert _selects_gpuadm_pods(spread["labelSelector"]["matchLabels"], rendered)

    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/gpuadm/gpuadm:0.3.0-rc.1"
    serve = ["gpuadm", "serve", "--gpuadm-namespace", "$(POD_NAMESPACE)", "--log-level", "info"]
    # A replica drains before it stops, well within its grace period.
    serve += ["--shutdown-delay-seconds", "5"]
    assert pod["terminationGracePeriodSeconds"] == 30
    mounted = ["--cert-file", "/etc/gpuadm/tls/tls.crt", "--key-file", "/etc/gpuadm/tls/tls.key"]
    managed = ["--manage-tls", "--tls-dir", "/tmp/tls"]
    mounting = rendered.name in MOUNTING_THE_SECRET
    client_auth = ["--client-ca-file", "/etc/gpuadm/client-ca/ca.crt"]
    expected = serve + (mounted if mounting else managed)
    if rendered.name in WITH_CLIENT_AUTH:
        expected += client_auth
    assert container["command"] == expected
    assert container["env"] == [
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    ]
    assert container["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "512Mi"},
    }
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    if mounting:
        assert mounts["tls"] == {"name": "tls", "mountPath": "/etc/gpuadm/tls", "readOnly": True}
        assert volumes["tls"]["secret"] == {"secretName": "gpuadm-tls"}
    else:
        assert "tls" not in mounts
        assert "tls" not in volumes
    assert mounts["tmp"]["mountPath"] == "/tmp"
    assert "emptyDir" in volumes["tmp"]


def test_pod_disruption_budget_keeps_two_replicas_up(rendered: Rendered) -> None:
    spec = rendered.one("PodDisruptionBudget")["spec"]
    assert spec.get("maxUnavailable") == 1 or spec.get("minAvailable") == 2
    assert _selects_gpuadm_pods(spec["selector"]["matchLabels"], rendered)


def test_service_sends_443_to_the_webhook_port(rendered: Rendered) -> None:
    spec = rendered.one("Service")["spec"]
    assert spec["ports"] == [{"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}]
    assert _selects_gpuadm_pods(spec["selector"], rendered)


def _rules(role: Obj) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    """Rules flattened to (apiGroup, resource, resourceNames, sorted verbs), sorted."""
    return sorted(
        (group, resource, tuple(rule.get("resourceNames", ())), tuple(sorted(rule["verbs"])))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    )


READ = ("get", "list", "watch")
# What every variant grants: each rule is one or more calls of gpuadm serve
# (docs/deploy.md#permissions names them).
SERVE_CLUSTER_RULES = [
    ("", "namespaces", (), ("get",)),
    ("", "pods", (), ("get", "list", "patch", "watch")),
    ("", "pods/eviction", (), ("create",)),
    ("", "events", (), ("create", "get", "update")),
    ("batch", "jobs", (), ("get",)),
    ("gpuadm.io", "gpuquotas", (), ("create", "delete", "get", "list", "update")),
    ("resource.k8s.io", "resourceclaims", (), ("get",)),
    ("scheduling.run.ai", "podgroups", (), ("get",)),
    ("scheduling.volcano.sh", "podgroups", (), ("get",)),
    ("scheduling.x-k8s.io", "podgroups", (), ("get",)),
    ("resource.k8s.io", "resourceclaimtemplates", (), ("create", "delete", "get", "list")),
]
# What the Helm chart's uninstall Job holds, as its own account gpuadm-uninstall, for what
# `gpuadm uninstall` calls: gpuadm's two webhook configurations deleted, by name; every pod
# listed, and gpuadm's gate patched away (get: a pod that changed meanwhile is read again);
# and the policy read, for the gate's domain, in gpuadm's namespace only.
HOOK_CLUSTER_RULES = [
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations", ("gpuadm",), ("delete",)),
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations", ("gpuadm",), ("delete",)),
    ("", "pods", (), ("get", "list", "patch")),
]
HOOK_NAMESPACE_RULES = [("", "configmaps", ("gpuadm-policy",), ("get",))]
SERVE_NAMESPACE_RULES = [
    ("", "configmaps", (), ("create", "delete", "get", "list", "update", "watch")),
    ("coordination.k8s.io", "leases", ("gpuadm-leader",), ("get", "update")),
    ("coordination.k8s.io", "leases", (), ("create",)),
]
# Only when gpuadm keeps its own TLS (serve --manage-tls): the caBundles and the Secret.
MANAGE_TLS_CLUSTER_RULES = [
    (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        ("gpuadm",),
        ("get", "update"),
    ),
    (
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        ("gpuadm",),
        ("get", "update"),
    ),
]
MANAGE_TLS_NAMESPACE_RULES = [
    ("", "secrets", ("gpuadm-tls",), ("get", "update")),
    ("", "secrets", (), ("create",)),
]
TLS_RESOURCES = {"secrets", "mutatingwebhookconfigurations", "validatingwebhookconfigurations"}


def _check_binding(
    rendered: Rendered, kind: str, role: str, account: str = "gpuadm", namespace: str = NAMESPACE
) -> None:
    binding = rendered.one(f"{kind}Binding", role)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": kind,
        "name": role,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    ]


def _grants_of(rendered: Rendered, account: str) -> set[tuple[str, str, str]]:
    """(kind of role, resource, verb) for every grant of the roles bound to the
    ServiceAccount `account` of gpuadm's namespace, whatever the roles' names."""
    subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    return {
        (binding["roleRef"]["kind"], resource, verb)
        for kind in ("ClusterRoleBinding", "RoleBinding")
        for binding in rendered.all(kind)
        if subject in binding["subjects"]
        for _, resource, _, verbs in _rules(
            rendered.one(binding["roleRef"]["kind"], binding["roleRef"]["name"])
        )
        for verb in verbs
    }


def test_rbac_grants_exactly_what_gpuadm_needs(rendered: Rendered) -> None:
    assert _rules(rendered.one("ClusterRole")) == sorted(SERVE_CLUSTER_RULES)
    assert _rules(rendered.one("Role")) == sorted(SERVE_NAMESPACE_RULES)
    for kind in ("ClusterRole", "Role"):
        _check_binding(rendered, kind, "gpuadm")
    managing = rendered.name not in MOUNTING_THE_SECRET
    if managing:
        assert _rules(rendered.one("ClusterRole", "gpuadm-manage-tls")) == sorted(
            MANAGE_TLS_CLUSTER_RULES
        )
        assert _rules(rendered.one("Role", "gpuadm-manage-tls")) == sorted(
            MANAGE_TLS_NAMESPACE_RULES
        )
        for kind in ("ClusterRole", "Role"):
            _check_binding(rendered, kind, "gpuadm-manage-tls")
    # Serving a Secret that cert-manager or the admin keeps, gpuadm can neither read nor
    # write any Secret, nor read or change a webhook configuration. In no variant may it
    # delete one: only the Helm chart's uninstall Job may, as an account of its own.
    rbac_kinds = ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")
    manage_tls = [o for o in rendered.objects if o["metadata"]["name"] == "gpuadm-manage-tls"]
    assert len(manage_tls) == (4 if managing else 0)
    assert all(o["kind"] in rbac_kinds for o in manage_tls)
    granted = {
        (resource, verb)
        for _, resource, verb in _grants_of(rendered, "gpuadm")
        if resource in TLS_RESOURCES
    }
    keeping_tls = {(resource, verb) for resource in TLS_RESOURCES for verb in ("get", "update")}
    assert granted == ({*keeping_tls, ("secrets", "create")} if managing else set())
    # The replicas' account is bound to gpuadm's roles alone.
    bound = {
        (binding["kind"], binding["metadata"]["name"])
        for kind in ("ClusterRoleBinding", "RoleBinding")
        for binding in rendered.all(kind)
        if {"kind": "ServiceAccount", "name": "gpuadm", "namespace": NAMESPACE}
        in binding["subjects"]
    }
    names = {"gpuadm", "gpuadm-manage-tls"} if managing else {"gpuadm"}
    assert bound == {
        (kind, name) for kind in ("ClusterRoleBinding", "RoleBinding") for name in names
    }
    # Tenants read GPUQuota objects through view, edit and admin, and can do nothing more.
    viewer = rendered.one("ClusterRole", "gpuadm-quota-view")
    assert _rules(viewer) == [("gpuadm.io", "gpuquotas", (), READ)]
    assert {
        f"rbac.authorization.k8s.io/aggregate-to-{role}" for role in ("view", "edit", "admin")
    } <= {k for k, v in viewer["metadata"]["labels"].items() if v == "true"}
    for kind in ("ClusterRole", "Role"):
        for role in rendered.all(kind):
            for group, resource, _, verbs in _rules(role):
                assert "*" not in (group, resource, *verbs)
    assert rendered.one("ServiceAccount")


def test_helm_serves_a_secret_of_the_admins_own_naming(render: Render) -> None:
    rendered = Rendered("helm", render("helm", "--set", "tls.existingSecret=my-tls"))
    pod_spec = rendered.one("Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "tls"]
    assert volume["secret"] == {"secretName": "my-tls"}
    assert "--cert-file" in pod_spec["containers"][0]["command"]
    assert [o for o in rendered.objects if o["metadata"]["name"] == "gpuadm-manage-tls"] == []
    monitored = Rendered(
        "helm",
        render(
            "helm",
            "--set",
            "tls.existingSecret=my-tls",
            "--set",
            "monitoring.serviceMonitor.enabled=true",
        ),
    )
    (endpoint,) = monitored.one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "my-tls", "key": "ca.crt"}


WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
# A CA as an admin's ca.crt holds it; the chart checks only that it is PEM.
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBfakefakefake\n-----END CERTIFICATE-----\n"


def _ca_bundles(rendered: Rendered) -> list[str | None]:
    """The caBundle of each webhook of both configurations, None where there is none."""
    return [
        webhook["clientConfig"].get("caBundle")
        for kind in WEBHOOK_KINDS
        for webhook in rendered.one(kind)["webhooks"]
    ]


def test_no_variant_sets_a_ca_bundle(rendered: Rendered) -> None:
    """gpuadm, cert-manager's CA injector or the admin writes it, and an apply or upgrade
    leaves what they wrote in place."""
    bundles = _ca_bundles(rendered)
    assert len(bundles) == 4
    assert set(bundles) == {None}


def test_helm_puts_the_ca_of_the_admins_secret_in_every_webhook(
    render: Render, tmp_path: Path
) -> None:
    """With tls.caBundle, no webhook is left to patch by hand: the claims and ConfigMaps
    webhooks, the validating configuration's second and third, fail closed like the first."""
    bundle = base64.b64encode(CA_PEM.encode()).decode()
    values = tmp_path / "ca.yaml"
    values.write_text(yaml.safe_dump({"tls": {"existingSecret": "my-tls", "caBundle": bundle}}))
    rendered = Rendered("helm", render("helm", "-f", str(values)))
    without = Rendered("helm", render("helm", "--set", "tls.existingSecret=my-tls"))
    assert _ca_bundles(rendered) == [bundle] * len(_ca_bundles(without))
    # And nothing else changes.
    for kind in WEBHOOK_KINDS:
        configuration = rendered.one(kind)
        for webhook in configuration["webhooks"]:
            del webhook["clientConfig"]["caBundle"]
        assert configuration == without.one(kind)


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        pytest.param({}, "is set only with it", id="gpuadm-keeps-the-tls"),
        pytest.param({"certManager": {"enabled": True}}, "is set only with it", id="cert-manager"),
        pytest.param(
            {"tls": {"existingSecret": "my-tls", "caBundle": "aGVsbG8="}},
            "is not the base64 of a PEM certificate",
            id="not-pem",
        ),
        pytest.param(
            {"tls": {"existingSecret": "my-tls", "caBundle": CA_PEM}},
            "values don't meet the specifications of the schema",
            id="pem-not-base64",
        ),
    ],
)
def test_helm_refuses_a_ca_bundle_it_cannot_use(
    render: Render, tmp_path: Path, settings: dict[str, Any], why: str
) -> None:
    values: dict[str, Any] = {"tls": {"caBundle": base64.b64encode(CA_PEM.encode()).decode()}}
    for key, value in settings.items():
        values[key] = {**values.get(key, {}), **value}
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    with pytest.raises(AssertionError, match=re.escape(why)):
        render("helm", "-f", str(path))


def test_helm_refuses_two_keepers_of_the_certificate(render: Render) -> None:
    with pytest.raises(AssertionError, match=r"certManager\.enabled and tls\.existingSecret both"):
        render("helm", "--set", "certManager.enabled=true", "--set", "tls.existingSecret=x")


def test_network_policy_allows_the_webhook_port_apiserver_and_dns_only(
    rendered: Rendered,
) -> None:
    spec = rendered.one("NetworkPolicy")["spec"]
    assert _selects_gpuadm_pods(spec["podSelector"]["matchLabels"], rendered)
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert spec["ingress"] == [{"ports": [{"port": 8443, "protocol": "TCP"}]}]
    egress_ports = sorted(
        (port["port"], port["protocol"]) for rule in spec["egress"] for port in rule["ports"]
    )
    assert egress_ports == [(53, "TCP"), (53, "UDP"), (443, "TCP"), (6443, "TCP")]


def test_configmaps_hold_the_example_config(rendered: Rendered) -> None:
    for name, key in (("gpuadm-policy", "policy.yaml"), ("gpuadm-quotas", "quotas.yaml")):
        data = rendered.one("ConfigMap", name)["data"]
        assert list(data) == [key]
        assert yaml.safe_load(data[key]) == yaml.safe_load((EXAMPLES / key).read_text())


def _exempt_namespaces(rendered: Rendered) -> list[str]:
    policy = yaml.safe_load(rendered.one("ConfigMap", "gpuadm-policy")["data"]["policy.yaml"])
    exempt: list[str] = policy["exemptNamespaces"]
    return exempt


def test_the_gpu_stacks_and_gpuadm_are_exempt_by_default(rendered: Rendered) -> None:
    assert set(_exempt_namespaces(rendered)) == GPU_STACK_NAMESPACES | {NAMESPACE}


def test_the_webhooks_skip_every_namespace_the_policy_exempts(rendered: Rendered) -> None:
    """gpuadm passes an exempt namespace's pods unchanged, so the apiserver need not wait on it
    for them: kustomize's two hand-kept lists, the policy's and the webhooks', must agree."""
    exempt = set(_exempt_namespaces(rendered))
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for webhook in rendered.one(kind)["webhooks"]:
            assert _excluded_namespaces(webhook) == exempt, webhook["name"]


def test_helm_exempts_what_the_admin_lists_and_always_skips_kube_system(render: Render) -> None:
    rendered = Rendered("helm", render("helm", "--set", "policy.exemptNamespaces={gpu-stack}"))
    assert _exempt_namespaces(rendered) == ["gpu-stack", NAMESPACE]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for webhook in rendered.one(kind)["webhooks"]:
            # webhook.excludedNamespaces: never sent, even when the policy stops exempting it.
            assert _excluded_namespaces(webhook) == {"kube-system", "gpu-stack", NAMESPACE}


def test_helm_and_kustomize_ship_one_gpuquota_crd() -> None:
    """Kustomize installs deploy/base/crd.yaml; the chart, the same CRD as a template that
    `helm upgrade` upgrades and `helm uninstall` keeps."""
    chart = yaml.safe_load((REPO / "deploy/helm/gpuadm/templates/gpuquota-crd.yaml").read_text())
    base = yaml.safe_load((REPO / "deploy/base/crd.yaml").read_text())
    assert chart["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert chart == base
    assert not (REPO / "deploy/helm/gpuadm/crds").exists()


@pytest.mark.parametrize("key", ["policy.yaml", "quotas.yaml"])
def test_kustomize_config_copies_match_the_examples(key: str) -> None:
    copied = REPO / "deploy" / "base" / "config" / key
    assert copied.read_text() == (EXAMPLES / key).read_text(), (
        f"{copied.relative_to(REPO)} has drifted from examples/{key}: copy it again"
    )


def test_cert_manager_issues_the_serving_certificate(rendered: Rendered) -> None:
    inject = "cert-manager.io/inject-ca-from"
    webhook_configs = [
        rendered.one("MutatingWebhookConfiguration"),
        rendered.one("ValidatingWebhookConfiguration"),
    ]
    if rendered.name not in WITH_CERT_MANAGER:
        assert rendered.all("Certificate") == rendered.all("Issuer") == []
        for config in webhook_configs:
            assert inject not in config["metadata"].get("annotations", {})
        return
    for config in webhook_configs:
        assert config["metadata"]["annotations"][inject] == f"{NAMESPACE}/gpuadm"
    serving = rendered.one("Certificate", "gpuadm")["spec"]
    assert serving["secretName"] == "gpuadm-tls"
    assert serving["dnsNames"] == [
        "gpuadm",
        f"gpuadm.{NAMESPACE}",
        f"gpuadm.{NAMESPACE}.svc",
        f"gpuadm.{NAMESPACE}.svc.cluster.local",
    ]
    assert serving["privateKey"]["algorithm"] == "ECDSA"
    assert serving["privateKey"]["size"] == 256
    assert (serving["duration"], serving["renewBefore"]) == ("8760h", "2920h")
    # The chain: self-signed issuer -> CA certificate -> CA issuer -> serving certificate.
    ca_issuer = rendered.one("Issuer", serving["issuerRef"]["name"])["spec"]
    ca = next(
        c["spec"]
        for c in rendered.all("Certificate")
        if c["spec"]["secretName"] == ca_issuer["ca"]["secretName"]
    )
    assert ca["isCA"] is True
    assert rendered.one("Issuer", ca["issuerRef"]["name"])["spec"] == {"selfSigned": {}}


# --- kustomize and Helm agree -----------------------------------------------------------------


def _comparable(obj: Obj) -> Obj:
    """An object without what may differ between renders: labels, YAML and CEL layout."""
    obj = copy.deepcopy(obj)
    obj["metadata"].pop("labels", None)
    # Helm's alone: the CRD kept through `helm uninstall` (kustomize's delete deletes it).
    annotations = obj["metadata"].get("annotations") or {}
    if annotations.pop("helm.sh/resource-policy", None) == "keep" and not annotations:
        del obj["metadata"]["annotations"]
    if obj["kind"] == "Deployment":
        obj["spec"]["template"]["metadata"].pop("labels")
    if obj["kind"] == "ConfigMap":
        obj["data"] = {key: yaml.safe_load(text) for key, text in obj["data"].items()}
    for webhook in obj.get("webhooks", []):
        for condition in webhook.get("matchConditions", []):
            condition["expression"] = " ".join(condition["expression"].split())
    return obj


def _hook(obj: Obj) -> str | None:
    """The Helm hook an object is (`pre-delete`...), or None for an object of the release."""
    hook: str | None = (obj["metadata"].get("annotations") or {}).get("helm.sh/hook")
    return hook


@pytest.mark.parametrize(("kustomize", "helm"), COUNTERPARTS)
def test_kustomize_and_helm_render_the_same_objects(
    kustomize: str, helm: str, render: Render
) -> None:
    # Helm leaves the namespace to `--create-namespace`, and runs its uninstall hook and its
    # config check, which kustomize has no way to express (docs/deploy.md#uninstall has the
    # admin run `gpuadm uninstall` first instead, and `gpuadm check-config` runs on the
    # overlay's files); everything else must match.
    def by_key(name: str) -> dict[tuple[str, str], Obj]:
        return {
            (o["kind"], o["metadata"]["name"]): _comparable(o)
            for o in render(name)
            if o["kind"] != "Namespace" and not _hook(o)
        }

    from_kustomize, from_helm = by_key(kustomize), by_key(helm)
    assert sorted(from_kustomize) == sorted(from_helm)
    for key, obj in from_kustomize.items():
        assert obj == from_helm[key], f"{key} differs"
    # What was left out of Helm's side is its two hooks, and nothing else.
    assert not [o for o in render(kustomize) if _hook(o)]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in render(helm) if _hook(o)) == sorted(
        [(kind, "gpuadm-uninstall") for kind in HOOK_KINDS] + CONFIG_CHECK_HOOK
    )


# --- the uninstall hook (Helm only) -------------------------------------------------------------

# Everything of the hook, each named gpuadm-uninstall: the Job, and what it needs first.
HOOK_KINDS = {
    "Job",
    "NetworkPolicy",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
}


# The config check before install and upgrade (tests/deploy/test_chart.py): its ConfigMap and
# its Job.
CONFIG_CHECK_HOOK = [("ConfigMap", "gpuadm-config-check"), ("Job", "gpuadm-config-check")]


def _uninstall_job(rendered: Rendered) -> Obj:
    return rendered.one("Job", "gpuadm-uninstall")


@pytest.mark.parametrize("name", [n for n in RENDERS if n.startswith("helm")])
def test_helm_uninstall_runs_gpuadm_uninstall_first_as_the_replicas_run(
    name: str, render: Render
) -> None:
    """`helm uninstall` deletes webhook configurations last: the pre-delete Job deletes them
    first and lifts gpuadm's gate, with the replicas' image, account, placement and security."""
    rendered = Rendered(name, render(name))
    job = _uninstall_job(rendered)
    assert job["metadata"]["annotations"] == {
        "helm.sh/hook": "pre-delete",
        "helm.sh/hook-weight": "0",
        "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
    }
    spec = job["spec"]
    assert 0 < spec["backoffLimit"] <= 3
    # Given up on before helm's own 5-minute wait for the hook.
    assert 0 < spec["activeDeadlineSeconds"] < 300
    pod = spec["template"]["spec"]
    replicas = rendered.one("Deployment")["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    # Its own account, not the replicas' (test_helm_uninstall_hook_holds_what_it_calls).
    assert pod["serviceAccountName"] == "gpuadm-uninstall"
    assert pod["automountServiceAccountToken"] is True
    for key in ("securityContext", "priorityClassName"):
        assert pod[key] == replicas[key], key
    # Not the replicas' anti-affinity against gpuadm's pods: the default has nothing else.
    assert replicas["affinity"]["podAntiAffinity"]
    assert "affinity" not in pod
    (container,) = pod["containers"]
    (serving,) = replicas["containers"]
    assert container["command"] == ["gpuadm", "uninstall", "--gpuadm-namespace", NAMESPACE]
    for key in ("image", "imagePullPolicy", "securityContext"):
        assert container[key] == serving[key], key
    assert container["resources"] == {
        "requests": {"cpu": "50m", "memory": "96Mi"},
        "limits": {"memory": "256Mi"},
    }
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    # Neither the Service, the PodDisruptionBudget nor the replicas' NetworkPolicy selects
    # the Job's pod: it serves nothing, and is not a replica.
    labels = spec["template"]["metadata"]["labels"]
    for selector in (
        rendered.one("Service")["spec"]["selector"],
        rendered.one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        rendered.one("NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
    ):
        assert not all(labels.get(k) == v for k, v in selector.items())
    # Its own NetworkPolicy, made before it: the apiserver and DNS out, nothing in.
    policy = rendered.one("NetworkPolicy", "gpuadm-uninstall")
    assert policy["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    assert int(policy["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert "ingress" not in policy["spec"]
    assert policy["spec"]["egress"] == rendered.one("NetworkPolicy")["spec"]["egress"]


def test_helm_uninstall_hook_follows_the_release_namespace_and_can_be_left_out(
    render: Render,
) -> None:
    moved = Rendered("helm", render("helm", "--namespace", "gpu-admission"))
    command = _uninstall_job(moved)["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == ["gpuadm", "uninstall", "--gpuadm-namespace", "gpu-admission"]
    no_policy = Rendered("helm", render("helm", "--set", "networkPolicy.enabled=false"))
    assert _uninstall_job(no_policy)
    assert no_policy.all("NetworkPolicy") == []
    off = render("helm", "--set", "uninstallHook.enabled=false")
    assert [o for o in off if _hook(o) == "pre-delete"] == []
    assert sorted((o["kind"], o["metadata"]["name"]) for o in off if _hook(o)) == (
        CONFIG_CHECK_HOOK
    )
    # No account or role of the hook's either, and gpuadm's own stay as they are.
    assert [o for o in off if o["metadata"]["name"] == "gpuadm-uninstall"] == []
    assert _rules(Rendered("helm", off).one("ClusterRole")) == sorted(SERVE_CLUSTER_RULES)


@pytest.mark.parametrize("name", [n for n in RENDERS if n.startswith("helm")])
def test_helm_uninstall_hook_holds_what_it_calls(name: str, render: Render) -> None:
    """The Job runs as an account of its own, made just before it with its roles, and
    deleted with them once it has succeeded: the one account that may delete gpuadm's
    webhook configurations lives only while `helm uninstall` runs."""
    rendered = Rendered(name, render(name))
    hook = {
        (o["kind"], o["metadata"]["name"]): o
        for o in rendered.objects
        if _hook(o) and o["metadata"]["name"] == "gpuadm-uninstall"
    }
    assert set(hook) == {(kind, "gpuadm-uninstall") for kind in HOOK_KINDS}
    job_weight = int(_uninstall_job(rendered)["metadata"]["annotations"]["helm.sh/hook-weight"])
    for (kind, _), obj in hook.items():
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete", kind
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        if kind != "Job":
            assert int(annotations["helm.sh/hook-weight"]) < job_weight, kind
    assert rendered.one("ServiceAccount", "gpuadm-uninstall")["metadata"]["namespace"] == NAMESPACE
    assert _rules(rendered.one("ClusterRole", "gpuadm-uninstall")) == sorted(HOOK_CLUSTER_RULES)
    assert _rules(rendered.one("Role", "gpuadm-uninstall")) == sorted(HOOK_NAMESPACE_RULES)
    for kind in ("ClusterRole", "Role"):
        _check_binding(rendered, kind, "gpuadm-uninstall", account="gpuadm-uninstall")
    # Bound to nothing else, and nothing else to its roles.
    assert _grants_of(rendered, "gpuadm-uninstall") == {
        (kind, resource, verb)
        for kind, rules in (("ClusterRole", HOOK_CLUSTER_RULES), ("Role", HOOK_NAMESPACE_RULES))
        for _, resource, _, verbs in rules
        for verb in verbs
    }
    # Of every account the chart makes, the hook's alone may delete a webhook configuration.
    deleters = {
        account["metadata"]["name"]
        for account in rendered.all("ServiceAccount")
        if any(
            verb == "delete" and resource.endswith("webhookconfigurations")
            for _, resource, verb in _grants_of(rendered, account["metadata"]["name"])
        )
    }
    assert deleters == {"gpuadm-uninstall"}


def test_helm_follows_the_release_namespace(render: Render) -> None:
    rendered = Rendered("helm", render("helm", "--namespace", "gpu-admission"))
    for obj in rendered.objects:
        assert obj["metadata"].get("namespace") in (None, "gpu-admission")
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for webhook in rendered.one(kind)["webhooks"]:
            assert webhook["clientConfig"]["service"]["namespace"] == "gpu-admission"
            assert _excluded_namespaces(webhook) == GPU_STACK_NAMESPACES | {"gpu-admission"}
    assert set(_exempt_namespaces(rendered)) == GPU_STACK_NAMESPACES | {"gpu-admission"}
    for role in ("gpuadm", "gpuadm-uninstall"):
        (subject,) = rendered.one("ClusterRoleBinding", role)["subjects"]
        assert subject["namespace"] == "gpu-admission"


def test_helm_can_narrow_the_webhooks_to_one_namespace(render: Render) -> None:
    rendered = Rendered("helm", render("helm", "--set", "webhook.onlyNamespaces={team-a}"))
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for webhook in rendered.one(kind)["webhooks"]:
            assert webhook["namespaceSelector"] == {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}
                ]
            }


@pytest.mark.parametrize("namespace", ["kube-system", "gpu-operator", NAMESPACE])
def test_helm_refuses_to_narrow_the_webhooks_to_an_excluded_namespace(
    render: Render, namespace: str
) -> None:
    with pytest.raises(AssertionError, match=f'"{namespace}" is never sent to gpuadm'):
        render("helm", "--set", f"webhook.onlyNamespaces={{team-a,{namespace}}}")


def test_helm_refuses_a_resource_name_that_would_break_the_cel(render: Render) -> None:
    with pytest.raises(AssertionError, match="is not a resource name or prefix"):
        render("helm", "--set", "gpuResources.extraNames={example.com/gpu'}")


# --- the CEL of the matchConditions ------------------------------------------------------------

CEL_ENV = cel.NewEnv(variables={name: cel.Type.DYN for name in ("object", "oldObject", "request")})


def sent_to_webhook(
    webhook: Obj, operation: str, new: Obj | None, old: Obj | None, *, sub_resource: str = ""
) -> bool:
    """Whether every matchCondition holds, as the apiserver decides whether to call."""
    # The apiserver leaves out a subResource that is empty: reading it is then an error.
    request = {"operation": operation, **({"subResource": sub_resource} if sub_resource else {})}
    data = {"object": new, "oldObject": old, "request": request}
    results = []
    for condition in webhook["matchConditions"]:
        value = CEL_ENV.compile(condition["expression"]).eval(data=data)
        # An error is not false: the apiserver would apply the failurePolicy to it.
        assert value.type() == cel.Type.BOOL, f"{condition['name']}: {value.value()}"
        results.append(value.value())
    return all(results)


def container(*, limits: Obj | None = None, requests: Obj | None = None) -> Obj:
    resources = {"limits": limits, "requests": requests}
    return {
        "name": "main",
        "image": "busybox",
        "resources": {k: v for k, v in resources.items() if v is not None},
    }


def pod(
    *containers: Obj,
    init: tuple[Obj, ...] = (),
    labels: Obj | None = None,
    annotations: Obj | None = None,
) -> Obj:
    spec: Obj = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    metadata: Obj = {"name": "p", "namespace": "team-a"}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


CPU_ONLY = pod(container(limits={"cpu": "1", "memory": "1Gi"}))
GPU_POD = pod(container(limits={"nvidia.com/gpu": "1"}, requests={"nvidia.com/gpu": "1"}))

CREATE_CASES = [
    pytest.param(pod(container(limits={"gpuadm.io/a100": "0.5"})), True, id="class-share"),
    pytest.param(
        pod(container(requests={"gpuadm.io/t4-memory": "4Gi"})), True, id="class-memory-in-requests"
    ),
    pytest.param(
        pod(container(limits={"cpu": "1"}), init=(container(limits={"nvidia.com/gpu": "1"}),)),
        True,
        id="nvidia-gpu-in-init-container",
    ),
    pytest.param(
        pod(container(limits={"nvidia.com/mig-1g.10gb": "1"})), True, id="mig-profile-prefix"
    ),
    pytest.param(
        pod(container(limits={"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"})),
        True,
        id="dra-extended-resource",
    ),
    *(
        pytest.param(pod(container(limits={name: "1"})), True, id=f"raw-{name}")
        for name in GPU_RESOURCE_NAMES
    ),
    pytest.param(CPU_ONLY, False, id="cpu-only"),
    pytest.param(pod(container()), False, id="no-resources"),
    pytest.param(
        pod(container(limits={"example.com/fpga": "1", "nvidia.com/gpus": "1"})),
        False,
        id="near-miss-names",
    ),
    pytest.param(
        pod(container(limits={"cpu": "1"}), labels={"gpuadm.io/class": "a100"}),
        False,
        id="gpuadm-label-but-no-gpu-resource",
    ),
    pytest.param(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}},
        False,
        id="no-containers-field",
    ),
    pytest.param(
        {**CPU_ONLY, "spec": {**CPU_ONLY["spec"], "resourceClaims": [{"name": "gpu"}]}},
        True,
        id="dra-claim",
    ),
    pytest.param(
        {**CPU_ONLY, "spec": {**CPU_ONLY["spec"], "resourceClaims": []}},
        False,
        id="no-dra-claim",
    ),
]


@pytest.fixture(params=["kustomize-base", "helm"])
def webhooks(request: pytest.FixtureRequest, render: Render) -> tuple[Obj, Obj]:
    """The mutating and the validating webhook of one render."""
    rendered = Rendered(request.param, render(request.param))
    (mutating,) = rendered.one("MutatingWebhookConfiguration")["webhooks"]
    validating = rendered.one("ValidatingWebhookConfiguration")["webhooks"][0]
    return mutating, validating


@pytest.mark.parametrize(("new", "expected"), CREATE_CASES)
def test_create_reaches_both_webhooks_only_for_gpu_pods(
    new: Obj, expected: bool, webhooks: tuple[Obj, Obj]
) -> None:
    mutating, validating = webhooks
    assert sent_to_webhook(mutating, "CREATE", new, None) is expected
    assert sent_to_webhook(validating, "CREATE", new, None) is expected


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(
            pod(container(), labels={"gpuadm.io/class": "a100"}),
            pod(container()),
            True,
            id="label-removed",
        ),
        pytest.param(
            CPU_ONLY,
            pod(container(), annotations={"gpuadm.io/demand": "a100=4"}),
            True,
            id="annotation-forged",
        ),
        pytest.param(
            pod(container(), annotations={"gpuadm.io/class": "t4"}),
            pod(container(), annotations={"gpuadm.io/class": "t4"}, labels={"team": "x"}),
            True,
            id="other-edit-of-a-gpuadm-pod",
        ),
        pytest.param(GPU_POD, GPU_POD, False, id="gpu-pod-without-gpuadm-keys"),
        pytest.param(
            pod(container(), labels={"app": "x"}, annotations={"example.com/gpuadm.io": "x"}),
            pod(container(), labels={"app": "y"}),
            False,
            id="no-gpuadm-keys",
        ),
    ],
)
def test_update_reaches_the_validating_webhook_only_for_gpuadm_keys(
    old: Obj, new: Obj, expected: bool, webhooks: tuple[Obj, Obj]
) -> None:
    _, validating = webhooks
    assert sent_to_webhook(validating, "UPDATE", new, old) is expected


def test_removing_gpuadms_scheduling_gate_reaches_the_validating_webhook(
    webhooks: tuple[Obj, Obj],
) -> None:
    """A pod waiting in line has no gpuadm label of its own to give the update away."""
    _, validating = webhooks
    gated = copy.deepcopy(CPU_ONLY)
    gated["spec"]["schedulingGates"] = [{"name": "example.com/other"}, {"name": "gpuadm.io/quota"}]
    released = copy.deepcopy(gated)
    released["spec"]["schedulingGates"] = [{"name": "example.com/other"}]
    assert sent_to_webhook(validating, "UPDATE", released, gated) is True
    assert sent_to_webhook(validating, "UPDATE", released, released) is False


def test_match_conditions_survive_a_missing_object(webhooks: tuple[Obj, Obj]) -> None:
    mutating, validating = webhooks
    assert sent_to_webhook(mutating, "DELETE", None, GPU_POD) is False
    assert sent_to_webhook(validating, "UPDATE", None, None) is False


# The guard (policies/access/guard/) denies GPU access outside resources in pods of any kind, so
# the webhooks must see every pod it would deny, and still no other pod.
GUARD_POLICY = load_policy(POLICY_YAML)
VISIBLE_ALL = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]


def with_spec(base: Obj, **fields: Any) -> Obj:
    """A copy of `base` with more (or other) spec fields."""
    changed = copy.deepcopy(base)
    changed["spec"].update(fields)
    return changed


def with_env(env: list[Obj]) -> Obj:
    return {**container(limits={"cpu": "1"}), "name": "app", "env": env}


def host_path(path: str) -> Obj:
    return with_spec(CPU_ONLY, volumes=[{"name": "v", "hostPath": {"path": path}}])


def denied_by_guard(body: Obj) -> bool:
    try:
        check_guard(body, GUARD_POLICY, None)
    except Denial:
        return True
    return False


GUARD_CREATE_CASES = [
    pytest.param(pod(with_env(VISIBLE_ALL)), True, id="visible-devices-in-a-container"),
    pytest.param(
        pod(container(limits={"cpu": "1"}), init=(with_env(VISIBLE_ALL),)),
        True,
        id="visible-devices-in-an-init-container",
    ),
    pytest.param(
        with_spec(CPU_ONLY, ephemeralContainers=[with_env(VISIBLE_ALL)]),
        True,
        id="visible-devices-in-an-ephemeral-container",
    ),
    pytest.param(
        pod(with_env([{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {}}}])),
        True,
        id="visible-devices-from-a-configmap",
    ),
    # Sent whatever the value: gpuadm, not the CEL, tells void from all.
    pytest.param(
        pod(with_env([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}])), True, id="void"
    ),
    pytest.param(
        pod(
            with_env(
                [
                    {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
                    {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"},
                    {"name": "nvidia_visible_devices", "value": "all"},
                    {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
                ]
            )
        ),
        False,
        id="other-variables",
    ),
    pytest.param(pod(with_env([{"value": "all"}])), False, id="env-entry-without-a-name"),
    pytest.param(
        with_spec(
            CPU_ONLY,
            volumes=[{"name": "a", "emptyDir": {}}, {"name": "b", "configMap": {"name": "c"}}],
        ),
        False,
        id="volumes-without-a-host-path",
    ),
    pytest.param(
        with_spec(CPU_ONLY, volumes=[{"name": "v", "hostPath": {}}]),
        False,
        id="host-path-without-a-path",
    ),
    # Isolation switches and privilege matter in GPU pods only, which are sent anyway.
    pytest.param(
        pod({**container(limits={"cpu": "1"}), "securityContext": {"privileged": True}}),
        False,
        id="privileged-without-gpus",
    ),
    pytest.param(
        with_spec(GPU_POD, containers=[{**GPU_POD["spec"]["containers"][0], "env": VISIBLE_ALL}]),
        True,
        id="gpu-pod-with-visible-devices",
    ),
]


@pytest.mark.parametrize(("new", "expected"), GUARD_CREATE_CASES)
def test_create_reaches_both_webhooks_for_gpu_access_outside_resources(
    new: Obj, expected: bool, webhooks: tuple[Obj, Obj]
) -> None:
    mutating, validating = webhooks
    assert sent_to_webhook(mutating, "CREATE", new, None) is expected
    assert sent_to_webhook(validating, "CREATE", new, None) is expected
    if denied_by_guard(new):
        assert expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/dev/nvidia0", True, id="a-gpu"),
        pytest.param("/dev/nvidiactl", True, id="control-device"),
        pytest.param("/dev/nvidia-uvm", True, id="uvm"),
        pytest.param("/dev/nvidia-caps/nvidia-cap1", True, id="mig-capability"),
        pytest.param("//dev//nvidia0", True, id="doubled-slashes"),
        pytest.param("/dev/./nvidia0", True, id="dot-segment"),
        pytest.param("/./dev/nvidia0/", True, id="leading-dot"),
        pytest.param("dev/nvidia0", True, id="relative"),
        pytest.param("/dev/null", False, id="dev-null"),
        pytest.param("/dev/nvme0n1", False, id="nvme"),
        pytest.param("/devices/nvidia0", False, id="devices"),
        pytest.param("/var/lib/nvidia", False, id="elsewhere"),
        pytest.param("/home/dev/nvidia0", False, id="dev-deeper-down"),
        # The directories that hold the device files among others (guard.deviceDirHostPath).
        pytest.param("/dev", True, id="dev"),
        pytest.param("/", True, id="root"),
        pytest.param("//", True, id="root-doubled"),
        pytest.param("/.", True, id="root-dot"),
        pytest.param("/dev/", True, id="dev-trailing-slash"),
        pytest.param("/dev/char", True, id="char-device-links"),
        pytest.param("/dev/char/195:0", True, id="one-char-device-link"),
        pytest.param("//dev/./char/", True, id="char-spelt-oddly"),
        pytest.param("dev/char", True, id="char-relative"),
        pytest.param("/run", True, id="run"),
        pytest.param("/var/run", True, id="var-run"),
        pytest.param("/run/nvidia", True, id="run-nvidia"),
        pytest.param("/run/nvidia/driver", True, id="driver-root"),
        pytest.param("/run/nvidia/driver/dev", True, id="driver-root-devices"),
        pytest.param("/var/run/nvidia/driver/dev/nvidia0", True, id="driver-root-gpu"),
        pytest.param("/run/nvidia//driver/./dev/", True, id="driver-root-spelt-oddly"),
        pytest.param("/dev/charlie", False, id="charlie"),
        pytest.param("/dev.", False, id="dev-dot-name"),
        pytest.param("/var", False, id="var"),
        pytest.param("/var/run/docker.sock", False, id="docker-socket"),
        pytest.param("/run/containerd", False, id="containerd"),
        pytest.param("/run/nvidia/driver/usr/lib", False, id="driver-libraries"),
        pytest.param("/run/nvidia-persistenced", False, id="persistenced"),
        pytest.param("/home/dev/char", False, id="char-deeper-down"),
    ],
)
def test_host_paths_under_dev_nvidia_reach_both_webhooks(
    path: str, expected: bool, webhooks: tuple[Obj, Obj]
) -> None:
    body = host_path(path)
    # The CEL and the guard agree on every spelling the apiserver accepts (it refuses `..`).
    assert denied_by_guard(body) is expected
    for webhook in webhooks:
        assert sent_to_webhook(webhook, "CREATE", body, None) is expected


def mounting(path: str) -> Obj:
    app = {**container(limits={"cpu": "1"}), "name": "app"}
    app["volumeMounts"] = [{"name": "null", "mountPath": path}]
    return with_spec(
        CPU_ONLY, containers=[app], volumes=[{"name": "null", "hostPath": {"path": "/dev/null"}}]
    )


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/var/run/nvidia-container-devices/all", True, id="all"),
        pytest.param("/var/run/nvidia-container-devices", True, id="the-directory"),
        pytest.param("//var/run/./nvidia-container-devices/0", True, id="spelt-oddly"),
        pytest.param("/var/lib/../run/nvidia-container-devices/0", True, id="backstep"),
        pytest.param("/var/run/nvidia-container-devicesall", True, id="no-separator"),
        # Sent but allowed: the CEL sends every path that names the directory.
        pytest.param("/run/nvidia-container-devices/all", True, id="run"),
        pytest.param("/var/run/secrets", False, id="elsewhere"),
    ],
)
def test_mounts_under_the_device_list_directory_reach_both_webhooks(
    path: str, expected: bool, webhooks: tuple[Obj, Obj]
) -> None:
    body = mounting(path)
    if denied_by_guard(body):
        assert expected
    for webhook in webhooks:
        assert sent_to_webhook(webhook, "CREATE", body, None) is expected


def debugged(stored: Obj, *added: Obj) -> Obj:
    """The pod after `kubectl debug` added ephemeral containers to it."""
    return with_spec(
        stored, ephemeralContainers=[*stored["spec"].get("ephemeralContainers", []), *added]
    )


@pytest.mark.parametrize(
    ("stored", "added", "expected"),
    [
        pytest.param(CPU_ONLY, with_env(VISIBLE_ALL), True, id="visible-devices"),
        pytest.param(
            GPU_POD,
            {"name": "debug", "image": "busybox", "securityContext": {"privileged": True}},
            True,
            id="any-container-in-a-gpu-pod",
        ),
        pytest.param(
            CPU_ONLY,
            {"name": "debug", "image": "busybox", "securityContext": {"privileged": True}},
            False,
            id="privileged-without-gpus",
        ),
        pytest.param(CPU_ONLY, {"name": "debug", "image": "busybox"}, False, id="plain-debug"),
        pytest.param(
            CPU_ONLY,
            {
                "name": "debug",
                "image": "busybox",
                "volumeMounts": [{"name": "v", "mountPath": "/var/run/nvidia-container-devices/0"}],
            },
            True,
            id="device-list-mount",
        ),
    ],
)
def test_ephemeral_containers_reach_the_validating_webhook_when_they_concern_gpuadm(
    stored: Obj, added: Obj, expected: bool, webhooks: tuple[Obj, Obj]
) -> None:
    _, validating = webhooks
    new = debugged(stored, added)
    sent = sent_to_webhook(validating, "UPDATE", new, stored, sub_resource="ephemeralcontainers")
    assert sent is expected


# Read from the backends themselves, not written down again: every name (or prefix) that a
# built-in backend or a preset writes or reads under its defaults, which gpuadm takes for a
# GPU resource in any class. A backend whose names the webhooks did not route would let raw
# pods of its stack past gpuadm, and past quota with them.
@pytest.mark.parametrize("name", sorted(_default_resource_names()))
def test_every_resource_a_backend_knows_reaches_both_webhooks(
    name: str, webhooks: tuple[Obj, Obj]
) -> None:
    mutating, validating = webhooks
    asking = pod(container(limits={name: "1"}, requests={name: "1"}))
    assert sent_to_webhook(mutating, "CREATE", asking, None)
    assert sent_to_webhook(validating, "CREATE", asking, None)
    debug = {"name": "debug", "image": "busybox"}
    sent = sent_to_webhook(
        validating, "UPDATE", debugged(asking, debug), asking, sub_resource="ephemeralcontainers"
    )
    assert sent, "the ephemeral-containers condition does not route it"


@pytest.mark.parametrize(
    "stack", [pytest.param(s, id=s.fixture.removesuffix(".yaml")) for s in STACK_PODS]
)
def test_gpu_stacks_pods_skip_the_webhooks_in_their_namespace_and_reach_them_elsewhere(
    stack: StackPod, webhooks: tuple[Obj, Obj]
) -> None:
    """The apiserver never waits on gpuadm for a GPU stack's own pods; the same pod in a
    tenant's namespace is sent, and refused by the guard (webhook/admission/test_gpu_stacks)."""
    for webhook in webhooks:
        assert stack.namespace in _excluded_namespaces(webhook)
        assert "team-a" not in _excluded_namespaces(webhook)
        assert sent_to_webhook(webhook, "CREATE", stack.pod("team-a"), None)


@pytest.mark.parametrize("key", [*DEVICE_CHOICE_ANNOTATIONS, *PLACEMENT_ANNOTATIONS])
def test_updates_of_device_choice_annotations_reach_the_validating_webhook(
    key: str, webhooks: tuple[Obj, Obj]
) -> None:
    _, validating = webhooks
    annotated = pod(container(), annotations={key: "NVIDIA-Tesla T4"})
    plain = pod(container(), annotations={"team": "vision"})
    assert sent_to_webhook(validating, "UPDATE", annotated, plain) is True  # added
    assert sent_to_webhook(validating, "UPDATE", plain, annotated) is True  # removed
    changed = pod(container(), annotations={key: "NVIDIA A10"})
    assert sent_to_webhook(validating, "UPDATE", changed, annotated) is True
    # As a label it chooses nothing, and a create without GPUs is left alone (docs/backends.md).
    labelled = pod(container(), labels={key.replace("/", "-"): "x"})
    assert sent_to_webhook(validating, "UPDATE", labelled, plain) is False
    assert sent_to_webhook(validating, "CREATE", annotated, None) is False


def test_helm_adds_extra_gpu_resources_to_both_webhooks(render: Render) -> None:
    rendered = Rendered(
        "helm",
        render(
            "helm",
            "--set",
            "gpuResources.extraNames={example.com/gpu}",
            "--set",
            "gpuResources.extraPrefixes={example.com/mig-}",
        ),
    )
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        webhook = rendered.one(kind)["webhooks"][0]
        for name in ("example.com/gpu", "example.com/mig-2g.20gb", "nvidia.com/gpu"):
            assert sent_to_webhook(webhook, "CREATE", pod(container(limits={name: "1"})), None)
        assert not sent_to_webhook(webhook, "CREATE", CPU_ONLY, None)


def test_helm_match_conditions_follow_the_policy_domain(render: Render) -> None:
    rendered = Rendered("helm", render("helm", "--set", "policy.domain=gpu.example.org"))
    (mutating,) = rendered.one("MutatingWebhookConfiguration")["webhooks"]
    validating = rendered.one("ValidatingWebhookConfiguration")["webhooks"][0]
    ask = pod(container(limits={"gpu.example.org/a100": "1"}))
    assert sent_to_webhook(mutating, "CREATE", ask, None)
    assert not sent_to_webhook(
        mutating, "CREATE", pod(container(limits={"gpuadm.io/a100": "1"})), None
    )
    labelled = pod(container(), labels={"gpu.example.org/class": "a100"})
    assert sent_to_webhook(validating, "UPDATE", labelled, CPU_ONLY)


# --- the install script -----------------------------------------------------------------------


def test_install_script_without_go_says_what_to_install(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "cat"):
        real = subprocess.run(
            ["bash", "-c", f"command -v {tool}"], capture_output=True, text=True, check=True
        ).stdout.strip()
        (bin_dir / tool).symlink_to(real)
    result = subprocess.run(
        [str(bin_dir / "bash"), str(INSTALL_SCRIPT)],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert "Go is not installed" in result.stderr
    assert "Install Go 1.26 or newer" in result.stderr


@pytest.mark.parametrize("name", sorted(RENDERS))
def test_client_auth_is_on_exactly_where_asked_for(render: Render, name: str) -> None:
    (deployment,) = [o for o in render(name) if o["kind"] == "Deployment"]
    pod_spec = deployment["spec"]["template"]["spec"]
    (container,) = pod_spec["containers"]
    command = container["command"]
    if name not in WITH_CLIENT_AUTH:
        assert "--client-ca-file" not in command
        return
    ca_file = Path(command[command.index("--client-ca-file") + 1])
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "client-ca"]
    assert ca_file.parent == Path(mount["mountPath"])
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "client-ca"]
    assert volume["configMap"]["name"] == "gpuadm-client-ca"
    assert ca_file.name == "ca.crt"


@pytest.mark.parametrize(
    "key",
    [*ALLOCATION_ANNOTATIONS, *KAI_ALLOCATION_ANNOTATIONS, *sorted(ROUTED_REQUEST_ANNOTATIONS)],
)
def test_updates_of_allocation_annotations_reach_the_validating_webhook(
    key: str, webhooks: tuple[Obj, Obj]
) -> None:
    _, validating = webhooks
    annotated = pod(container(), annotations={key: "GPU-1,NVIDIA,8192,10:;"})
    plain = pod(container(), annotations={"team": "vision"})
    assert sent_to_webhook(validating, "UPDATE", annotated, plain) is True  # added
    assert sent_to_webhook(validating, "UPDATE", plain, annotated) is True  # removed
    changed = pod(container(), annotations={key: "GPU-1,NVIDIA,81920,100:;"})
    assert sent_to_webhook(validating, "UPDATE", changed, annotated) is True


@pytest.mark.parametrize("key", [KAI_GPU_GROUP, f"{KAI_GPU_GROUP}/0"])
def test_updates_of_kais_gpu_group_labels_reach_the_validating_webhook(
    key: str, webhooks: tuple[Obj, Obj]
) -> None:
    """KAI's binder labels a share's pod with the GPU group it bound; only it may."""
    _, validating = webhooks
    labelled = pod(container(), labels={key: "abc"})
    plain = pod(container(), labels={"team": "vision"})
    assert sent_to_webhook(validating, "UPDATE", labelled, plain) is True
    assert sent_to_webhook(validating, "UPDATE", plain, labelled) is True
    other = pod(container(), labels={"runai-gpu-groups": "abc"})
    assert sent_to_webhook(validating, "UPDATE", other, plain) is False


# --- KAI's share ConfigMaps --------------------------------------------------------------------


def config_map(name: str | None, namespace: str = "team-a") -> Obj:
    metadata: Obj = {"namespace": namespace}
    if name is not None:
        metadata["name"] = name
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"k": "v"}}


@pytest.fixture(params=["kustomize-base", "helm"])
def config_map_webhook(request: pytest.FixtureRequest, render: Render) -> Obj:
    """The validating webhook of one render that judges ConfigMaps."""
    rendered = Rendered(request.param, render(request.param))
    found: list[Obj] = [
        webhook
        for webhook in rendered.one("ValidatingWebhookConfiguration")["webhooks"]
        if "configmaps" in webhook["rules"][0]["resources"]
    ]
    assert len(found) == 1
    return found[0]


# As KAI's binder names them (kai-scheduler/KAI-Scheduler,
# pkg/binder/common/gpusharingconfigmap/config_map.go): `<base>-<7 random>-shared-gpu`, then
# `-<index>` for an app container, `-i<index>` for an init container, and `-evar` after either.
KAI_NAMES = [
    pytest.param("train-x7k2m9q-shared-gpu-0", id="app-container"),
    pytest.param("train-x7k2m9q-shared-gpu-12", id="app-container-12"),
    pytest.param("train-x7k2m9q-shared-gpu-i0", id="init-container"),
    pytest.param("train-x7k2m9q-shared-gpu-0-evar", id="evar"),
    pytest.param("train-x7k2m9q-shared-gpu-i3-evar", id="init-container-evar"),
    pytest.param("p-shared-gpu-0", id="prefix-a-pod-brought"),
]
OTHER_NAMES = [
    pytest.param("settings", id="ordinary"),
    pytest.param("kube-root-ca.crt", id="kube-root-ca"),
    pytest.param("train-x7k2m9q-shared-gpu", id="the-prefix-alone"),
    pytest.param("train-x7k2m9q-shared-gpu-", id="no-index"),
    pytest.param("train-x7k2m9q-shared-gpu-0-evar-old", id="something-after-evar"),
    pytest.param("train-x7k2m9q-shared-gpu-0-backup", id="something-after-the-index"),
    pytest.param("train-x7k2m9q-shared-gpu-ix", id="no-init-index"),
    pytest.param("train-x7k2m9q-shared-gpus-0", id="near-miss"),
    pytest.param("shared-gpu-0", id="no-dash-before"),
]


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
@pytest.mark.parametrize("name", KAI_NAMES)
def test_a_write_of_a_configmap_named_as_kai_names_them_reaches_the_validating_webhook(
    name: str, operation: str, config_map_webhook: Obj
) -> None:
    old = config_map(name) if operation == "UPDATE" else None
    assert sent_to_webhook(config_map_webhook, operation, config_map(name), old) is True
    # The CEL and the judge read the name alike: the judge refuses what is routed.
    assert SHARE_CONFIG_MAPS.names.search(name)


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
@pytest.mark.parametrize("name", OTHER_NAMES)
def test_no_other_configmap_write_reaches_gpuadm(
    name: str, operation: str, config_map_webhook: Obj
) -> None:
    old = config_map(name) if operation == "UPDATE" else None
    assert sent_to_webhook(config_map_webhook, operation, config_map(name), old) is False
    assert not SHARE_CONFIG_MAPS.names.search(name)


def test_a_configmap_without_a_name_is_not_an_error_of_the_cel(config_map_webhook: Obj) -> None:
    """The apiserver names a ConfigMap before validation; an error would fail the write."""
    assert sent_to_webhook(config_map_webhook, "CREATE", config_map(None), None) is False
    assert sent_to_webhook(config_map_webhook, "CREATE", {"kind": "ConfigMap"}, None) is False


def test_the_configmaps_routed_are_those_check_config_knows_of(config_map_webhook: Obj) -> None:
    """`gpuadm check-config` warns of a class whose share ConfigMaps are not routed: the
    shipped CEL holds exactly the patterns it takes for routed, and KAI's is one of them."""
    (condition,) = config_map_webhook["matchConditions"]
    routed = set(re.findall(r"\.matches\('([^']*)'\)", condition["expression"]))
    assert routed == set(ROUTED_DEVICES_CONFIG_MAPS)
    assert SHARE_CONFIG_MAPS.names.pattern in routed
