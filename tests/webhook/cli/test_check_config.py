"""`gpuadm check-config`: a table of broken configs, each pinned to its message and line.

Every case is a config `gpuadm serve` would have taken with no effect, or refused: none may
pass as "ok". Each message names the file, the line of the key itself, the field, the value
and the fix.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT
from webhook.cli import main
from webhook.cli.check_config import CONFIG_MAPS
from webhook.config.configmap_source import POLICY_KEY, POLICY_MAP, QUOTAS_KEY, QUOTAS_MAP

POLICY = ROOT / "examples" / "policy.yaml"
QUOTAS = ROOT / "examples" / "quotas.yaml"

CONFIG_MAP = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {name}
data:
  {key}: |
{body}"""


def config_map(name: str, key: str, body: str) -> str:
    indented = "".join(f"    {line}\n" for line in body.splitlines())
    return CONFIG_MAP.format(name=name, key=key, body=indented)


# (file name, text, exit code, lines the output must hold; {f} is the file's path)
CASES = [
    pytest.param(
        "quotas.yaml",
        "",
        1,
        ["{f}:1: the document is empty; to have no quotas at all, write `namespaces: {{}}`"],
        id="empty-quotas",
    ),
    pytest.param(
        "policy.yaml", "\n# nothing yet\n", 1, ["{f}:1: the document is empty"], id="empty-policy"
    ),
    pytest.param(
        "config.yaml", "", 1, ["{f}:1: the file is empty: neither a policy nor quotas"], id="empty"
    ),
    pytest.param(
        "cm.yaml",
        config_map("gpuadm-quotas", "quota.yaml", "namespaces:\n  team-a:\n    t4: 1\n"),
        1,
        [
            "{f}:6: data.quota.yaml: gpuadm reads only `quotas.yaml` from ConfigMap "
            "gpuadm-quotas, so this key is never read; did you mean `quotas.yaml`?"
        ],
        id="configmap-key-quota.yaml",
    ),
    pytest.param(
        "cm.yaml",
        config_map("gpuadm-policy", "policy", "classes:\n  t4: {backend: nvidia}\n"),
        1,
        [
            "{f}:6: data.policy: gpuadm reads only `policy.yaml` from ConfigMap gpuadm-policy, "
            "so this key is never read; did you mean `policy.yaml`?"
        ],
        id="configmap-key-policy",
    ),
    pytest.param(
        "cm.yaml",
        config_map("gpuadm-quota", "quotas.yaml", "namespaces: {}\n"),
        1,
        [
            "{f}:4: metadata.name: gpuadm reads only the ConfigMaps gpuadm-policy and "
            "gpuadm-quotas in its namespace, so gpuadm-quota is never read; did you mean "
            "`gpuadm-quotas`?"
        ],
        id="configmap-name-serve-never-reads",
    ),
    pytest.param(
        "cm.yaml",
        config_map("gpuadm-quotas", "quotas.yaml", "namespaces:\n  team-a:\n    a100: -2\n"),
        1,
        ["{f}:9: namespaces.team-a.a100: -2 is negative: a limit is 0 (none at all) or more"],
        id="configmap-lines-count-in-the-manifest",
    ),
    pytest.param(
        "quotas.yaml",
        "namespaces:\n  team-a:\n    t4: 1\n    t4: 4\n",
        1,
        [
            "{f}:4: namespaces.team-a.t4: given twice (first on line 3), and YAML keeps only "
            "the last; remove one"
        ],
        id="duplicate-key",
    ),
    pytest.param(
        "quotas.yaml",
        "namespaces:\n  team-a:\n    t4: 1.5Gi\n",
        1,
        [
            "{f}:3: namespaces.team-a.t4: '1.5Gi' is a size, not a number of GPUs: a limit "
            "counts GPUs of the class (did you mean 1.5?)"
        ],
        id="limit-with-a-size-suffix",
    ),
    pytest.param(
        "quotas.yaml",
        "namespaces:\n  Team_A:\n    t4: 1\n",
        1,
        [
            "{f}:2: namespaces.Team_A: 'Team_A' is not a namespace name, so no namespace "
            "matches it: a namespace is lowercase letters, digits and '-', at most 63 "
            "characters (did you mean 'team-a'?)"
        ],
        id="namespace-no-namespace-can-match",
    ),
    pytest.param(
        "policy.yaml",
        "exemptNamespaces: [kube-system, Kube_Public]\nclasses:\n  t4: {backend: nvidia}\n",
        1,
        [
            "{f}:1: exemptNamespaces.1: 'Kube_Public' is not a namespace name, so no namespace "
            "matches it: a namespace is lowercase letters, digits and '-', at most 63 "
            "characters (did you mean 'kube-public'?)"
        ],
        id="exempt-namespace-no-namespace-can-match",
    ),
    pytest.param(
        "policy.yaml",
        "classes:\n  a100-mig:\n    backend: mig\n    memory: 80Gi\n"
        "    profiles:\n      2g.20gb: 20Gi\n      3g40gb: 40\n",
        1,
        [
            "{f}:7: classes.a100-mig.profiles.3g40gb: '3g40gb' is not a MIG profile name such "
            "as 1g.10gb or 3g.40gb (did you mean 3g.40gb?)",
            "{f}:7: classes.a100-mig.profiles.3g40gb: 40 is less memory than any MIG profile "
            "has; give a unit (did you mean 40Gi?)",
        ],
        id="mig-profile-name-and-unitless-memory",
    ),
    pytest.param(
        "policy.yaml",
        "classes:\n  a100-mig:\n    backend: mig\n    memory: 80Gi\n"
        "    profiles:\n      2g.20gb: 200Gi\n",
        1,
        [
            "{f}:6: classes.a100-mig.profiles.2g.20gb: 200Gi is more than the memory of the "
            "class's whole GPU (80Gi)"
        ],
        id="mig-profile-larger-than-the-gpu",
    ),
    pytest.param(
        "policy.yaml",
        "classes:\n  x:\n    backend: nvidia\n    resource: example.com/gpu\n",
        0,
        [
            "warning: {f}:2: class x: the shipped webhooks never send gpuadm a pod that asks "
            "only for example.com/gpu, so such pods pass unchecked and uncounted; add them to "
            "the Helm chart's gpuResources.extraNames (or extraPrefixes), or to the "
            "matchConditions of both webhook configurations",
            "ok: 1 policy and 0 quota config(s) are valid",
        ],
        id="class-on-a-resource-never-routed",
    ),
    pytest.param(
        "policy.yaml",
        "domain: gpuadm.io\nclases:\n  t4:\n    backend: nvidia\n",
        1,
        [
            "{f}:1: classes: missing: a policy needs `classes`",
            "{f}:2: clases: `clases` is not a key of a policy; did you mean `classes`?",
        ],
        id="misspelt-classes-is-still-a-policy",
    ),
    pytest.param(
        "policy.yaml",
        "classes:\n  t4:\n    memory: 16Gi\n    backend: hammi\n",
        1,
        [
            "{f}:4: classes.t4.backend: there is no backend 'hammi'; did you mean `hami`? "
            "(the backends: cgpu, dra, elastic-gpu, extended, gpu-manager, gpushare, hami, kai, "
            "mgpu, mig, nvidia, qgpu, time-slicing, volcano)"
        ],
        id="unknown-backend-at-the-backend-key",
    ),
    pytest.param(
        "policy.yaml",
        "classes:\n  t4:\n    backend: nvidia\n",
        0,
        ["ok: 1 policy and 0 quota config(s) are valid"],
        id="valid-policy",
    ),
    pytest.param(
        "policy.yaml",
        "domain: gpuadm.io\nclasses:\n  t4:\n    backend: hami\n    memory: 16Gi\n"
        "    # the models come later\n    models: []\n",
        1,
        ["{f}:7: classes.t4.models: `models` lists no GPU model; list them, or remove the key"],
        id="empty-models-at-its-own-line",
    ),
    pytest.param(
        "policy.yaml",
        "classes:\n  t4:\n    backend: nvidia\n    nodeSelecter: {}\n",
        1,
        [
            "{f}:4: classes.t4.nodeSelecter: `nodeSelecter` is not a key of a nvidia class; "
            "did you mean `nodeSelector`?"
        ],
        id="misspelt-key",
    ),
    pytest.param(
        "quotas.yaml",
        "namespaces:\n  team-a:\n    mode: warn\n    A100: 1\n",
        1,
        [
            "{f}:4: namespaces.team-a.A100: 'A100' is neither a class name (lowercase letters, "
            "digits and '-') nor '*'"
        ],
        id="limit-key-not-a-class-name",
    ),
    pytest.param(
        "quotas.yaml",
        "mode: enforcing\n",
        1,
        ["{f}:1: mode: 'enforcing' is not one of enforce, warn, queue; did you mean `enforce`?"],
        id="mode-typo",
    ),
    pytest.param(
        "gpus.yaml",
        "namespaces:\n  team-a:\n    t4: 1\n",
        0,
        [
            "note: {f}: its name says neither policy nor quotas; read as quotas, whose keys it "
            "matches best (name it quotas.yaml, or give --quotas {f})"
        ],
        id="kind-guessed-and-said",
    ),
    pytest.param(
        "manifest.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: x}\n---\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: other}\ndata: {a.json: '{}'}\n",
        1,
        ["no policy or quotas found: nothing was checked"],
        id="a-manifest-without-gpuadm-config",
    ),
    pytest.param(
        "all.yaml",
        "apiVersion: v1\nkind: List\nitems:\n"
        "- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: gpuadm-quotas}\n"
        "  data:\n    quotas.yaml: |\n      mode: warn\n      default: {t4: -1}\n",
        1,
        ["{f}:10: default.t4: -1 is negative: a limit is 0 (none at all) or more"],
        id="a-list-of-configmaps",
    ),
]


@pytest.mark.parametrize(("name", "text", "code", "expected"), CASES)
def test_broken_configs_are_refused_with_plain_words(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    text: str,
    code: int,
    expected: list[str],
) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert main(["check-config", str(path)]) == code
    out = capsys.readouterr().out
    for line in expected:
        assert line.format(f=path) in out.splitlines(), out
    if code:
        assert "ok:" not in out
    for pydantic_words in ("Input tag", "Extra inputs", "Field required", "Input should"):
        assert pydantic_words not in out


def test_the_kind_comes_from_the_flag_whatever_the_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("domain: gpuadm.io\nclases:\n  t4: {backend: nvidia}\n")
    assert main(["check-config", "--policy", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:2: clases: `clases` is not a key of a policy; did you mean `classes`?" in out
    assert "note:" not in out
    assert "quota config" not in out


def test_a_newcomers_config_is_valid_but_each_mistake_is_warned_of_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "classes:\n"
        "  a100:\n    backend: hami\n    memory: 80Gi\n    models: [NVIDIA-A100-SXM4-80GB]\n"
        "  h100:\n    backend: nvidia\n    models: [H100]\n"
    )
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(
        "namespaces:\n  team-a:\n    h100: 2\n    a100: 500m\n    budget: {h100: 500h/1d}\n"
    )
    assert main(["check-config", "--policy", str(policy), "--quotas", str(quotas)]) == 0
    out = capsys.readouterr().out
    assert (
        f"warning: {policy}:2: class a100: model 'NVIDIA-A100-SXM4-80GB' is not a GPU name" in out
    )
    assert f"warning: {policy}:6: class h100: model 'H100' is not a GPU name" in out
    assert (
        f"warning: {quotas}:5: namespaces.team-a.budget.h100: 500h/1d can never be spent: a "
        "limit of 2 GPUs holds at most 48h in 1d"
    ) in out
    # Half an A100 is a pod HAMi can hold: that limit is fine.
    assert "namespaces.team-a.a100" not in out
    assert out.rstrip().endswith("ok: 1 policy and 1 quota config(s) are valid")


def test_quotas_checked_alone_say_their_class_names_went_unchecked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("namespaces:\n  team-a: {a10o: 1}\n")
    assert main(["check-config", "--quotas", str(quotas)]) == 0
    out = capsys.readouterr().out
    assert (
        "note: no policy given: the quotas' class names, and what each class is charged, "
        "were not checked; give the policy too (--policy) to check them"
    ) in out


def test_cross_file_errors_point_at_the_quota_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("mode: warn\nnamespaces:\n  team-a:\n    a10o: 1\n    defaultClass: h10\n")
    assert main(["check-config", str(POLICY), str(quotas)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert (
        f"{quotas}:4: namespaces.team-a.a10o: no class 'a10o' in the policy; "
        f"did you mean `a100`? ({POLICY})"
    ) in out
    assert (
        f"{quotas}:5: namespaces.team-a.defaultClass: no class 'h10' in the policy; "
        f"did you mean `h100`? ({POLICY})"
    ) in out


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(ROOT / "deploy" / "helm" / "gpuadm" / "values.yaml", id="the-charts-own"),
        pytest.param(ROOT / "examples" / "values-example.yaml", id="the-example"),
    ],
)
def test_shipped_helm_values_are_valid(values: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(values)]) == 0
    assert "ok: 1 policy and 1 quota config(s) are valid" in capsys.readouterr().out


def test_helm_values_are_checked_at_their_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped = (ROOT / "examples" / "values-example.yaml").read_text()
    broken = shipped.replace("      memory: 16Gi\n", "      memroy: 16Gi\n", 1)
    line = broken.splitlines().index("      memroy: 16Gi") + 1
    values = tmp_path / "values.yaml"
    values.write_text(broken)
    assert main(["check-config", str(values)]) == 1
    assert (
        f"{values}:{line}: classes.t4.memroy: `memroy` is not a key of a gpu-manager class; "
        "did you mean `memory`?"
    ) in capsys.readouterr().out


def test_helm_values_given_as_text_are_checked_at_their_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`policy: |` and `quotas: |`, which the chart installs as they are."""
    policy = "".join(f"  {line}\n" for line in POLICY.read_text().splitlines())
    broken = policy.replace("      memory: 16Gi\n", "      memroy: 16Gi\n", 1)
    text = f"replicas: 2\npolicy: |\n{broken}quotas: |\n  namespaces:\n    team-a: {{t4: 1}}\n"
    values = tmp_path / "mine.yaml"
    values.write_text(text)
    assert main(["check-config", str(values)]) == 1
    line = text.splitlines().index("      memroy: 16Gi") + 1
    assert (
        f"{values}:{line}: classes.t4.memroy: `memroy` is not a key of a gpu-manager class; "
        "did you mean `memory`?"
    ) in capsys.readouterr().out
    values.write_text(text.replace("memroy", "memory"))
    assert main(["check-config", str(values)]) == 0
    assert "ok: 1 policy and 1 quota config(s) are valid" in capsys.readouterr().out


def test_a_rendered_chart_on_stdin_is_checked(tmp_path: Path) -> None:
    """`helm template ... | gpuadm check-config -`, with the chart's own ConfigMaps; a Helm
    hook's ConfigMap (the chart's config check holds a copy) is not the installed config,
    and is left alone, whatever it holds."""
    shipped = (ROOT / "deploy" / "helm" / "gpuadm" / "templates" / "_helpers.tpl").read_text()
    # What helm renders of the template: the values indented under each key.
    values = (ROOT / "examples" / "policy.yaml").read_text()
    hook = config_map("gpuadm-config-check", POLICY_KEY, "classes: 5\n").replace(
        "metadata:\n", "metadata:\n  annotations:\n    helm.sh/hook: pre-install,pre-upgrade\n"
    )
    assert "helm.sh/hook" in hook
    rendered = (
        config_map(POLICY_MAP, POLICY_KEY, values)
        + "---\n"
        + config_map(QUOTAS_MAP, QUOTAS_KEY, "namespaces:\n  team-a: {a100: 1, t4: 1}\n")
        + "---\n"
        + hook
    )
    assert "policy.yaml: |" in shipped
    result = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "check-config", "-"],
        input=rendered,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok: 1 policy and 1 quota config(s) are valid" in result.stdout


def test_the_config_map_keys_are_those_serve_reads() -> None:
    assert CONFIG_MAPS == {
        "policy": (POLICY_MAP, POLICY_KEY),
        "quotas": (QUOTAS_MAP, QUOTAS_KEY),
    }


def test_a_missing_file_could_not_be_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", "/nonexistent.yaml"]) == 2
    err = capsys.readouterr().err
    assert err == "gpuadm: cannot read /nonexistent.yaml: No such file or directory\n"


def test_a_governed_gpu_stack_namespace_is_warned_of_at_the_exemptions_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # configuration.md's complete example once exempted kube-system alone: the GPU
    # Operator's device plugin was then refused, and check-config said "ok".
    policy = tmp_path / "policy.yaml"
    policy.write_text("exemptNamespaces: [kube-system]\nclasses:\n  h100:\n    backend: nvidia\n")
    assert main(["check-config", str(policy)]) == 0
    out = capsys.readouterr().out
    assert (
        f"warning: {policy}:1: exemptNamespaces: class h100 (nvidia) needs NVIDIA's device "
        "plugin, and no namespace it installs into by default is exempt" in out
    )


def test_from_the_cluster_its_configmaps_are_checked_against_its_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.webhook.cli.apiserver import fake_apiserver
    from tests.webhook.cli.test_failures import _config_maps

    h100 = {
        "metadata": {
            "name": "gpu-0",
            "labels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
            },
        },
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }
    cpu = {"metadata": {"name": "cpu-0", "labels": {"kubernetes.io/os": "linux"}}, "status": {}}
    with fake_apiserver() as apiserver:
        apiserver.objects["/api/v1/namespaces/gpuadm-system/configmaps"] = _config_maps()
        apiserver.objects["/api/v1/nodes"] = {
            "kind": "NodeList",
            "metadata": {},
            "items": [h100, cpu],
        }
        kubeconfig = apiserver.kubeconfig(tmp_path / "kubeconfig")
        assert main(["check-config", "--from-cluster", "--kubeconfig", str(kubeconfig)]) == 0
    out = capsys.readouterr().out
    # The examples' config, read from its ConfigMaps; the one GPU node holds H100s.
    assert "ok: 1 policy and 1 quota config(s) are valid" in out
    assert "NVIDIA-H100-80GB-HBM3                1       8      -        h100" in out
    assert (
        "warning: configmap gpuadm-system/gpuadm-policy: nodes: class a100: no node has its GPUs"
    ) in out


def test_from_a_cluster_without_gpuadms_configmaps_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.webhook.cli.apiserver import fake_apiserver

    with fake_apiserver() as apiserver:
        apiserver.objects["/api/v1/nodes"] = {"kind": "NodeList", "metadata": {}, "items": []}
        kubeconfig = apiserver.kubeconfig(tmp_path / "kubeconfig")
        assert main(["check-config", "--from-cluster", "--kubeconfig", str(kubeconfig)]) == 1
    out = capsys.readouterr().out
    assert "configmap gpuadm-system/gpuadm-policy: not found" in out
    assert "configmap gpuadm-system/gpuadm-quotas: not found" in out


COHORT = """\
namespaces:
  team-a:
    cohort: research
    a100: 4
    borrow: {a100: 2}
  team-b:
    cohort: research
    a100: 4
    lend: {a10o: 3}
"""


def test_check_config_names_the_line_of_a_cohort_s_refusal_and_of_an_unknown_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(COHORT.replace("{a100: 2}", "{a100: 2x}"))
    assert main(["check-config", str(POLICY), str(quotas)]) == 1
    out = capsys.readouterr().out
    assert f"{quotas}:5: namespaces.team-a.borrow.a100: '2x' is not a quantity" in out
    quotas.write_text(COHORT)
    assert main(["check-config", str(POLICY), str(quotas)]) == 1
    out = capsys.readouterr().out
    assert f"{quotas}:9: namespaces.team-b.lend.a10o:" in out
