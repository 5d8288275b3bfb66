"""The chart's schema of `policy` and `quotas`, made from the models gpuadm loads them with.

`helm install` checks the keys of both against the JSON schema of `Policy` and `QuotaConfig`
(deploy/tools/values_schema.py writes it into values.schema.json): every config gpuadm
accepts installs, and a key, class or amount that gpuadm would refuse is refused by Helm,
named, before anything is installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import load_policy
from policies.loading import load_quotas
from tests.builders import POLICY_YAML, QUOTAS_YAML
from tests.deploy.test_manifests import tools  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpuadm"
GENERATOR = REPO / "deploy" / "tools" / "values_schema.py"
SHIPPED = {
    "examples/policy.yaml": "policy",
    "examples/quotas.yaml": "quotas",
    "examples/backends/policy.yaml": "policy",
    "deploy/base/config/policy.yaml": "policy",
    "deploy/base/config/quotas.yaml": "quotas",
}


def _helm_template(
    helm: Path, values: dict[str, Any], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    return subprocess.run(
        [str(helm), "template", "g", str(CHART), "-f", str(file)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_schema_file_is_what_the_models_make() -> None:
    checked = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("value", "text"),
    [
        *((value, (REPO / path).read_text()) for path, value in SHIPPED.items()),
        ("policy", POLICY_YAML),
        ("quotas", QUOTAS_YAML),
    ],
    ids=[*SHIPPED, "tests-policy", "tests-quotas"],
)
def test_every_config_gpuadm_loads_installs_as_keys(
    tools: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    value: str,
    text: str,
) -> None:
    if value == "policy":
        load_policy(text)
    else:
        load_quotas(text)
    keys = yaml.safe_load(text)
    # The chart's own policy keys (exemptNamespaces) stay unless given: as an admin's -f.
    rendered = _helm_template(tools["helm"], {value: keys}, tmp_path)
    assert rendered.returncode == 0, rendered.stderr


@pytest.mark.parametrize(
    ("values", "why"),
    [
        pytest.param(
            {"policy": {"classes": {}, "bogusKey": 1}},
            "additional properties 'bogusKey' not allowed",
            id="policy-typo",
        ),
        pytest.param(
            {"policy": {"classes": {"t4": {"backend": "bogus", "resource": "x"}}}},
            "/policy/classes/t4",
            id="unknown-backend",
        ),
        pytest.param(
            {"policy": {"classes": {"a100": {"backend": "nvidia", "models": ["A100"], "x": 1}}}},
            "additional properties 'x' not allowed",
            id="class-typo",
        ),
        pytest.param(
            {"policy": {"classes": {}, "exemptNamespaces": ["Kube_System"]}},
            "does not match pattern",
            id="exempt-namespace",
        ),
        pytest.param(
            {"quotas": {"namespaces": {"team-a": {"t4": "2x"}}}},
            "'2x' does not match pattern",
            id="amount-not-a-quantity",
        ),
        pytest.param(
            {"quotas": {"namespaces": {"team-a": {"t4": -3}}}},
            "minimum: got -3, want 0",
            id="negative-amount",
        ),
        pytest.param(
            {"quotas": {"namespaces": {"Bad_NS": {"t4": 1}}}},
            "additional properties 'Bad_NS' not allowed",
            id="namespace-name",
        ),
        pytest.param(
            {"quotas": {"mode": "strict", "namespaces": {}}},
            "value must be one of",
            id="mode",
        ),
        pytest.param(
            {"quotas": {"namespaces": {"team-a": {"budget": {"t4": {"hours": 5}}}}}},
            "/quotas/namespaces/team-a/budget/t4",
            id="budget-not-a-text",
        ),
        pytest.param(
            {"quotas": {"default": {"budget": {"t4": 5}}, "namespaces": {}}},
            "/quotas/default/budget/t4",
            id="default-budget-not-a-text",
        ),
    ],
)
def test_helm_refuses_what_gpuadm_would_refuse_naming_it(
    tools: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    values: dict[str, Any],
    why: str,
) -> None:
    rendered = _helm_template(tools["helm"], values, tmp_path)
    assert rendered.returncode != 0
    assert "values don't meet the specifications of the schema" in rendered.stderr
    assert why in rendered.stderr, rendered.stderr


@pytest.mark.parametrize("amount", [0, 2, 0.5, "500m", "2", "1e3", "1.5", "+1", ".5", " 2 "])
def test_every_amount_gpuadm_reads_installs(
    tools: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    amount: object,
) -> None:
    quotas = {"namespaces": {"team-a": {"a100": amount}}}
    load_quotas(yaml.safe_dump(quotas))
    rendered = _helm_template(tools["helm"], {"quotas": quotas}, tmp_path)
    assert rendered.returncode == 0, rendered.stderr
