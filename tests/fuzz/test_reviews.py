"""Fuzzing: reviews changed at every path into every JSON type never bring gpuadm down.

Whatever a review holds, the answer is a 4xx naming what was wrong with the review, or a
review that carries the request's uid and decides (allows, patches or denies) without an
internal error; and nothing is logged with a traceback. The cases are derived from a fixed
seed, so every run, here and in CI, tries the same ones.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from tests.builders import POLICY_YAML, QUOTAS_YAML
from tests.fuzz.mutations import encoded, mutated_reviews
from tests.webhook.calls import Client, MakeClient
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.observe.audit_log import AuditLog
from webhook.observe.metrics import Metrics
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.server.app import create_app
from webhook.server.settings import Settings

CASES_PER_ENDPOINT = 5000
FUZZ = settings(
    max_examples=CASES_PER_ENDPOINT,
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=False,
    # One app serves every case of a test: building it per case would cost more than the case.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
async def client(aiohttp_client: MakeClient, tmp_path: Path) -> Client:
    """Serve the test policy with a real quota ledger and audit log, as `gpuadm serve` does."""
    snapshot = snapshot_from_text(POLICY_YAML, QUOTAS_YAML, policy_source="p", quotas_source="q")
    metrics = Metrics()
    ledger = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False, metrics=metrics)
    audit = AuditLog(str(tmp_path / "audit.log"))
    app = create_app(Settings(), ConfigHolder(snapshot), quota=ledger, metrics=metrics, audit=audit)
    return await aiohttp_client(app)


async def _answer_is_clean(
    client: Client, path: str, case: tuple[Any, object], caplog: pytest.LogCaptureFixture
) -> None:
    document, uid = case
    caplog.clear()
    response = await client.post(
        path, data=encoded(document), headers={"Content-Type": "application/json"}
    )
    body: dict[str, Any] = await response.json()
    assert response.status < 500, body
    if response.status != 200:
        assert isinstance(body.get("error"), str), body
        assert body["error"], body
    else:
        answer = body["response"]
        assert answer["uid"] == uid, body
        status = answer.get("status") or {}
        assert status.get("code") != 500, body
        assert status.get("reason") != "InternalError", body
    tracebacks = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert tracebacks == [], [r.getMessage() for r in tracebacks]


@FUZZ
@given(case=mutated_reviews())
async def test_mutate_answers_every_review_cleanly(
    client: Client, caplog: pytest.LogCaptureFixture, case: tuple[Any, object]
) -> None:
    await _answer_is_clean(client, "/mutate", case, caplog)


@FUZZ
@given(case=mutated_reviews())
async def test_validate_answers_every_review_cleanly(
    client: Client, caplog: pytest.LogCaptureFixture, case: tuple[Any, object]
) -> None:
    await _answer_is_clean(client, "/validate", case, caplog)
