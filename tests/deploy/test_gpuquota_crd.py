"""The GPUQuota CRD against what the publisher writes: the columns `kubectl get gpuquotas`
shows, in both copies of the CRD, and a status schema that holds every field of a report."""

from __future__ import annotations

from fractions import Fraction as F
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import load_quotas
from policies.quota.queue import Waiting
from webhook.leader.publish import quota_object
from webhook.quota.holdings import Holding
from webhook.quota.report import NAMED_PODS_MAX, namespace_report
from webhook.quota.reservations import Reservation

REPO = Path(__file__).resolve().parents[2]
CRDS = [REPO / "deploy/base/crd.yaml", REPO / "deploy/helm/gpuadm/templates/gpuquota-crd.yaml"]

# Name, type and jsonPath of each column, in the order kubectl shows them.
COLUMNS = [
    ("Class", "string", ".status.class"),
    ("Mode", "string", ".status.mode"),
    ("Limit", "string", ".status.limit"),
    ("In use", "string", ".status.inUse"),
    ("Reserved", "string", ".status.reserved"),
    ("Waiting", "integer", ".status.waiting"),
    ("Borrowed", "string", ".status.borrowed"),
    ("Budget", "string", ".status.budget"),
    ("Budget used", "string", ".status.budgetUsed"),
    ("Age", "date", ".metadata.creationTimestamp"),
]
BUDGET_FIELDS = {
    "budget": "GPU-hours of the class the namespace may use per window, e.g. 500h/7d",
    "budgetUsed": "GPU-hours used in the budget's window, as counted at the last checkpoint",
}


def version(path: Path) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    (served,) = crd["spec"]["versions"]
    assert isinstance(served, dict)
    return served


def status_schema(path: Path) -> dict[str, Any]:
    schema: dict[str, Any] = version(path)["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


@pytest.mark.parametrize("path", CRDS, ids=lambda p: str(p.relative_to(REPO)))
def test_columns(path: Path) -> None:
    columns = version(path)["additionalPrinterColumns"]
    assert [(c["name"], c["type"], c["jsonPath"]) for c in columns] == COLUMNS
    described = {c["name"]: c.get("description") for c in columns}
    assert described["Budget"] == BUDGET_FIELDS["budget"]
    assert described["Budget used"] == BUDGET_FIELDS["budgetUsed"]


@pytest.mark.parametrize("path", CRDS, ids=lambda p: str(p.relative_to(REPO)))
def test_each_status_column_reads_a_field_of_its_type(path: Path) -> None:
    properties = status_schema(path)["properties"]
    for name, kind, json_path in COLUMNS:
        if json_path.startswith(".status."):
            field = json_path.removeprefix(".status.")
            assert properties[field]["type"] == kind, name


@pytest.mark.parametrize("path", CRDS, ids=lambda p: str(p.relative_to(REPO)))
def test_budget_fields_are_strings_described_for_tenants(path: Path) -> None:
    properties = status_schema(path)["properties"]
    for field, description in BUDGET_FIELDS.items():
        assert properties[field] == {"type": "string", "description": description}


def schema_errors(value: Any, schema: dict[str, Any], at: str = "status") -> list[str]:
    """What of `value` the structural schema does not allow (types, fields, bounds)."""
    kind = schema["type"]
    errors = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{at}: {value!r} is not one of {schema['enum']}")
    if kind == "string" and isinstance(value, str):
        return errors
    if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
        if value < schema.get("minimum", value):
            errors.append(f"{at}: {value} is below {schema['minimum']}")
        return errors
    if kind == "array" and isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{at}: {len(value)} items, more than {schema['maxItems']}")
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{at}[{i}]")
        return errors
    if kind == "object" and isinstance(value, dict):
        properties = schema.get("properties", {})
        errors += [f"{at}.{k}: required" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            if key not in properties:
                errors.append(f"{at}.{key}: not in the schema (the apiserver prunes it)")
            else:
                errors += schema_errors(item, properties[key], f"{at}.{key}")
        return errors
    return [f"{at}: {value!r} is not of type {kind}"]


QUOTAS = """
namespaces:
  team-q: {mode: queue, a100: 2, budget: {a100: 500h/7d, h100: 10h/1d, "*": 900h/30d}}
"""


def full_statuses() -> list[dict[str, Any]]:
    """The status of every object a busy namespace with budgets publishes: every field set,
    the lists past their caps."""
    holders = [Holding("team-q", "a100", F(1, 2), f"p{i}") for i in range(NAMED_PODS_MAX + 2)]
    line = [
        Waiting(f"uid-w{i}", "team-q", f"w{i}", "a100", F(1), 0, "2026-01-01T00:00:00Z")
        for i in range(NAMED_PODS_MAX + 3)
    ]
    reports = namespace_report(
        "team-q",
        load_quotas(QUOTAS),
        holders,
        [Reservation("a100", F(1), 0.0, "new")],
        line,
        budget_used={"a100": F(1_845_900), "h100": F(0), "*": F(3 * 3600)},
    )
    return [quota_object(r)["status"] for r in reports]


@pytest.mark.parametrize("path", CRDS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_status_schema_holds_every_field_the_publisher_writes(path: Path) -> None:
    statuses = full_statuses()
    assert {s["class"] for s in statuses} == {"a100", "h100", "*"}
    written = {key for status in statuses for key in status}
    assert {"limit", "budget", "budgetUsed", "holdersNotListed", "queueNotListed"} <= written
    schema = status_schema(path)
    assert [e for status in statuses for e in schema_errors(status, schema)] == []


def test_the_schema_check_sees_a_field_the_schema_lacks() -> None:
    (status, *_) = full_statuses()
    status["budgetLeft"] = "1h"
    status["waiting"] = "3"
    assert schema_errors(status, status_schema(CRDS[0])) == [
        "status.waiting: '3' is not of type integer",
        "status.budgetLeft: not in the schema (the apiserver prunes it)",
    ]
