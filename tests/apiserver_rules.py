"""The apiserver's rules for the fields gpuadm writes, checked on a pod after its patch.

These are the checks the apiserver runs after all mutating webhooks (pod validation): an
extended resource must be an integer, its request must equal its limit, a node affinity must
be well formed, labels must be valid label values.
"""

from __future__ import annotations

import re
from typing import Any

from policies.quantity import parse_quantity

LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
OPERATORS = {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}
NATIVE = {"cpu", "memory", "ephemeral-storage"}


def violations(pod: dict[str, Any], domain: str) -> list[str]:
    """Return every rule the pod breaks; an empty list means the apiserver would accept it."""
    problems: list[str] = []
    spec = pod.get("spec") or {}
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            problems += _resources(c, domain)
    problems += _affinity(spec.get("affinity"))
    metadata = pod.get("metadata") or {}
    for key, value in (metadata.get("labels") or {}).items():
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            problems.append(f"label {key}={value!r} is not a valid label value")
    for key, value in (metadata.get("annotations") or {}).items():
        if not isinstance(value, str):
            problems.append(f"annotation {key} is not a string")
    return problems


def _resources(c: dict[str, Any], domain: str) -> list[str]:
    problems = []
    resources = c.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    for name in {*limits, *requests}:
        if name.startswith(domain + "/"):
            problems.append(f"{c['name']}: class key {name} left in the pod")
        if name in NATIVE or name.startswith("hugepages-"):
            continue
        if name not in limits:
            problems.append(f"{c['name']}: extended resource {name} has a request but no limit")
            continue
        amount = parse_quantity(limits[name])
        if amount.denominator != 1:
            problems.append(f"{c['name']}: {name}={limits[name]} is not an integer")
        if name in requests and parse_quantity(requests[name]) != amount:
            problems.append(f"{c['name']}: {name} request differs from its limit")
    return problems


def _affinity(affinity: dict[str, Any] | None) -> list[str]:
    if not affinity:
        return []
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return []
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return ["requiredDuringSchedulingIgnoredDuringExecution has no nodeSelectorTerms"]
    problems = []
    for term in terms:
        for expression in [*(term.get("matchExpressions") or []), *(term.get("matchFields") or [])]:
            operator = expression.get("operator")
            if not expression.get("key") or operator not in OPERATORS:
                problems.append(f"bad node selector requirement {expression}")
            elif operator in {"In", "NotIn"} and not expression.get("values"):
                problems.append(f"operator {operator} without values in {expression}")
    return problems
