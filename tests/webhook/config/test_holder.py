"""The config holder: what a new snapshot in force is told about, and what a bad one leaves.

No config is never an empty config: a part that cannot be read (its ConfigMap or key gone,
its text empty or broken) is rejected like any invalid edit, and keeps its last good version.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from tests.builders import POLICY_YAML, QUOTAS_YAML
from webhook.config.read_budget import MAX_OVERRUNNING, ReadOverran, read_within
from webhook.config.snapshot import (
    NO_QUOTAS,
    QUOTAS_PART,
    RETRY_OVERRUN_SECONDS,
    ConfigHolder,
    Missing,
    PartText,
    snapshot_from_text,
)
from webhook.observe.metrics import Metrics

POLICY = PartText(POLICY_YAML, "policy.yaml")
QUOTAS = PartText(QUOTAS_YAML, "quotas.yaml")
LIMITS_OF_TEAM_A = {"a100": 4, "*": 5}


def valid(metrics: Metrics, part: str) -> float | None:
    return metrics.registry.get_sample_value("gpuadm_config_valid", {"config": part})


def test_a_new_policy_in_force_logs_its_warnings(caplog: pytest.LogCaptureFixture) -> None:
    holder = ConfigHolder()
    text = "classes:\n  any:\n    backend: volcano\n    memory: 24Gi\n"
    holder.offer(snapshot_from_text(text, None, policy_source="p", quotas_source="q"))
    assert "class any (volcano) lists neither `models` nor `gpuTypes`" in caplog.text


@pytest.mark.parametrize(
    ("quotas", "reason"),
    [
        pytest.param(
            PartText(Missing("ConfigMap gpuadm-system/gpuadm-quotas not found"), "q"),
            "ConfigMap gpuadm-system/gpuadm-quotas not found",
            id="configmap-deleted",
        ),
        pytest.param(
            PartText(Missing("has no key quotas.yaml (its keys: quotas.yml)"), "q"),
            "has no key quotas.yaml (its keys: quotas.yml)",
            id="key-renamed",
        ),
        pytest.param(PartText("", "q"), "q:1: the document is empty", id="value-emptied"),
        pytest.param(PartText("namespaces:\n  team-a:\n", "q"), "", id="cut-short"),
        pytest.param(PartText("namespaces: [", "q"), "not valid YAML", id="broken-yaml"),
        pytest.param(PartText("default:\n  1: 2\n", "q"), "the key 1 is not text", id="key-1"),
        pytest.param(PartText("a: " + "[" * 900, "q"), "nested deeper", id="nested-900"),
    ],
)
def test_quotas_that_cannot_be_read_keep_the_last_good_limits(
    quotas: PartText, reason: str
) -> None:
    metrics = Metrics()
    holder = ConfigHolder(metrics=metrics)
    assert holder.update(POLICY, QUOTAS).applied
    update = holder.update(POLICY, quotas)
    assert not update.applied
    assert reason in update.rejected[QUOTAS_PART]
    assert holder.current.quotas.limits_for("team-a") == LIMITS_OF_TEAM_A
    assert holder.current.quotas_missing is None
    assert valid(metrics, QUOTAS_PART) == 0
    assert reason in holder.problems()[QUOTAS_PART]


def test_quotas_cut_short_to_no_namespaces_are_not_taken_for_an_empty_config() -> None:
    # "namespaces:" alone reads as null, which is not a mapping of namespaces: refused,
    # where reading it as "no namespaces" would switch every namespace's limits off.
    holder = ConfigHolder()
    holder.update(POLICY, QUOTAS)
    assert QUOTAS_PART in holder.update(POLICY, PartText("namespaces:\n", "q")).rejected
    assert holder.current.quotas.limits_for("team-a") == LIMITS_OF_TEAM_A


def test_before_any_valid_quotas_the_snapshot_says_why_instead_of_no_limits() -> None:
    holder = ConfigHolder()
    missing = PartText(Missing("ConfigMap gpuadm-system/gpuadm-quotas not found"), "q")
    assert holder.update(POLICY, missing).applied
    assert holder.current.quotas_missing == "ConfigMap gpuadm-system/gpuadm-quotas not found"
    # The reason follows the latest read, so the denial says what is wrong now.
    holder.update(POLICY, PartText("", "q"))
    assert "the document is empty" in (holder.current.quotas_missing or "")
    assert holder.update(POLICY, QUOTAS).applied
    assert holder.current.quotas_missing is None
    assert holder.current.quotas.limits_for("team-a") == LIMITS_OF_TEAM_A


def test_no_quotas_at_all_takes_an_explicit_document() -> None:
    holder = ConfigHolder()
    holder.update(POLICY, PartText("namespaces: {}\n", "q"))
    assert holder.current.quotas_missing is None
    assert holder.current.quotas.limits_for("team-a") == {}
    holder.update(POLICY, NO_QUOTAS)  # a command run without --quotas
    assert holder.current.quotas_missing is None


def test_a_policy_edit_applies_while_the_quotas_are_broken() -> None:
    holder = ConfigHolder()
    holder.update(POLICY, QUOTAS)
    edited = PartText(POLICY_YAML + "  b200:\n    backend: nvidia\n", "p")
    update = holder.update(edited, PartText("", "q"))
    assert update.applied
    assert "b200" in holder.current.policy.classes
    assert holder.current.quotas.limits_for("team-a") == LIMITS_OF_TEAM_A


def test_a_rejection_is_logged_once_a_minute_and_the_recovery_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gpuadm.config")
    metrics = Metrics()
    now = [0.0]
    holder = ConfigHolder(metrics=metrics, clock=lambda: now[0])
    holder.update(POLICY, QUOTAS)
    for _ in range(60):  # a file source reads the same bad file every second
        holder.update(POLICY, PartText("", "q"))
        now[0] += 1
    assert caplog.text.count("config not reloaded (gpuadm-quotas)") == 1
    assert "still invalid" not in caplog.text
    holder.update(POLICY, PartText("", "q"))  # a minute on: said again, not counted again
    assert caplog.text.count("config gpuadm-quotas is still invalid") == 1
    rejected = metrics.registry.get_sample_value(
        "gpuadm_config_reloads_total", {"config": QUOTAS_PART, "result": "rejected"}
    )
    assert rejected == 1
    holder.update(POLICY, QUOTAS)
    assert "config gpuadm-quotas is valid again" in caplog.text
    assert valid(metrics, QUOTAS_PART) == 1


def test_no_policy_ever_read_is_no_config_and_says_why() -> None:
    holder = ConfigHolder()
    missing = PartText(Missing("ConfigMap gpuadm-system/gpuadm-policy not found"), "p")
    assert not holder.update(missing, QUOTAS).applied
    assert not holder.loaded
    with pytest.raises(Exception, match="gpuadm-policy not found"):
        _ = holder.current


async def test_a_read_over_its_budget_is_refused_and_the_last_good_config_stays() -> None:
    metrics = Metrics()
    holder = ConfigHolder(metrics=metrics, read_seconds=0)
    holder.update(POLICY, QUOTAS)
    edited = PartText(QUOTAS_YAML.replace("a100: 4", "a100: 6"), "quotas.yaml")
    # No read ends within no time at all: the worker is left behind, the loop goes on.
    update = await holder.reload(POLICY, edited)
    assert not update.applied
    assert "quotas.yaml: not read within 0 s, and abandoned" in update.rejected[QUOTAS_PART]
    assert holder.current.quotas.limits_for("team-a") == LIMITS_OF_TEAM_A
    assert valid(metrics, QUOTAS_PART) == 0
    assert holder.read_pending


async def test_a_text_left_unread_is_read_again_a_minute_on_and_a_refused_one_never() -> None:
    now = [0.0]
    holder = ConfigHolder(read_seconds=0, clock=lambda: now[0])
    holder.update(POLICY, QUOTAS)
    edited = PartText(QUOTAS_YAML.replace("a100: 4", "a100: 6"), "quotas.yaml")
    await holder.reload(POLICY, edited)
    # Offered again at the next poll: not read, so no thread and core spent on it again.
    holder.update(POLICY, edited)
    assert holder.current.quotas.limits_for("team-a")["a100"] == 4
    assert holder.read_pending
    now[0] += RETRY_OVERRUN_SECONDS
    holder.update(POLICY, edited)  # a calmer moment: the same text, read in time
    assert holder.current.quotas.limits_for("team-a")["a100"] == 6
    assert not holder.read_pending
    # A text refused for what it says is not read again at the next poll or relist, so a
    # budget of nothing still finds its verdict rather than a second read.
    broken = PartText("namespaces: [", "quotas.yaml")
    holder.update(POLICY, broken)
    now[0] += RETRY_OVERRUN_SECONDS
    update = await holder.reload(POLICY, broken)
    assert "not valid YAML" in update.rejected[QUOTAS_PART]
    assert not holder.read_pending


async def test_no_more_reads_start_while_two_run_past_their_budget() -> None:
    # A worker thread cannot be stopped; past two of them still running, a read is not
    # even started, and says why, rather than pile up threads that each hold a core.
    release = threading.Event()
    try:
        for _ in range(MAX_OVERRUNNING):
            with pytest.raises(ReadOverran, match="not read within 0 s"):
                await read_within(release.wait, source="slow.yaml", seconds=0)
        with pytest.raises(ReadOverran, match="earlier reads still run past their budget"):
            await read_within(lambda: 1, source="next.yaml", seconds=5)
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while True:  # the threads end once let go, and reads start again
        try:
            assert await read_within(lambda: 1, source="next.yaml", seconds=5) == 1
            break
        except ReadOverran:
            assert time.monotonic() < deadline, "the released reads never ended"
            await asyncio.sleep(0.05)
