"""A spent GPU-hour budget at `/validate` and `/mutate`: refused, warned, or held in line."""

from __future__ import annotations

import dataclasses
from fractions import Fraction as F
from typing import Any

import jsonpatch
import orjson

from policies.quota.gpu_hours import Run
from tests.builders import POLICY_YAML, pod, review
from webhook.admission import decisions
from webhook.admission.decision import Decision
from webhook.claims.lookup import NoClaims
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.gpu_hours.ledger import HoursLedger
from webhook.gpu_hours.runs import RunIndex
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest, decode_review

QUOTAS = """
mode: enforce
namespaces:
  team-a: {a100: 4, budget: {a100: 1h/1d}}
  team-w: {mode: warn, budget: {a100: 1h/1d}}
  team-q: {mode: queue, budget: {a100: 1h/1d}}
"""
NOW = 100_000


def holder() -> ConfigHolder:
    return ConfigHolder(
        snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")
    )


def spent(namespace: str) -> HoursLedger:
    """A ledger whose namespace ran one A100 for an hour and a half today."""
    runs = RunIndex()
    runs.replace([("u", Run(namespace, "a100", F(1), NOW - 7200, NOW - 1800, "old"))])
    return HoursLedger(runs, None, clock=lambda: NOW)


def request(body: dict[str, Any], namespace: str) -> AdmissionRequest:
    decoded = decode_review(orjson.dumps(review(body, uid="uid-1", namespace=namespace)))
    return dataclasses.replace(decoded, kind="Pod")


async def stored(config: ConfigHolder, namespace: str, hours: HoursLedger) -> dict[str, Any]:
    """A pod of half an A100 as the apiserver stores it after /mutate."""
    body = pod({"gpuadm.io/a100": "0.5"})
    body["metadata"].update(namespace=namespace, uid=f"uid-{namespace}")
    ledger = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False)
    decision = await decisions.mutate(
        request(body, namespace), config=config, templates=_NoTemplates(), quota=ledger
    )
    return dict(jsonpatch.apply_patch(body, decision.patch))


class _NoTemplates:
    async def ensure(self, namespace: str, templates: object) -> None:
        raise AssertionError("no DRA class here")


async def validate(
    config: ConfigHolder, body: dict[str, Any], namespace: str, hours: HoursLedger
) -> Decision:
    return await decisions.validate(
        request(body, namespace),
        config=config,
        quota=QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False),
        claims=NoClaims(),
        trusted=decisions.Trusted("gpuadm"),
        budgets=hours,
    )


async def test_a_pod_of_a_spent_class_is_refused_with_the_numbers_and_reserves_nothing() -> None:
    config, hours = holder(), spent("team-a")
    decision = await validate(config, await stored(config, "team-a", hours), "team-a", hours)
    assert decision.outcome == "denied"
    # Hourly buckets: 800 s before 93600, 3600 s before 97200, 1000 s after. When the second
    # leaves the day's window, at 97200 + 86400, 1000 s are left of the 3600 allowed.
    assert decision.reason == (
        'namespace "team-a": a100 GPU-hour budget spent: used 1.5h of 1h in the last 1d; '
        "enough frees at 1970-01-03T03:00:00Z; running pods are not stopped"
    )
    assert decision.review("uid-1")["response"]["status"]["code"] == 403


async def test_in_warn_mode_it_is_admitted_with_what_enforce_would_have_said() -> None:
    config, hours = holder(), spent("team-w")
    decision = await validate(config, await stored(config, "team-w", hours), "team-w", hours)
    assert decision.outcome == "warned"
    assert decision.quota is not None
    assert decision.quota.would_deny
    assert any(
        "GPU-hour budget spent" in w and "enforce would deny" in w for w in decision.warnings
    )


async def test_in_a_queue_namespace_the_pod_is_gated_and_waits_uncharged() -> None:
    config, hours = holder(), spent("team-q")
    body = await stored(config, "team-q", hours)
    # A class with a budget and no limit gets gpuadm's gate at creation in a queue namespace.
    assert [gate["name"] for gate in body["spec"]["schedulingGates"]] == ["gpuadm.io/quota"]
    decision = await validate(config, body, "team-q", hours)
    assert decision.outcome == "queued"
    assert decision.reason.startswith('namespace "team-q": a100 GPU-hour budget spent')
    assert any("the scheduling gate gpuadm.io/quota holds it" in w for w in decision.warnings)


async def test_a_budget_not_spent_admits_and_another_class_is_not_judged() -> None:
    config = holder()
    hours = HoursLedger(RunIndex(), None, clock=lambda: NOW)
    decision = await validate(config, await stored(config, "team-a", hours), "team-a", hours)
    assert decision.outcome == "allowed"
    assert hours.judge("team-a", "t4", config.current) is None
