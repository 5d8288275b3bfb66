"""The audit log (fields of every decision kind, rotation, nothing lost) and the metrics."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.builders import POLICY_YAML, pod, review
from tests.webhook.calls import decoded_patch, post
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.observe import audit_log
from webhook.observe.audit_log import AuditLog
from webhook.observe.metrics import Metrics
from webhook.observe.readings import AuditReading
from webhook.quota.ledger import QuotaLedger
from webhook.quota.readings import export_quota
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.server.app import create_app
from webhook.server.settings import Settings

Client = TestClient[web.Request, web.Application]
QUOTAS = "namespaces:\n  team-q: {h100: 2}\n  team-w: {h100: 1}\nmode: enforce\n"
FIELDS = {
    "time",
    "endpoint",
    "uid",
    "operation",
    "dryRun",
    "namespace",
    "pod",
    "user",
    "groups",
    "class",
    "demand",
    "decision",
    "reason",
    "warnings",
    "patch",
    "quotaInUse",
    "quotaLimit",
    "wouldDeny",
    "policyRevision",
    "quotasRevision",
    "latencyMs",
}


@pytest.fixture
def audit_file(tmp_path: Path) -> Path:
    return tmp_path / "audit" / "audit.log"


@pytest.fixture
async def served(
    aiohttp_client: Callable[..., Awaitable[Client]], audit_file: Path
) -> tuple[Client, Metrics, AuditLog]:
    snapshot = snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")
    metrics = Metrics()
    audit = AuditLog(str(audit_file))
    usage = UsageIndex()
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=False, metrics=metrics)
    holder = ConfigHolder(snapshot)
    export_quota(metrics, ledger.book, holder, usage)
    app = create_app(Settings(), holder, quota=ledger, metrics=metrics, audit=audit)
    return await aiohttp_client(app), metrics, audit


async def create(client: Client, limits: dict[str, str], namespace: str) -> dict[str, Any]:
    body = pod(limits)
    body["metadata"]["namespace"] = namespace
    uid = str(uuid.uuid4())
    mutated = await post(client, "/mutate", review(body, namespace=namespace, uid=uid))
    if not mutated["allowed"]:
        return mutated
    stored = jsonpatch.apply_patch(body, decoded_patch(mutated)) if "patch" in mutated else body
    return await post(client, "/validate", review(stored, namespace=namespace, uid=uid))


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_every_decision_kind_is_audited_with_the_same_fields(
    served: tuple[Client, Metrics, AuditLog], audit_file: Path
) -> None:
    client, _, audit = served
    await create(client, {"gpuadm.io/h100": "1"}, "team-q")  # mutated, then allowed
    await create(client, {"gpuadm.io/h100": "1"}, "team-q")  # mutated, then warned (100%)
    await create(client, {"gpuadm.io/h100": "1"}, "team-q")  # mutated, then denied by quota
    await create(client, {"gpuadm.io/h100": "0.5"}, "team-q")  # denied by the rewrite
    await create(client, {"cpu": "1"}, "team-q")  # allowed, nothing to do
    audit.close()
    records = lines(audit_file)
    assert all(set(r) == FIELDS for r in records)
    kinds = [(r["endpoint"], r["decision"]) for r in records]
    assert kinds == [
        ("mutate", "mutated"),
        ("validate", "allowed"),
        ("mutate", "mutated"),
        ("validate", "warned"),
        ("mutate", "mutated"),
        ("validate", "denied"),
        ("mutate", "denied"),
        ("mutate", "allowed"),
        ("validate", "allowed"),
    ]
    first_mutate, first_validate, _, warned, _, denied, refused, *_ = records
    assert first_mutate["class"] == "h100"
    assert first_mutate["demand"] == "h100=1"
    assert "/spec/containers/0/resources" in first_mutate["patch"]
    assert first_mutate["user"] == "alice"
    assert first_mutate["groups"] == ["system:authenticated"]
    assert (first_validate["quotaInUse"], first_validate["quotaLimit"]) == ("0", "2")
    assert "quota is 100% used" in warned["warnings"][-1]
    assert denied["reason"] == (
        'namespace "team-q": h100 quota exceeded: requested 1, in use 2 of 2'
    )
    assert "backend nvidia gives whole GPUs only" in refused["reason"]
    assert first_mutate["policyRevision"]
    assert first_mutate["quotasRevision"]
    assert all(r["latencyMs"] >= 0 for r in records)


async def test_warn_mode_audits_what_enforce_would_have_denied(
    aiohttp_client: Callable[..., Awaitable[Client]], audit_file: Path
) -> None:
    snapshot = snapshot_from_text(
        POLICY_YAML, QUOTAS.replace("enforce", "warn"), policy_source="p", quotas_source="q"
    )
    audit = AuditLog(str(audit_file))
    ledger = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False)
    client = await aiohttp_client(
        create_app(Settings(), ConfigHolder(snapshot), quota=ledger, audit=audit)
    )
    answer = await create(client, {"gpuadm.io/h100": "2"}, "team-w")
    assert answer["allowed"] is True
    audit.close()
    validated = lines(audit_file)[-1]
    assert (validated["decision"], validated["wouldDeny"]) == ("warned", True)
    assert "enforce would deny" in validated["warnings"][-1]


def test_rotation_by_size_loses_no_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path), max_bytes=2000, backups=50)
    audit.start()
    for index in range(300):
        audit.write({"n": index, "padding": "x" * 40})
    audit.close()
    files = sorted(tmp_path.glob("audit.log*"))
    assert len(files) > 5, "the log never rotated"
    seen = sorted(r["n"] for f in files for r in lines(f))
    assert seen == list(range(300))


def test_records_accepted_before_shutdown_are_written(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    audit = AuditLog(str(path))
    audit.start()
    for index in range(5000):
        audit.write({"n": index})
    audit.close()
    assert [r["n"] for r in lines(path)] == list(range(5000))


def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_failing_sink_keeps_the_records_and_writes_them_once_it_heals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(audit_log, "FIRST_RETRY_SECONDS", 0.01)
    monkeypatch.setattr(audit_log, "MAX_RETRY_SECONDS", 0.02)
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the log's directory should be")
    audit = AuditLog(str(blocker / "audit.log"))
    audit.start()
    for index in range(10):
        audit.write({"n": index})
    _until(lambda: audit.reading().write_errors >= 3)
    assert audit.reading().pending == 10
    assert caplog.text.count("audit log: cannot write to") == 1  # once, however often
    blocker.unlink()  # the disk is back
    _until(lambda: audit.reading().pending == 0)
    audit.close()
    assert [r["n"] for r in lines(blocker / "audit.log")] == list(range(10))
    assert audit.reading().dropped == 0


def test_past_the_backlog_bound_records_are_dropped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_log, "MAX_PENDING_RECORDS", 5)
    blocker = tmp_path / "logs"
    blocker.write_text("")
    audit = AuditLog(str(blocker / "audit.log"))  # not started: nothing is written
    for index in range(8):
        audit.write({"n": index})
    assert audit.reading() == AuditReading(pending=5, dropped=3, write_errors=0)


async def test_metrics_move_as_requests_are_made(
    served: tuple[Client, Metrics, AuditLog],
) -> None:
    client, _, _ = served
    await create(client, {"gpuadm.io/h100": "1"}, "team-q")
    await client.post("/mutate", data=b"nonsense", headers={"Content-Type": "application/json"})
    text = await (await client.get("/metrics")).text()

    def value(name: str, **labels: str) -> float:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        raise AssertionError(f"{name}{labels} not in /metrics")

    requests = "gpuadm_admission_requests_total"
    assert value(requests, endpoint="mutate", operation="CREATE", decision="mutated") == 1
    assert value("gpuadm_admission_duration_seconds_count", endpoint="validate") == 1
    assert value("gpuadm_admission_duration_seconds_bucket", endpoint="validate", le="+Inf") == 1
    assert value("gpuadm_bad_requests_total", endpoint="mutate", status="400") == 1
    assert value("gpuadm_quota_in_use_gpus", namespace="team-q", gpu_class="h100") == 1
    assert value("gpuadm_quota_limit_gpus", namespace="team-q", gpu_class="h100") == 2
    await create(client, {"gpuadm.io/h100": "1"}, "team-q")
    text = await (await client.get("/metrics")).text()
    assert value("gpuadm_quota_in_use_gpus", namespace="team-q", gpu_class="h100") == 2
