"""The Helm chart as an admin installs it: `helm lint`, the values schema, and the values that
place and shape gpuadm's pods (pull secrets, node selection, priority, labels, arguments).

The schema refuses what the chart does not know, so a misspelt value fails the install
instead of being ignored. Each value admins set is rendered here and checked where it lands,
against the Kubernetes API schema like every other object (test_manifests.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from policies import load_policy, plan
from tests.builders import pod
from tests.deploy import test_manifests as manifests
from tests.deploy.test_manifests import (
    EXAMPLES,
    GPU_STACK_NAMESPACES,
    HELM_TEMPLATE,
    NAMESPACE,
    RENDERS,
    REPO,
    Obj,
    Render,
    Rendered,
    _excluded_namespaces,
    schema_errors,
)

# The session fixtures of test_manifests.py: the tools, the renders and the API client.
tools = manifests.tools
render = manifests.render
api_client = manifests.api_client

CHART = REPO / "deploy" / "helm" / "gpuadm"
SCHEMA = CHART / "values.schema.json"
REFUSED = "values don't meet the specifications of the schema"
HELM_RENDERS = [name for name in RENDERS if name.startswith("helm")]


def _deployment(rendered: list[Obj]) -> Obj:
    return Rendered("helm", rendered).one("Deployment")


def _pod_spec(rendered: list[Obj]) -> Obj:
    spec: Obj = _deployment(rendered)["spec"]["template"]["spec"]
    return spec


# --- helm lint and the schema ---------------------------------------------------------------


@pytest.mark.parametrize("name", HELM_RENDERS)
def test_helm_lint_passes_strictly(tools: dict[str, Path], name: str) -> None:
    """Every variant the tests render, as `helm lint --strict` sees it (warnings fail)."""
    _, *template = RENDERS[name]
    assert tuple(template[: len(HELM_TEMPLATE)]) == HELM_TEMPLATE
    settings = template[len(HELM_TEMPLATE) :]
    result = subprocess.run(
        [str(tools["helm"]), "lint", "--strict", str(CHART), *settings],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_the_schema_is_draft_07_and_refuses_unknown_top_level_keys() -> None:
    schema = json.loads(SCHEMA.read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])


@pytest.mark.parametrize(
    ("value", "why"),
    [
        pytest.param("replica=3", "additional properties 'replica' not allowed", id="top-typo"),
        pytest.param(
            "webhook.excludedNamespace={team-x}",
            "additional properties 'excludedNamespace' not allowed",
            id="nested-typo",
        ),
        pytest.param(
            "certManager.enable=true",
            "additional properties 'enable' not allowed",
            id="cert-manager-typo",
        ),
        pytest.param("logLevel=verbose", "value must be one of", id="log-level"),
        pytest.param("webhook.timeoutSeconds=60", "maximum", id="timeout-over-30"),
        pytest.param("webhook.mutating.failurePolicy=ignore", "value must be one of", id="policy"),
        pytest.param("replicas=0", "minimum", id="no-replica"),
        pytest.param("image.pullPolicy=Sometimes", "value must be one of", id="pull-policy"),
        pytest.param("extraArgs[0]=30", "want string", id="unquoted-number-argument"),
        pytest.param(
            "policy.exemptNamespaces={Kube_System}", "does not match pattern", id="namespace"
        ),
        pytest.param(
            "podLabels.app\\.kubernetes\\.io/name=other",
            "invalid propertyName 'app.kubernetes.io/name'",
            id="selector-label",
        ),
        pytest.param("quotas.mode=warning", "value must be one of", id="quota-mode"),
        pytest.param(
            "quotaRecord.allowances=true",
            "additional properties 'quotaRecord' not allowed",
            id="quota-record-never-released",
        ),
        pytest.param("image.digest=sha256:abc", "does not match pattern", id="short-digest"),
        pytest.param(
            "uninstallHook.enable=false",
            "additional properties 'enable' not allowed",
            id="uninstall-hook-typo",
        ),
        pytest.param(
            "uninstallHook.activeDeadlineSeconds=0", "minimum", id="uninstall-hook-no-time"
        ),
        pytest.param(
            "affinity.podAntiAfinity=null",
            "additional properties 'podAntiAfinity' not allowed",
            id="affinity-typo",
        ),
        pytest.param(
            "networkPolicy.apiserverPorts={70000}", "maximum", id="apiserver-port-too-high"
        ),
        pytest.param(
            "networkPolicy.apiserverPorts[0]=https", "want integer", id="apiserver-port-named"
        ),
    ],
)
def test_helm_refuses_values_the_chart_does_not_know(render: Render, value: str, why: str) -> None:
    with pytest.raises(AssertionError, match=REFUSED) as refused:
        render("helm", "--set", value)
    assert why in str(refused.value)


@pytest.mark.parametrize(
    ("delay", "timeout", "grace"),
    [
        pytest.param(5, 5, 15, id="defaults-at-the-least"),
        pytest.param(30, 5, 40, id="a-long-drain"),
        pytest.param(5, 30, 40, id="a-long-timeout"),
        pytest.param(0, 3, 8, id="no-drain"),
    ],
)
def test_helm_refuses_a_grace_period_the_drain_does_not_fit_in(
    render: Render, delay: int, timeout: int, grace: int
) -> None:
    """A stopping replica drains for shutdownDelaySeconds, then answers what is in flight,
    each within webhook.timeoutSeconds: killed before that, it fails pod creates."""
    values = [
        f"shutdownDelaySeconds={delay}",
        f"webhook.timeoutSeconds={timeout}",
    ]
    args = [arg for value in values for arg in ("--set", value)]
    enough = render("helm", *args, "--set", f"terminationGracePeriodSeconds={grace}")
    assert _pod_spec(enough)["terminationGracePeriodSeconds"] == grace
    with pytest.raises(AssertionError) as refused:
        render("helm", *args, "--set", f"terminationGracePeriodSeconds={grace - 1}")
    assert (
        f"terminationGracePeriodSeconds ({grace - 1}) must be at least shutdownDelaySeconds "
        f"({delay}) + webhook.timeoutSeconds ({timeout}) + 5 = {grace}"
    ) in str(refused.value)


# --- the values that place and shape the pods --------------------------------------------------

CUSTOM: dict[str, Any] = {
    "imagePullSecrets": [{"name": "registry"}],
    "priorityClassName": "gpuadm-critical",
    "podAnnotations": {"example.com/owner": "platform"},
    "podLabels": {"team": "platform"},
    "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
    "tolerations": [
        {
            "key": "node-role.kubernetes.io/control-plane",
            "operator": "Exists",
            "effect": "NoSchedule",
        }
    ],
    # Merged into the default: the anti-affinity stays.
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}
                        ]
                    }
                ]
            }
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "gpuadm"}},
        }
    ],
    "logLevel": "debug",
    "extraArgs": ["--lease-seconds", "30"],
    "extraEnv": [{"name": "TZ", "value": "UTC"}],
}


@pytest.fixture(scope="module")
def custom(render: Render, tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    values = tmp_path_factory.mktemp("values") / "values.yaml"
    values.write_text(yaml.safe_dump(CUSTOM))
    return render("helm", "-f", str(values))


def test_custom_pod_values_land_in_the_pod_template(custom: list[Obj]) -> None:
    template = _deployment(custom)["spec"]["template"]
    spec = template["spec"]
    assert spec["imagePullSecrets"] == CUSTOM["imagePullSecrets"]
    assert spec["priorityClassName"] == "gpuadm-critical"
    assert template["metadata"]["annotations"] == CUSTOM["podAnnotations"]
    assert template["metadata"]["labels"]["team"] == "platform"
    assert template["metadata"]["labels"]["app.kubernetes.io/name"] == "gpuadm"
    assert spec["nodeSelector"] == CUSTOM["nodeSelector"]
    assert spec["tolerations"] == CUSTOM["tolerations"]
    assert spec["affinity"]["nodeAffinity"] == CUSTOM["affinity"]["nodeAffinity"]
    (anti,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti["podAffinityTerm"]["labelSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "gpuadm"
    }
    assert spec["topologySpreadConstraints"] == CUSTOM["topologySpreadConstraints"]


# The chart's hook Jobs: the config check before install and upgrade, the uninstall before
# delete; each with the command it runs.
HOOK_JOBS = {
    "gpuadm-uninstall": ["gpuadm", "uninstall"],
    "gpuadm-config-check": ["gpuadm", "check-config"],
}


@pytest.mark.parametrize(("name", "command"), HOOK_JOBS.items())
def test_custom_pod_values_place_the_hook_jobs_as_they_place_the_replicas(
    custom: list[Obj], name: str, command: list[str]
) -> None:
    """The hook Jobs must be able to run where the replicas could: same pull secrets,
    nodes, tolerations, node affinity and priority, and the admin's pod labels and annotations
    (a sidecar injector's opt-out, say). Only the replicas are spread over zones and kept
    apart from one another."""
    job = Rendered("helm", custom).one("Job", name)
    template = job["spec"]["template"]
    spec = template["spec"]
    for key in ("imagePullSecrets", "priorityClassName", "nodeSelector", "tolerations"):
        assert spec[key] == CUSTOM[key], key
    assert spec["affinity"] == {"nodeAffinity": CUSTOM["affinity"]["nodeAffinity"]}
    assert "topologySpreadConstraints" not in spec
    assert template["metadata"]["annotations"] == CUSTOM["podAnnotations"]
    assert template["metadata"]["labels"]["team"] == "platform"
    assert template["metadata"]["labels"]["app.kubernetes.io/name"] == name
    assert [c["command"][:2] for c in spec["containers"]] == [command]


REQUIRED_APART = {
    "requiredDuringSchedulingIgnoredDuringExecution": [
        {
            "topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "gpuadm"}},
        }
    ]
}


def test_the_uninstall_hook_takes_only_the_node_affinity_of_the_replicas(
    render: Render, tmp_path: Path
) -> None:
    """A required anti-affinity against gpuadm's pods would keep the Job off every node a
    replica runs on, and, with as many replicas as nodes, Pending until helm gives up; a
    pod affinity would tie it to pods it has nothing to do with. Only the nodes go over."""
    values = tmp_path / "values.yaml"
    affinity = {
        "nodeAffinity": CUSTOM["affinity"]["nodeAffinity"],
        "podAntiAffinity": REQUIRED_APART,
        "podAffinity": REQUIRED_APART,
    }
    values.write_text(yaml.safe_dump({"affinity": affinity}))
    rendered = Rendered("helm", render("helm", "-f", str(values)))
    # Merged into the default: the replicas are now kept apart, required.
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    apart = _pod_spec(rendered.objects)["affinity"]["podAntiAffinity"]
    assert apart[required] == REQUIRED_APART[required]
    for name in HOOK_JOBS:
        job = rendered.one("Job", name)["spec"]["template"]["spec"]
        assert job["affinity"] == {"nodeAffinity": affinity["nodeAffinity"]}, name
    # With no node affinity, none at all. (Another file: renders are cached by argument.)
    apart = tmp_path / "apart.yaml"
    apart.write_text(yaml.safe_dump({"affinity": {"podAntiAffinity": REQUIRED_APART}}))
    for name in HOOK_JOBS:
        job = Rendered("helm", render("helm", "-f", str(apart))).one("Job", name)
        assert "affinity" not in job["spec"]["template"]["spec"], name


def test_custom_arguments_and_environment_follow_the_charts_own(custom: list[Obj]) -> None:
    (container,) = _pod_spec(custom)["containers"]
    command = container["command"]
    assert command[command.index("--log-level") + 1] == "debug"
    assert command[-2:] == ["--lease-seconds", "30"]
    assert command[:4] == ["gpuadm", "serve", "--gpuadm-namespace", "$(POD_NAMESPACE)"]
    assert [e["name"] for e in container["env"]] == ["POD_NAMESPACE", "TZ"]


@pytest.mark.parametrize("value", ["true", "false"])
def test_the_removed_http2_value_still_installs_and_changes_nothing(
    render: Render, value: str
) -> None:
    """gpuadm serves HTTP/1.1 only: a values file written when `http2` was a switch installs,
    and the replicas run as without it."""
    assert _command(render("helm", "--set", f"http2={value}")) == _command(render("helm"))


def test_a_webhook_timeout_that_a_wait_for_room_aside_does_not_fit_in_is_refused(
    render: Render,
) -> None:
    """Every replica sets room aside, and a pod that meets room another holds waits up to
    1.5 s for it: inside the webhook's timeout, or the apiserver gives up first."""
    assert "webhook.timeoutSeconds must be 3 or more" not in str(
        render("helm", "--set", "webhook.timeoutSeconds=3")
    )
    with pytest.raises(AssertionError) as refused:
        render("helm", "--set", "webhook.timeoutSeconds=2")
    assert "webhook.timeoutSeconds must be 3 or more (it is 2)" in str(refused.value)
    flags = {"--drop-shown-reservations", "--quota-allowances"}
    assert not flags & set(_command(render("helm")))


def _command(objects: list[Obj]) -> list[str]:
    (container,) = _pod_spec(objects)["containers"]
    found: list[str] = container["command"]
    return found


def test_custom_values_render_objects_the_api_accepts(
    custom: list[Obj], api_client: kubernetes.client.ApiClient
) -> None:
    assert schema_errors(api_client, _deployment(custom)) == []
    for name in HOOK_JOBS:
        assert schema_errors(api_client, Rendered("helm", custom).one("Job", name)) == []


DIGEST = "sha256:" + "0123456789abcdef" * 4


def test_an_image_digest_pins_what_every_pod_pulls(render: Render) -> None:
    pinned = Rendered("helm", render("helm", "--set", f"image.digest={DIGEST}"))
    want = f"ghcr.io/gpuadm/gpuadm@{DIGEST}"
    assert [c["image"] for c in _pod_spec(pinned.objects)["containers"]] == [want]
    for name in HOOK_JOBS:
        job = pinned.one("Job", name)
        assert [c["image"] for c in job["spec"]["template"]["spec"]["containers"]] == [want]
    by_tag = _pod_spec(render("helm", "--set", "image.tag=1.2.3"))["containers"][0]["image"]
    assert by_tag == "ghcr.io/gpuadm/gpuadm:1.2.3"


def test_the_default_placement_can_be_dropped(render: Render) -> None:
    spec = _pod_spec(
        render(
            "helm",
            "--set",
            "affinity=null",
            "--set",
            "topologySpreadConstraints=null",
            "--set",
            "priorityClassName=",
        )
    )
    for key in ("affinity", "topologySpreadConstraints", "priorityClassName"):
        assert key not in spec


def _egress_ports(policy: Obj) -> list[list[tuple[int, str]]]:
    return [
        [(port["port"], port["protocol"]) for port in rule["ports"]]
        for rule in policy["spec"]["egress"]
    ]


def test_the_apiserver_ports_are_a_value_both_network_policies_follow(render: Render) -> None:
    """MicroK8s' apiserver serves on 16443: the replicas and the uninstall Job reach it there,
    and DNS as before."""
    dns = [(53, "UDP"), (53, "TCP")]
    default = Rendered("helm", render("helm"))
    microk8s = Rendered("helm", render("helm", "--set", "networkPolicy.apiserverPorts={16443}"))
    for name in ("gpuadm", "gpuadm-uninstall"):
        assert _egress_ports(default.one("NetworkPolicy", name)) == [
            [(443, "TCP"), (6443, "TCP")],
            dns,
        ]
        assert _egress_ports(microk8s.one("NetworkPolicy", name)) == [[(16443, "TCP")], dns]


def test_no_apiserver_port_is_refused_rather_than_opening_every_port(render: Render) -> None:
    with pytest.raises(AssertionError) as refused:
        render("helm", "--set", "networkPolicy.apiserverPorts=null")
    assert "networkPolicy.apiserverPorts: list the apiserver's ports" in str(refused.value)


TENANTS = {"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"}


def test_tenants_may_read_the_policy_and_quotas_only_when_the_admin_says_who(
    render: Render, api_client: kubernetes.client.ApiClient
) -> None:
    """Off by default. On: get of exactly gpuadm-policy and gpuadm-quotas, by name, in gpuadm's
    namespace, for the subjects given; nothing else is bound to them."""

    def tenant_objects(objects: list[Obj]) -> list[Obj]:
        return [o for o in objects if o["metadata"]["name"] == "gpuadm-config-view"]

    assert tenant_objects(render("helm")) == []
    subjects = [
        a for k, v in TENANTS.items() for a in ("--set", f"tenantAccess.subjects[0].{k}={v}")
    ]
    on = Rendered("helm", render("helm", "--set", "tenantAccess.readConfig=true", *subjects))
    role, binding = (
        on.one("Role", "gpuadm-config-view"),
        on.one("RoleBinding", "gpuadm-config-view"),
    )
    assert sorted(o["kind"] for o in tenant_objects(on.objects)) == ["Role", "RoleBinding"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["gpuadm-policy", "gpuadm-quotas"],
            "verbs": ["get"],
        }
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "gpuadm-config-view",
    }
    assert binding["subjects"] == [TENANTS]
    assert schema_errors(api_client, role) == schema_errors(api_client, binding) == []
    with pytest.raises(AssertionError) as refused:
        render("helm", "--set", "tenantAccess.readConfig=true")
    assert "tenantAccess.readConfig needs tenantAccess.subjects" in str(refused.value)


# --- policy and quotas: installed as the admin wrote them -------------------------------------

EXAMPLE_VALUES = EXAMPLES / "values-example.yaml"
# An admin's own config: three classes and four namespaces, none of them the example's. The
# example has a t4 class too, on gpu-manager with a nodeSelector of gpu-manager's nodes: merged
# into this time-slicing t4, it would keep every T4 pod Pending.
MINE_POLICY: dict[str, Any] = {
    "exemptNamespaces": ["gpu-operator", "nvidia-device-plugin"],
    "classes": {
        "a100": {"backend": "nvidia", "models": ["NVIDIA A100-SXM4-80GB"]},
        "t4": {"backend": "time-slicing", "models": ["Tesla T4"]},
        "l4": {"backend": "nvidia", "models": ["NVIDIA L4"]},
    },
}
MINE_QUOTAS: dict[str, Any] = {
    "mode": "warn",
    "namespaces": {
        "vision": {"a100": 2},
        "speech": {"t4": 4},
        "search": {"l4": 1, "t4": 1},
        "batch": {"mode": "queue", "a100": 1},
    },
}
# The same config as an admin keeps it in files, comments and all.
MINE_POLICY_TEXT = """\
# Our GPUs (docs/configuration.md).
exemptNamespaces: [gpu-operator, nvidia-device-plugin]
classes:
  a100: {backend: nvidia, models: [NVIDIA A100-SXM4-80GB]}
  t4:
    backend: time-slicing   # the T4 nodes share by time-slicing
    models: [Tesla T4]
  l4: {backend: nvidia, models: [NVIDIA L4]}
"""
MINE_QUOTAS_TEXT = """\
mode: warn
namespaces:
  vision: {a100: 2}
  speech: {t4: 4}
  search: {l4: 1, t4: 1}
  batch: {mode: queue, a100: 1}
"""


def _template(tools: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart in gpuadm-system, with only the values given here."""
    return subprocess.run(
        [str(tools["helm"]), *HELM_TEMPLATE, "--namespace", NAMESPACE, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )


def _rendered(tools: dict[str, Path], *args: str) -> tuple[str, Rendered]:
    result = _template(tools, *args)
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return result.stdout, Rendered("helm", objects)


def _config_text(rendered: Rendered) -> tuple[str, str]:
    """The text of policy.yaml and quotas.yaml in the rendered ConfigMaps, each the one key."""
    policy = rendered.one("ConfigMap", "gpuadm-policy")["data"]
    quotas = rendered.one("ConfigMap", "gpuadm-quotas")["data"]
    assert list(policy) == ["policy.yaml"]
    assert list(quotas) == ["quotas.yaml"]
    return policy["policy.yaml"], quotas["quotas.yaml"]


def _config(rendered: Rendered) -> tuple[Obj, Obj]:
    policy, quotas = _config_text(rendered)
    return yaml.safe_load(policy), yaml.safe_load(quotas)


def _check_config(manifest: str) -> subprocess.CompletedProcess[str]:
    """`helm template ... | gpuadm check-config -`, as docs/configuration.md has admins run it."""
    return subprocess.run(
        [sys.executable, "-m", "webhook.cli", "check-config", "-"],
        input=manifest,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_config_given_as_keys_is_installed_as_written(
    tools: dict[str, Path], tmp_path: Path
) -> None:
    """Helm merges an admin's keys into the chart's: its defaults hold no class or namespace
    to merge, so what is installed is the admin's, and the release namespace exempt."""
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"policy": MINE_POLICY, "quotas": MINE_QUOTAS}))
    manifest, rendered = _rendered(tools, "-f", str(mine))
    policy, quotas = _config(rendered)
    assert sorted(policy["classes"]) == ["a100", "l4", "t4"]
    assert sorted(quotas["namespaces"]) == ["batch", "search", "speech", "vision"]
    assert policy["classes"]["t4"] == {"backend": "time-slicing", "models": ["Tesla T4"]}
    exempt = [*MINE_POLICY["exemptNamespaces"], NAMESPACE]
    assert policy == {**MINE_POLICY, "exemptNamespaces": exempt}
    assert quotas == MINE_QUOTAS
    checked = _check_config(manifest)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_keys_that_list_no_exempt_namespaces_keep_the_charts(
    tools: dict[str, Path], tmp_path: Path
) -> None:
    """The one key of the chart's own that joins an admin's policy: the GPU stacks' namespaces,
    when the admin lists none, so that their device plugins are never refused."""
    classes = {"classes": MINE_POLICY["classes"]}
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"policy": classes, "quotas": MINE_QUOTAS}))
    policy, quotas = _config(_rendered(tools, "-f", str(mine))[1])
    assert set(policy.pop("exemptNamespaces")) == GPU_STACK_NAMESPACES | {NAMESPACE}
    assert policy == classes
    assert quotas == MINE_QUOTAS


@pytest.mark.parametrize("how", ["values-file", "set-file"])
def test_a_config_given_as_text_is_installed_as_it_is(
    tools: dict[str, Path], tmp_path: Path, how: str
) -> None:
    """A text is never merged: the ConfigMaps hold it character for character, comments
    included, so gpuadm's errors point at the admin's own lines."""
    if how == "values-file":

        def block(text: str) -> str:
            return "".join(f"  {line}\n" for line in text.splitlines())

        mine = tmp_path / "mine.yaml"
        mine.write_text(f"policy: |\n{block(MINE_POLICY_TEXT)}quotas: |\n{block(MINE_QUOTAS_TEXT)}")
        args = ["-f", str(mine)]
    else:
        (tmp_path / "policy.yaml").write_text(MINE_POLICY_TEXT)
        (tmp_path / "quotas.yaml").write_text(MINE_QUOTAS_TEXT)
        args = [
            "--set-file",
            f"policy={tmp_path / 'policy.yaml'}",
            "--set-file",
            f"quotas={tmp_path / 'quotas.yaml'}",
        ]
    manifest, rendered = _rendered(tools, *args)
    assert _config_text(rendered) == (MINE_POLICY_TEXT, MINE_QUOTAS_TEXT)
    policy, quotas = _config(rendered)
    assert sorted(policy["classes"]) == ["a100", "l4", "t4"]
    assert sorted(quotas["namespaces"]) == ["batch", "search", "speech", "vision"]
    assert "nodeSelector" not in policy["classes"]["t4"]
    checked = _check_config(manifest)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_policy_text_chooses_what_the_webhooks_skip_and_match(
    tools: dict[str, Path], tmp_path: Path
) -> None:
    text = "domain: gpu.example.org\nexemptNamespaces: [gpu-stack]\nclasses: {}\n"
    mine = tmp_path / "policy.yaml"
    mine.write_text(text)
    rendered = _rendered(tools, "--set-file", f"policy={mine}")[1]
    assert _config_text(rendered)[0] == text
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for webhook in rendered.one(kind)["webhooks"]:
            assert _excluded_namespaces(webhook) == {"kube-system", "gpu-stack", NAMESPACE}
    (mutating,) = rendered.one("MutatingWebhookConfiguration")["webhooks"]
    (asks,) = [c for c in mutating["matchConditions"] if "startsWith" in c["expression"]]
    assert "k.startsWith('gpu.example.org/')" in asks["expression"]


@pytest.mark.parametrize(
    ("values", "why"),
    [
        pytest.param(
            {"policy": ""},
            "policy is an empty text: give policy.yaml as its keys or as its text "
            "(`classes: {}` for no classes)",
            id="empty-policy",
        ),
        pytest.param(
            {"quotas": " \n"},
            "quotas is an empty text: give quotas.yaml as its keys or as its text "
            "(`namespaces: {}` for no quotas at all)",
            id="blank-quotas",
        ),
        pytest.param(
            {"quotas": None},
            "quotas is null, neither keys nor a text: give quotas.yaml as its keys or as its "
            "text (`namespaces: {}` for no quotas at all)",
            id="quotas-null",
        ),
        pytest.param(
            {"policy": "- a100\n- t4\n"},
            "policy: the text is not a YAML mapping of policy.yaml's keys",
            id="policy-not-a-mapping",
        ),
        pytest.param(
            {"policy": "classes: {}\nexemptNamespaces: gpu-stack\n"},
            "policy.exemptNamespaces: gpu-stack is not a list of namespaces",
            id="exempt-namespaces-not-a-list",
        ),
    ],
)
def test_a_text_the_chart_cannot_read_is_refused(
    tools: dict[str, Path], tmp_path: Path, values: Obj, why: str
) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(values))
    result = _template(tools, "-f", str(mine))
    assert result.returncode != 0
    assert why in result.stderr


def test_by_default_the_chart_installs_a_config_that_rewrites_and_charges_nothing(
    tools: dict[str, Path],
) -> None:
    """No example, and no defaultClass: GPU pods go on as written until the admin names the
    classes, and none is charged."""
    manifest, rendered = _rendered(tools)
    policy, quotas = _config(rendered)
    assert policy.pop("classes") == {}
    assert set(policy.pop("exemptNamespaces")) == GPU_STACK_NAMESPACES | {NAMESPACE}
    assert policy == {}
    assert quotas == {"namespaces": {}}
    checked = _check_config(manifest)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    inert = load_policy(_config_text(rendered)[0])
    result = plan(pod({"nvidia.com/gpu": "1"}), inert)
    assert result.patch == []
    assert result.charge == 0
    assert result.demand is None


def test_the_example_config_comes_from_its_values_file_alone(tools: dict[str, Path]) -> None:
    """examples/values-example.yaml, given with -f, installs the example of examples/policy.yaml
    and quotas.yaml (which deploy/base installs), and check-config accepts it; without it, the
    chart installs none of its classes or namespaces."""
    example_policy = yaml.safe_load((EXAMPLES / "policy.yaml").read_text())
    example_quotas = yaml.safe_load((EXAMPLES / "quotas.yaml").read_text())
    manifest, rendered = _rendered(tools, "-f", str(EXAMPLE_VALUES))
    assert _config(rendered) == (example_policy, example_quotas)
    checked = _check_config(manifest)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok: 1 policy and 1 quota config(s) are valid" in checked.stdout
    policy, quotas = _config(_rendered(tools)[1])
    assert not policy["classes"].keys() & example_policy["classes"].keys()
    assert not quotas["namespaces"].keys() & example_quotas["namespaces"].keys()


@pytest.mark.parametrize(
    "given",
    [
        pytest.param(("-f", str(EXAMPLE_VALUES)), id="keys"),
        pytest.param(
            (
                "--set-file",
                f"policy={EXAMPLES / 'policy.yaml'}",
                "--set-file",
                f"quotas={EXAMPLES / 'quotas.yaml'}",
            ),
            id="text",
        ),
    ],
)
def test_the_config_check_reads_exactly_what_the_release_installs(
    render: Render, given: tuple[str, ...]
) -> None:
    """Before install and upgrade, and before anything else of the release: the check Job
    reads a ConfigMap of its own holding the very data of gpuadm-policy and gpuadm-quotas,
    and needs no account token and no network."""
    rendered = Rendered("helm", render("helm", *given))
    check = rendered.one("ConfigMap", "gpuadm-config-check")
    installed = {
        **rendered.one("ConfigMap", "gpuadm-policy")["data"],
        **rendered.one("ConfigMap", "gpuadm-quotas")["data"],
    }
    assert check["data"] == installed
    assert set(installed) == {"policy.yaml", "quotas.yaml"}
    job = rendered.one("Job", "gpuadm-config-check")
    for hook in (check, job):
        annotations = hook["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
        assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    assert int(check["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        job["metadata"]["annotations"]["helm.sh/hook-weight"]
    )
    assert job["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-failed"
    assert job["spec"]["backoffLimit"] == 0
    spec = job["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec
    (container,) = spec["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert container["command"] == [
        "gpuadm",
        "check-config",
        *(f"{mount['mountPath']}/{key}" for key in ("policy.yaml", "quotas.yaml")),
    ]
    volume = next(v for v in spec["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == "gpuadm-config-check"
