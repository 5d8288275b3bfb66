"""The quota report behind `gpuadm quota` and the GPUQuota objects: counts, order and caps."""

from __future__ import annotations

import re
from fractions import Fraction as F
from typing import Any

import jsonpatch
import pytest

from policies import load_quotas, plan
from policies.quota.queue import Waiting, add_gate
from tests.builders import POLICY_YAML, pod
from webhook.cli.quota import table
from webhook.config.snapshot import snapshot_from_text
from webhook.quota.holdings import Holding
from webhook.quota.ledger import QuotaLedger
from webhook.quota.readings import queue_readings
from webhook.quota.report import NAMED_PODS_MAX, ClassReport, namespace_report
from webhook.quota.reservations import MemoryStore, Reservation
from webhook.quota.usage import UsageIndex

QUOTAS = """
mode: enforce
default: {t4: 1}
namespaces:
  team-q: {mode: queue, a100: 2, h100: 1, "*": 4}
  team-e: {a100: 1}
"""


def waiting(name: str, class_name: str, charge: str, second: int, priority: int = 0) -> Waiting:
    return Waiting(
        f"uid-{name}",
        "team-q",
        name,
        class_name,
        F(charge),
        priority,
        f"2026-01-01T00:00:{second:02d}Z",
    )


def held(name: str, class_name: str, charge: str) -> Holding:
    return Holding("team-q", class_name, F(charge), name)


def by_class(reports: list[ClassReport]) -> dict[str, dict[str, Any]]:
    return {r.class_name: r.to_json() for r in reports}


def test_each_class_counts_in_use_reserved_and_waiting_and_the_cap_comes_last() -> None:
    reports = namespace_report(
        "team-q",
        load_quotas(QUOTAS),
        [held("b-train", "a100", "1"), held("a-infer", "a100", "0.5"), held("t", "t4", "1")],
        [Reservation("a100", F(1, 4), 0.0, "new"), Reservation("l4", F(1), 0.0, "fresh")],
        [
            waiting("late", "a100", "1", 9),
            waiting("early", "a100", "0.5", 1),
            waiting("urgent", "h100", "1", 5, priority=100),
        ],
    )
    # The classes it limits, holds, reserves or waits for, by name; `*` last.
    assert [r.class_name for r in reports] == ["a100", "h100", "l4", "t4", "*"]
    assert {r.mode for r in reports} == {"queue"}
    rows = by_class(reports)
    assert rows["a100"] == {
        "namespace": "team-q",
        "class": "a100",
        "mode": "queue",
        "limit": "2",
        "inUse": "1.5",
        "reserved": "0.25",
        "waiting": 2,
        "waitingGpus": "1.5",
        "holders": [{"pod": "a-infer", "gpus": "0.5"}, {"pod": "b-train", "gpus": "1"}],
        "queue": [
            {"pod": "early", "gpus": "0.5", "position": 1},
            {"pod": "late", "gpus": "1", "position": 2},
        ],
    }
    assert rows["h100"]["limit"] == "1"
    assert (rows["h100"]["inUse"], rows["h100"]["waiting"]) == ("0", 1)
    # A class without a limit has no `limit` at all, not 0.
    assert "limit" not in rows["l4"]
    assert (rows["l4"]["reserved"], rows["t4"]["inUse"]) == ("1", "1")
    # The cap counts every class, and its queue is the whole line in order.
    assert rows["*"]["limit"] == "4"
    assert (rows["*"]["inUse"], rows["*"]["reserved"]) == ("2.5", "1.25")
    assert [q["pod"] for q in rows["*"]["queue"]] == ["urgent", "early", "late"]
    assert rows["*"]["waitingGpus"] == "2.5"
    assert [h["pod"] for h in rows["*"]["holders"]] == ["a-infer", "b-train", "t"]


def test_a_namespace_under_the_default_reports_its_default_limits() -> None:
    reports = namespace_report("team-z", load_quotas(QUOTAS), [], [], [])
    assert [r.to_json() for r in reports] == [
        {
            "namespace": "team-z",
            "class": "t4",
            "mode": "enforce",
            "limit": "1",
            "inUse": "0",
            "reserved": "0",
            "waiting": 0,
            "waitingGpus": "0",
            "holders": [],
            "queue": [],
        }
    ]


@pytest.mark.parametrize(
    ("holders", "in_line", "holders_not_listed", "queue_not_listed"),
    [
        pytest.param(NAMED_PODS_MAX, NAMED_PODS_MAX, None, None, id="exactly-the-cap"),
        pytest.param(NAMED_PODS_MAX + 1, 0, 1, None, id="one-holder-over"),
        pytest.param(NAMED_PODS_MAX + 25, NAMED_PODS_MAX + 3, 25, 3, id="both-over"),
    ],
)
def test_the_pods_named_are_capped_but_the_counts_stay_exact(
    holders: int, in_line: int, holders_not_listed: int | None, queue_not_listed: int | None
) -> None:
    (report,) = [
        r
        for r in namespace_report(
            "team-q",
            load_quotas(QUOTAS),
            [held(f"h{i:04d}", "a100", "0.01") for i in range(holders)],
            [],
            [waiting(f"w{i:04d}", "a100", "0.01", i % 60) for i in range(in_line)],
        )
        if r.class_name == "a100"
    ]
    data = report.to_json()
    assert len(data["holders"]) == min(holders, NAMED_PODS_MAX)
    assert len(data["queue"]) == min(in_line, NAMED_PODS_MAX)
    assert data.get("holdersNotListed") == holders_not_listed
    assert data.get("queueNotListed") == queue_not_listed
    assert F(data["inUse"]) == F(holders, 100)
    assert data["waiting"] == in_line
    assert data["holders"][0] == {"pod": "h0000", "gpus": "0.01"}


async def test_the_report_counts_as_the_ledger_judges() -> None:
    """Fed as the GPUQuota publisher feeds it: the watch's pods, the ledger's reservations."""
    snapshot = snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")
    usage = UsageIndex()
    quota = QuotaLedger(usage, MemoryStore(), pods_visible=True)

    def stored(name: str, limits: dict[str, str], *, gated: bool = False) -> dict[str, Any]:
        body = pod(limits)
        body = jsonpatch.apply_patch(body, plan(body, snapshot.policy).patch)
        body["metadata"].update(
            namespace="team-q", name=name, uid=f"uid-{name}", creationTimestamp=f"2026-{name}"
        )
        if gated:
            body = jsonpatch.apply_patch(body, [add_gate(body, "gpuadm.io/quota")])
        usage.observe(body, snapshot.policy, snapshot.quotas, now=0)
        return dict(body)

    stored("01-running", {"gpuadm.io/a100": "1"})
    first = stored("02-first", {"gpuadm.io/a100": "0.5"}, gated=True)
    stored("03-second", {"gpuadm.io/a100": "1"}, gated=True)
    released, _ = await quota.line.release("team-q", snapshot.quotas)
    assert [w.name for w in released] == ["02-first"]

    reports = namespace_report(
        "team-q",
        snapshot.quotas,
        usage.holdings("team-q"),
        quota.book.reserved("team-q").values(),
        usage.waiting("team-q"),
    )
    rows = by_class(reports)
    # 02-first is charged by its reservation until the watch shows its gate gone.
    assert (rows["a100"]["inUse"], rows["a100"]["reserved"]) == ("1", "0.5")
    assert (
        F(rows["a100"]["inUse"]) + F(rows["a100"]["reserved"])
        == quota.book.in_use("team-q")["a100"]
    )
    assert [q["pod"] for q in rows["a100"]["queue"]][-1] == "03-second"

    usage.observe(
        {**first, "spec": {**first["spec"], "schedulingGates": []}},
        snapshot.policy,
        snapshot.quotas,
        now=1,
    )
    rows = by_class(
        namespace_report(
            "team-q",
            snapshot.quotas,
            usage.holdings("team-q"),
            quota.book.reserved("team-q").values(),
            usage.waiting("team-q"),
        )
    )
    assert (rows["a100"]["inUse"], rows["a100"]["reserved"]) == ("1.5", "0")
    assert [q["pod"] for q in rows["a100"]["queue"]] == ["03-second"]
    assert [h["pod"] for h in rows["a100"]["holders"]] == ["01-running", "02-first"]


def test_table_has_a_header_and_a_row_per_class() -> None:
    reports = namespace_report(
        "team-q",
        load_quotas(QUOTAS),
        [held("train", "a100", "1")] + [held(f"h{i:03d}", "h100", "0.001") for i in range(102)],
        [Reservation("a100", F(1, 2), 0.0, "new")],
        [waiting("next", "a100", "1", 0)],
    )
    lines = table(reports).splitlines()
    assert re.split(" {2,}", lines[0]) == [
        "NAMESPACE",
        "CLASS",
        "MODE",
        "LIMIT",
        "IN USE",
        "RESERVED",
        "WAITING",
        "BUDGET",
        "BUDGET USED",
        "PODS",
    ]
    assert len(lines) == 1 + len(reports) == 4
    cells = [line.split(None, 9) for line in lines[1:]]
    assert [c[:9] for c in cells] == [
        ["team-q", "a100", "queue", "2", "1", "0.5", "1", "-", "-"],
        ["team-q", "h100", "queue", "1", "0.102", "0", "0", "-", "-"],
        ["team-q", "*", "queue", "4", "1.102", "0.5", "1", "-", "-"],
    ]
    assert cells[0][9] == "train (1)"
    assert cells[1][9].endswith(", and 2 more")
    # The columns line up.
    assert len({line.index("queue") for line in lines[1:]}) == 1


def test_table_of_a_class_without_limit_or_pods() -> None:
    (report,) = namespace_report(
        "team-x", load_quotas("namespaces: {team-x: {}}\n"), [], [], [waiting("w", "l4", "1", 0)]
    )
    (_, row) = table([report]).splitlines()
    assert row.split() == ["team-x", "l4", "enforce", "none", "0", "0", "1", "-", "-", "-"]


def test_table_without_anything_to_report_says_so() -> None:
    assert table([]) == "No GPU quotas, and no namespace holds or waits for GPUs."


def test_queue_readings_give_each_line_its_length_and_oldest_wait() -> None:
    snapshot = snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")
    usage = UsageIndex()
    for name, limits, created in [
        ("a", {"gpuadm.io/a100": "1"}, "2026-01-01T00:00:00Z"),
        ("b", {"gpuadm.io/a100": "1"}, "2026-01-01T00:01:00Z"),
        ("c", {"gpuadm.io/h100": "1"}, "2026-01-01T00:00:30Z"),
        ("d", {"gpuadm.io/h100": "1"}, "not a time"),
    ]:
        body = pod(limits)
        body = jsonpatch.apply_patch(body, plan(body, snapshot.policy).patch)
        body = jsonpatch.apply_patch(body, [add_gate(body, "gpuadm.io/quota")])
        body["metadata"].update(namespace="team-q", name=name, uid=name, creationTimestamp=created)
        usage.observe(body, snapshot.policy, snapshot.quotas, now=0)
    now = 1767225600.0 + 600  # 2026-01-01T00:10:00Z
    readings = queue_readings(usage, now)
    assert [(r.namespace, r.gpu_class, r.waiting, r.oldest_seconds) for r in readings] == [
        ("team-q", "a100", 2, 600.0),
        ("team-q", "h100", 2, 570.0),
    ]


def test_queue_readings_count_the_gangs_waiting_and_the_oldest_gang_wait() -> None:
    snapshot = snapshot_from_text(POLICY_YAML, QUOTAS, policy_source="p", quotas_source="q")
    usage = UsageIndex()
    for name, gang, created in [
        ("lone", "", "2026-01-01T00:00:00Z"),
        ("g1-a", "g1", "2026-01-01T00:02:00Z"),
        ("g1-b", "g1", "2026-01-01T00:03:00Z"),
        ("g2-a", "g2", "2026-01-01T00:05:00Z"),
    ]:
        body = pod({"gpuadm.io/a100": "1"})
        body = jsonpatch.apply_patch(body, plan(body, snapshot.policy).patch)
        body = jsonpatch.apply_patch(body, [add_gate(body, "gpuadm.io/quota")])
        body["metadata"].update(namespace="team-q", name=name, uid=name, creationTimestamp=created)
        if gang:
            body["metadata"]["annotations"].update(
                {"gpuadm.io/gang": gang, "gpuadm.io/gang-size": "2"}
            )
        usage.observe(body, snapshot.policy, snapshot.quotas, now=0)
    now = 1767225600.0 + 600  # 2026-01-01T00:10:00Z
    (reading,) = queue_readings(usage, now)
    assert (reading.waiting, reading.gangs, reading.oldest_gang_seconds) == (4, 2, 480.0)
    reports = namespace_report(
        "team-q", load_quotas(QUOTAS), [], [], usage.waiting("team-q"), gang_sizes={"gpuadm/g2": 3}
    )
    shown = by_class(reports)["a100"]
    assert shown["gangs"] == [
        {"gang": "gpuadm/g1", "pods": 2, "gpus": "2", "size": 2},
        {"gang": "gpuadm/g2", "pods": 1, "gpus": "1", "size": 3},
    ]
    assert [q.get("gang") for q in shown["queue"]] == [None, "gpuadm/g1", "gpuadm/g1", "gpuadm/g2"]


def test_a_cohort_member_s_report_says_what_it_borrows_and_lends() -> None:
    from policies.loading import load_quotas

    quotas = load_quotas(
        "namespaces:\n"
        "  team-a: {cohort: research, a100: 1}\n"
        "  team-b: {cohort: research, a100: 3, lend: {a100: 2}}\n"
    )
    usage = {"team-a": {"a100": F(3)}, "team-b": {"a100": F(0)}}
    (a,) = namespace_report(
        "team-a",
        quotas,
        [Holding("team-a", "a100", F(1), f"p{i}") for i in range(3)],
        [],
        [],
        cohort_usage=usage,
    )
    shown = a.to_json()
    assert (shown["cohort"], shown["nominal"], shown["borrowed"], shown["lent"]) == (
        "research",
        "1",
        "2",
        "0",
    )
    (b,) = namespace_report("team-b", quotas, [], [], [], cohort_usage=usage)
    shown = b.to_json()
    assert (shown["borrowed"], shown["lent"]) == ("0", "2")
    (alone,) = namespace_report(
        "team-a", load_quotas("namespaces: {team-a: {a100: 1}}"), [], [], []
    )
    assert "cohort" not in alone.to_json()
    assert "borrowed" not in alone.to_json()
