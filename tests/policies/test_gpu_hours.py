"""GPU-hour budgets, as tables: the budget's text, runs read from pod statuses, counting runs
into buckets exactly once, compaction, the window's usage, when a spent budget frees, the
verdicts and their messages, and the stored record's text."""

from __future__ import annotations

import functools
import itertools
import json
import re
from fractions import Fraction as F
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.quota.budget import (
    DAY,
    HOUR,
    MAX_WINDOW,
    Budget,
    amount_in,
    duration,
    hours,
    parse_budget,
)
from policies.quota.gpu_hours import (
    MAX_BUCKET_WIDTH,
    RECORD_MAX_BYTES,
    Bucket,
    ClassHours,
    Hours,
    RecordError,
    Run,
    Spending,
    Tiers,
    accrue,
    compact,
    decode_hours,
    encode_hours,
    fit,
    judge_budget,
    parse_timestamp,
    record_bytes,
    run_times,
    running_shares,
    spent_message,
    tiers,
    timestamp,
)
from policies.quota.judge import QuotaVerdict
from policies.quota.quotas import Mode

# A moment on a day's edge (and so on an hour's): 2027-01-16T00:00:00Z.
T0 = 20834 * DAY
WIDTH = HOUR


def at(offset: int) -> str:
    """Say T0 + offset as a pod's status does."""
    return timestamp(T0 + offset)


def run(
    started: int,
    ended: int | None = None,
    *,
    share: F = F(1),
    class_name: str = "a100",
) -> Run:
    """A run of team-a, its times given from T0."""
    return Run(
        "team-a", class_name, share, T0 + started, None if ended is None else T0 + ended, "p"
    )


def bucket(offset: int, seconds: int | F, width: int = WIDTH) -> Bucket:
    return Bucket(T0 + offset, width, F(seconds))


def usage(total: int | F, *buckets: Bucket) -> ClassHours:
    return ClassHours(F(total), buckets)


def counted(checkpoint: int, **classes: ClassHours) -> Hours:
    """Hours counted up to T0 + checkpoint (class names with `_` for `-`)."""
    return Hours(T0 + checkpoint, {k.replace("_", "-"): v for k, v in classes.items()})


# --- The budget's text --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "gpu_seconds", "window", "shown"),
    [
        pytest.param("500h/7d", 500 * HOUR, 7 * DAY, "500h/7d", id="spec-example"),
        pytest.param("1.5h/1d", 5400, DAY, "1.5h/1d", id="fractional-hours"),
        pytest.param("0.01h/1d", 36, DAY, "0.01h/1d", id="hundredth-of-an-hour-is-36s"),
        pytest.param("90m/12h", 5400, 12 * HOUR, "90m/12h", id="gpu-minutes"),
        pytest.param("1.25m/1h", 75, HOUR, "1.25m/1h", id="fractional-minutes-whole-seconds"),
        pytest.param("150s/30m", 150, 1800, "150s/30m", id="gpu-seconds"),
        pytest.param("2h/1w", 2 * HOUR, 7 * DAY, "2h/1w", id="window-in-weeks"),
        pytest.param("1h/90s", HOUR, 90, "1h/90s", id="window-in-seconds"),
        pytest.param("1h/1s", HOUR, 1, "1h/1s", id="shortest-window"),
        pytest.param("1h/366d", HOUR, MAX_WINDOW, "1h/366d", id="longest-window"),
        pytest.param("1h/52w", HOUR, 364 * DAY, "1h/52w", id="52-weeks-fit"),
        pytest.param("0h/1d", 0, DAY, "0h/1d", id="zero-amount-forbids"),
        pytest.param(" 500 h / 7 d ", 500 * HOUR, 7 * DAY, "500h/7d", id="spaces-taken-out"),
        pytest.param("007h/01d", 7 * HOUR, DAY, "007h/01d", id="leading-zeros"),
    ],
)
def test_parse_budget_reads(text: str, gpu_seconds: int, window: int, shown: str) -> None:
    budget = parse_budget(text)
    assert budget.gpu_seconds == gpu_seconds
    assert isinstance(budget.gpu_seconds, F)
    assert budget.window == window
    assert str(budget) == shown
    assert budget == Budget(F(gpu_seconds), window)


_NOT_A_BUDGET = "is not a GPU-hour budget: write GPU-hours over a window, e.g. 500h/7d"
_WINDOW = "the window must be from 1s to 366d"
_WHOLE = "the amount must be a whole number of GPU-seconds"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        pytest.param("500/7d", _NOT_A_BUDGET, id="amount-without-unit"),
        pytest.param("500h/7", _NOT_A_BUDGET, id="window-without-unit"),
        pytest.param("500h", _NOT_A_BUDGET, id="no-window"),
        pytest.param("/7d", _NOT_A_BUDGET, id="no-amount"),
        pytest.param("500d/7d", _NOT_A_BUDGET, id="amount-in-days"),
        pytest.param("500H/7D", _NOT_A_BUDGET, id="upper-case-units"),
        pytest.param("-5h/7d", _NOT_A_BUDGET, id="negative-amount"),
        pytest.param("1e3h/7d", _NOT_A_BUDGET, id="exponent"),
        pytest.param("5h/1.5d", _NOT_A_BUDGET, id="fractional-window"),
        pytest.param("5h/7d/2", _NOT_A_BUDGET, id="trailing-text"),
        pytest.param("", _NOT_A_BUDGET, id="empty"),
        pytest.param("5h/0d", _WINDOW, id="zero-window"),
        pytest.param("5h/0s", _WINDOW, id="zero-seconds-window"),
        pytest.param("5h/367d", _WINDOW, id="window-over-366-days"),
        pytest.param("5h/53w", _WINDOW, id="window-of-53-weeks"),
        pytest.param("5h/8785h", _WINDOW, id="window-in-hours-over-366-days"),
        pytest.param("0.0001h/7d", _WHOLE, id="fraction-of-a-gpu-second"),
        pytest.param("1.5s/1d", _WHOLE, id="half-gpu-seconds"),
        pytest.param("0.001m/1d", _WHOLE, id="fraction-of-a-gpu-minute"),
        pytest.param(500, _NOT_A_BUDGET, id="an-int"),
        pytest.param(1.5, _NOT_A_BUDGET, id="a-float"),
        pytest.param(None, _NOT_A_BUDGET, id="none"),
        pytest.param(["500h/7d"], _NOT_A_BUDGET, id="a-list"),
        pytest.param({"a100": "500h/7d"}, _NOT_A_BUDGET, id="a-mapping"),
        pytest.param(b"500h/7d", _NOT_A_BUDGET, id="bytes"),
        pytest.param("500h/7d" + " " * 58, _NOT_A_BUDGET, id="over-64-characters"),
        pytest.param("1" * 61 + "h/7d", _NOT_A_BUDGET, id="over-long-amount"),
    ],
)
def test_parse_budget_refuses_naming_the_value(value: object, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)) as raised:
        parse_budget(value)
    assert str(raised.value).startswith(repr(value))


def test_a_budget_of_64_characters_is_read() -> None:
    text = "500h/7d".rjust(64)
    assert parse_budget(text) == Budget(F(500 * HOUR), 7 * DAY)


@pytest.mark.parametrize(
    ("gpu_seconds", "said"),
    [
        pytest.param(F(0), "0h", id="nothing"),
        pytest.param(F(500 * HOUR), "500h", id="whole-hours"),
        pytest.param(F(100 * HOUR), "100h", id="zeros-before-the-point-stay"),
        pytest.param(F(5400), "1.5h", id="half"),
        pytest.param(F(512 * HOUR + 900), "512.25h", id="quarter"),
        pytest.param(F(1200), "0.33h", id="third-to-the-hundredth"),
        pytest.param(F(2400), "0.67h", id="two-thirds-rounded-up"),
        pytest.param(F(36), "0.01h", id="a-hundredth"),
        pytest.param(F(7, 3) * HOUR, "2.33h", id="fraction-of-seconds"),
    ],
)
def test_hours_says_gpu_hours_to_the_hundredth(gpu_seconds: F, said: str) -> None:
    assert hours(gpu_seconds) == said


@pytest.mark.parametrize(
    ("gpu_seconds", "unit", "said"),
    [
        pytest.param(F(5430), "m", "90.5m", id="minutes-to-the-hundredth"),
        pytest.param(F(20), "m", "0.33m", id="third-of-a-minute"),
        pytest.param(F(6000), "m", "100m", id="whole-minutes"),
        pytest.param(F(150), "s", "150s", id="whole-seconds"),
        pytest.param(F(7, 2), "s", "4s", id="half-a-second-rounds-to-even"),
        pytest.param(F(100), "h", "0.03h", id="hours"),
        pytest.param(F(0), "s", "0s", id="nothing-in-seconds"),
    ],
)
def test_amount_in_a_unit(gpu_seconds: F, unit: str, said: str) -> None:
    assert amount_in(gpu_seconds, unit) == said


@pytest.mark.parametrize(
    ("text", "gpu_seconds", "said"),
    [
        pytest.param("500h/7d", F(1_844_100), "512.25h", id="hours"),
        pytest.param("90m/12h", F(5430), "90.5m", id="minutes"),
        pytest.param("100s/1h", F(250), "250s", id="seconds"),
    ],
)
def test_a_budget_says_amounts_in_the_unit_it_was_written_in(
    text: str, gpu_seconds: F, said: str
) -> None:
    assert parse_budget(text).say(gpu_seconds) == said


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        pytest.param(7 * DAY, "7d", id="a-week-in-days"),
        pytest.param(30 * DAY, "30d", id="thirty-days"),
        pytest.param(DAY, "1d", id="a-day"),
        pytest.param(25 * HOUR, "25h", id="hours-not-a-whole-day"),
        pytest.param(HOUR, "1h", id="an-hour"),
        pytest.param(5400, "90m", id="minutes-not-a-whole-hour"),
        pytest.param(120, "2m", id="two-minutes"),
        pytest.param(90, "90s", id="seconds-not-a-whole-minute"),
        pytest.param(1, "1s", id="a-second"),
        pytest.param(MAX_WINDOW, "366d", id="longest-window"),
    ],
)
def test_duration_says_the_largest_unit_that_divides(seconds: int, said: str) -> None:
    assert duration(seconds) == said


def test_a_budget_built_without_text_says_itself_in_hours_and_window() -> None:
    assert str(Budget(F(5400), DAY)) == "1.5h/1d"
    assert str(Budget(F(500 * HOUR), 7 * DAY)) == "500h/7d"


# --- Timestamps and runs read from pod statuses -------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        pytest.param("1970-01-01T00:00:00Z", 0, id="epoch"),
        pytest.param("2027-01-16T00:00:00Z", T0, id="kubernetes-form"),
        pytest.param("2027-01-16T01:00:00+01:00", T0, id="offset"),
        pytest.param("2027-01-16T00:00:05.900Z", T0 + 5, id="fraction-dropped"),
        pytest.param("2027-01-16T00:00:00", None, id="no-zone"),
        pytest.param("2027-01-16", None, id="a-date"),
        pytest.param("yesterday", None, id="words"),
        pytest.param("", None, id="empty"),
        pytest.param("2027-01-16T00:00:00Z" + " " * 21, None, id="over-40-characters"),
        pytest.param(T0, None, id="a-number"),
        pytest.param(None, None, id="none"),
    ],
)
def test_parse_timestamp(value: object, seconds: int | None) -> None:
    assert parse_timestamp(value) == seconds


def test_timestamp_is_what_parse_timestamp_reads() -> None:
    assert timestamp(T0) == "2027-01-16T00:00:00Z"
    assert timestamp(T0 + DAY + HOUR + 61) == "2027-01-17T01:01:01Z"
    for moment in (0, T0, T0 + 59, T0 + 366 * DAY + 3599):
        assert parse_timestamp(timestamp(moment)) == moment


def statuses(*entries: object, init: list[object] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running", "containerStatuses": list(entries)}
    if init is not None:
        status["initContainerStatuses"] = init
    return {"metadata": {"name": "p"}, "status": status}


def with_conditions(pod: dict[str, Any], *conditions: object) -> dict[str, Any]:
    pod["status"]["conditions"] = list(conditions)
    return pod


def started_at(
    pod_start: int | None, *entries: object, phase: str = "Running", created: int | None = None
) -> dict[str, Any]:
    """A pod whose node took it at T0 + pod_start (None: its status does not say)."""
    pod = statuses(*entries)
    pod["status"]["phase"] = phase
    if pod_start is not None:
        pod["status"]["startTime"] = at(pod_start)
    if created is not None:
        pod["metadata"]["creationTimestamp"] = at(created)
    return pod


def running(started: int) -> dict[str, Any]:
    return {"name": "c", "state": {"running": {"startedAt": at(started)}}}


def terminated(started: int, finished: int) -> dict[str, Any]:
    return {"startedAt": at(started), "finishedAt": at(finished), "exitCode": 0}


@pytest.mark.parametrize(
    ("pod", "ended_phase", "times"),
    [
        pytest.param(statuses(running(10)), False, (10, None), id="running"),
        pytest.param(
            statuses({"state": {"terminated": terminated(10, 70)}}),
            True,
            (10, 70),
            id="terminated-in-an-ended-pod",
        ),
        pytest.param(
            statuses({"state": {"terminated": terminated(10, 70)}}),
            False,
            (10, None),
            id="terminated-but-the-pod-has-not-ended",
        ),
        pytest.param(
            statuses(
                {
                    "state": {"running": {"startedAt": at(100)}},
                    "lastState": {"terminated": terminated(10, 90)},
                }
            ),
            False,
            (10, None),
            id="restarted-counts-from-the-first-start",
        ),
        pytest.param(
            statuses(
                {
                    "state": {"terminated": terminated(100, 200)},
                    "lastState": {"terminated": terminated(10, 90)},
                }
            ),
            True,
            (10, 200),
            id="restarted-then-ended-at-the-last-finish",
        ),
        pytest.param(
            statuses(running(6), init=[{"state": {"terminated": terminated(0, 5)}}]),
            False,
            (0, None),
            id="init-container-starts-the-run",
        ),
        pytest.param(
            statuses(
                {"state": {"terminated": terminated(0, 5)}},
                init=[{"state": {"terminated": terminated(20, 30)}}],
            ),
            True,
            (0, 30),
            id="latest-finish-of-any-container",
        ),
        pytest.param(
            statuses(running(50), running(20), running(80)),
            False,
            (20, None),
            id="earliest-start-of-several-containers",
        ),
        pytest.param(
            statuses(running(20), {"state": {"terminated": terminated(10, 40)}}),
            True,
            (10, 40),
            id="ended-pod-ends-at-the-finish-it-shows",
        ),
        pytest.param(
            statuses(running(10)),
            True,
            (10, 10),
            id="ended-without-a-finish-or-a-condition-ends-at-its-start",
        ),
        pytest.param(
            with_conditions(
                statuses(running(10)),
                {"type": "Ready", "lastTransitionTime": at(70)},
                {"type": "PodScheduled", "lastTransitionTime": at(5)},
                {"type": "Broken", "lastTransitionTime": "later"},
            ),
            True,
            (10, 70),
            id="ended-without-a-finish-ends-at-its-last-condition-change",
        ),
        pytest.param(
            statuses({"state": {"waiting": {"reason": "ContainerCreating"}}}),
            False,
            (None, None),
            id="never-started",
        ),
        pytest.param(statuses(), False, (None, None), id="no-container-statuses"),
        pytest.param({"status": {"phase": "Pending"}}, False, (None, None), id="pending"),
        pytest.param({"metadata": {}}, False, (None, None), id="no-status"),
        pytest.param({"status": "Running"}, False, (None, None), id="status-not-a-mapping"),
        pytest.param(
            {"status": {"containerStatuses": {"c": running(10)}}},
            False,
            (None, None),
            id="statuses-not-a-list",
        ),
        pytest.param(
            statuses(
                5,
                "c",
                None,
                {"state": "running"},
                {"state": {"running": "yes"}},
                {"state": {"running": {"startedAt": T0}}},
                {"state": {"running": {"startedAt": "yesterday"}}},
                {"state": {"running": {"startedAt": "2027-01-16T00:00:00"}}},
                {"lastState": {"terminated": {"startedAt": None, "finishedAt": ["x"]}}},
                running(30),
            ),
            False,
            (30, None),
            id="garbage-ignored",
        ),
        pytest.param(
            statuses(
                {"state": {"terminated": {"startedAt": at(10), "finishedAt": "soon"}}},
                init=[{"state": {"terminated": {"finishedAt": 99}}}],
            ),
            True,
            (10, 10),
            id="garbage-finishes-ignored",
        ),
        pytest.param(
            started_at(
                5,
                {
                    "state": {"running": {"startedAt": at(100)}},
                    "lastState": {"terminated": terminated(50, 90)},
                    "restartCount": 2,
                },
            ),
            False,
            (5, None),
            id="restarted-twice-starts-at-the-pods-start",
        ),
        pytest.param(
            started_at(
                5,
                {
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": terminated(50, 90)},
                    "restartCount": 1,
                },
            ),
            False,
            (5, None),
            id="waiting-after-its-second-run-starts-at-the-pods-start",
        ),
        pytest.param(
            started_at(
                5,
                {
                    "state": {"terminated": terminated(100, 200)},
                    "lastState": {"terminated": terminated(50, 90)},
                    "restartCount": 7,
                },
                phase="Failed",
            ),
            True,
            (5, 200),
            id="ended-after-restarts-still-ends-at-the-last-finish",
        ),
        pytest.param(
            started_at(
                5,
                {
                    "state": {"running": {"startedAt": at(100)}},
                    "lastState": {"terminated": terminated(10, 90)},
                    "restartCount": 1,
                },
            ),
            False,
            (10, None),
            id="restarted-once-shows-its-first-start",
        ),
        pytest.param(
            started_at(5, {"state": {"running": {"startedAt": at(10)}}, "restartCount": 0}),
            False,
            (10, None),
            id="never-restarted-starts-at-its-container",
        ),
        pytest.param(
            started_at(5, {"state": {"waiting": {"reason": "ErrImagePull"}}, "restartCount": 0}),
            False,
            (None, None),
            id="a-started-pod-whose-container-never-ran-ran-for-none",
        ),
        pytest.param(
            started_at(
                None,
                {"state": {"running": {"startedAt": at(100)}}, "restartCount": 3},
                created=2,
            ),
            False,
            (2, None),
            id="without-a-pod-start-its-creation",
        ),
        pytest.param(
            started_at(None, {"state": {"running": {"startedAt": at(100)}}, "restartCount": True}),
            False,
            (100, None),
            id="garbage-restart-count-ignored",
        ),
    ],
)
def test_run_times(
    pod: dict[str, Any], ended_phase: bool, times: tuple[int | None, int | None]
) -> None:
    started, ended = times
    expected = (
        None if started is None else T0 + started,
        None if ended is None else T0 + ended,
    )
    assert run_times(pod, ended_phase=ended_phase) == expected


# --- Counting runs into buckets -----------------------------------------------------------


ACCRUALS = [
    pytest.param(
        counted(0),
        [run(1800)],
        2 * HOUR + 600,
        counted(
            2 * HOUR + 600,
            a100=usage(6000, bucket(0, 1800), bucket(HOUR, 3600), bucket(2 * HOUR, 600)),
        ),
        id="run-across-bucket-edges",
    ),
    pytest.param(
        counted(0),
        [run(0, 1800, share=F(1, 2))],
        HOUR,
        counted(HOUR, a100=usage(900, bucket(0, 900))),
        id="half-share-charged-half",
    ),
    pytest.param(
        counted(0),
        [run(0, 7, share=F(1, 7))],
        HOUR,
        counted(HOUR, a100=usage(1, bucket(0, 1))),
        id="sevenths-add-up-exactly",
    ),
    pytest.param(
        counted(0),
        [run(0, share=F(1, 3))],
        HOUR + 1,
        counted(HOUR + 1, a100=usage(F(3601, 3), bucket(0, 1200), bucket(HOUR, F(1, 3)))),
        id="third-share-across-an-edge",
    ),
    pytest.param(
        counted(HOUR),
        [run(0)],
        HOUR + 600,
        counted(HOUR + 600, a100=usage(600, bucket(HOUR, 600))),
        id="started-before-the-checkpoint-counts-from-it",
    ),
    pytest.param(
        counted(HOUR),
        [run(0, 1800)],
        2 * HOUR,
        counted(2 * HOUR),
        id="ended-before-the-checkpoint-counts-nothing",
    ),
    pytest.param(
        counted(HOUR),
        [run(0, HOUR)],
        2 * HOUR,
        counted(2 * HOUR),
        id="ended-at-the-checkpoint-counts-nothing",
    ),
    pytest.param(
        counted(0),
        [run(0, 2 * HOUR)],
        1800,
        counted(1800, a100=usage(1800, bucket(0, 1800))),
        id="ends-after-now-counts-to-now",
    ),
    pytest.param(
        counted(0),
        [run(2 * HOUR)],
        HOUR,
        counted(HOUR),
        id="starts-after-now-counts-nothing",
    ),
    pytest.param(
        counted(1000, a100=usage(1000, bucket(0, 1000))),
        [run(0)],
        2000,
        counted(2000, a100=usage(2000, bucket(0, 2000))),
        id="adds-to-the-open-bucket",
    ),
    pytest.param(
        counted(0),
        [run(0, 600), run(300, 900, share=F(1, 2)), run(0, 100, class_name="t4")],
        HOUR,
        counted(HOUR, a100=usage(900, bucket(0, 900)), t4=usage(100, bucket(0, 100))),
        id="runs-of-a-class-add-classes-apart",
    ),
    pytest.param(
        counted(HOUR, a100=usage(5000, bucket(0, 3600))),
        [run(HOUR, class_name="t4")],
        HOUR + 10,
        counted(HOUR + 10, a100=usage(5000, bucket(0, 3600)), t4=usage(10, bucket(HOUR, 10))),
        id="other-classes-kept",
    ),
    pytest.param(
        counted(2 * HOUR, a100=usage(100, bucket(0, 100))),
        [run(0)],
        HOUR,
        counted(2 * HOUR, a100=usage(100, bucket(0, 100))),
        id="clock-stepped-back-counts-nothing-keeps-checkpoint",
    ),
    pytest.param(
        counted(HOUR, a100=usage(100, bucket(0, 100))),
        [run(0)],
        HOUR,
        counted(HOUR, a100=usage(100, bucket(0, 100))),
        id="now-at-the-checkpoint-counts-nothing",
    ),
    pytest.param(
        Hours(),
        [run(600)],
        HOUR,
        counted(HOUR, a100=usage(3000, bucket(0, 3000))),
        id="first-count-from-the-pods-own-start",
    ),
    pytest.param(
        Hours(),
        [run(-DAY - 1800, -DAY)],
        0,
        counted(0, a100=usage(1800, bucket(-DAY - HOUR, 1800))),
        id="first-count-of-a-run-that-ended-long-ago",
    ),
]


@pytest.mark.parametrize(("before", "runs", "now", "after"), ACCRUALS)
def test_accrue(before: Hours, runs: list[Run], now: int, after: Hours) -> None:
    assert accrue(before, runs, now=T0 + now, width=WIDTH) == after


@pytest.mark.parametrize(("before", "runs", "now", "after"), ACCRUALS)
def test_accruing_again_to_the_same_moment_or_before_counts_nothing_more(
    before: Hours, runs: list[Run], now: int, after: Hours
) -> None:
    once = accrue(before, runs, now=T0 + now, width=WIDTH)
    assert accrue(once, runs, now=T0 + now, width=WIDTH) == once
    assert accrue(once, runs, now=T0 + now - 1, width=WIDTH) == once


def overlap(run: Run, begin: int, end: int) -> int:
    """How many seconds of [begin, end) the run ran."""
    stop = end if run.ended is None else min(end, run.ended)
    return max(0, stop - max(begin, run.started))


@pytest.mark.parametrize(("before", "runs", "now", "after"), ACCRUALS)
def test_what_accrue_adds_is_each_runs_seconds_since_the_checkpoint(
    before: Hours, runs: list[Run], now: int, after: Hours
) -> None:
    # The total, and the buckets, grow by the seconds each run used since the checkpoint,
    # at its share.
    grown = accrue(before, runs, now=T0 + now, width=WIDTH)
    for class_name in {*grown.classes, *(r.class_name for r in runs)}:
        used = sum(
            (
                r.share * overlap(r, before.checkpoint, T0 + now)
                for r in runs
                if r.class_name == class_name
            ),
            F(0),
        )
        assert grown.total(class_name) - before.total(class_name) == used, class_name
        assert grown.within(class_name, 0) - before.within(class_name, 0) == used, class_name


def test_counting_in_steps_counts_as_much_as_counting_at_once() -> None:
    runs = [
        run(100, share=F(1, 3)),
        run(-HOUR, 2 * HOUR + 7, share=F(2)),
        run(4000, 5000, share=F(1, 7), class_name="t4"),
        run(HOUR, HOUR + 1),
    ]
    end = 3 * HOUR + 17
    at_once = accrue(counted(0), runs, now=T0 + end, width=WIDTH)
    for steps in ([1, end], [600, 3600, 3601, end], [*range(250, end, 250), end]):
        stepped = counted(0)
        for step in steps:
            stepped = accrue(stepped, runs, now=T0 + step, width=WIDTH)
        assert stepped == at_once, steps
    assert at_once.total("a100") == F(end - 100, 3) + 2 * (2 * HOUR + 7) + 1
    assert at_once.total("t4") == F(1000, 7)


@pytest.mark.parametrize(
    ("runs", "now", "shares"),
    [
        pytest.param([run(0), run(10, share=F(1, 2))], 20, {"a100": F(3, 2)}, id="add-up"),
        pytest.param([run(0, 20)], 20, {}, id="ended-at-now-is-not-running"),
        pytest.param([run(0, 21)], 20, {"a100": F(1)}, id="ends-after-now-is-running"),
        pytest.param([run(21)], 20, {}, id="starts-after-now-is-not-running"),
        pytest.param([run(20)], 20, {"a100": F(1)}, id="starts-at-now-is-running"),
        pytest.param(
            [run(0, class_name="t4"), run(0, share=F(1, 4))],
            20,
            {"t4": F(1), "a100": F(1, 4)},
            id="per-class",
        ),
    ],
)
def test_running_shares(runs: list[Run], now: int, shares: dict[str, F]) -> None:
    assert running_shares(runs, now=T0 + now) == shares


# --- Compaction ---------------------------------------------------------------------------


def test_compact_merges_old_buckets_into_days_and_drops_the_oldest() -> None:
    now = 20 * DAY
    before = counted(
        now,
        a100=usage(
            10_000,
            bucket(5 * DAY, 1),  # ended more than keep_for ago: dropped
            bucket(10 * DAY - HOUR, 2),  # ended exactly keep_for ago: dropped
            bucket(10 * DAY, 100),  # the oldest kept
            bucket(12 * DAY, 100),
            bucket(12 * DAY + HOUR, 200),
            bucket(12 * DAY + 5 * HOUR, 300),
            bucket(13 * DAY + 2 * HOUR, 50),
            bucket(14 * DAY, 10, width=DAY),  # merged by an earlier compaction
            bucket(14 * DAY + 3 * HOUR, 5),
            bucket(18 * DAY - HOUR, 7),  # ended exactly fine_for ago: merged
            bucket(18 * DAY, 8),  # ended less than fine_for ago: kept as it is
            bucket(now - HOUR, 70),
        ),
        t4=usage(40, bucket(3 * DAY, 40)),
    )
    two_days = Tiers(WIDTH, fine_for=2 * DAY, hourly_for=2 * DAY, keep_for=10 * DAY)
    after = compact(before, now=T0 + now, tiers=two_days)
    assert after == counted(
        now,
        a100=usage(
            10_000,
            bucket(10 * DAY, 100, width=DAY),
            bucket(12 * DAY, 600, width=DAY),
            bucket(13 * DAY, 50, width=DAY),
            bucket(14 * DAY, 15, width=DAY),
            bucket(17 * DAY, 7, width=DAY),
            bucket(18 * DAY, 8),
            bucket(now - HOUR, 70),
        ),
        t4=usage(40),
    )
    # Compacting again changes nothing, and the totals keep what was dropped.
    assert compact(after, now=T0 + now, tiers=two_days) == after
    assert after.total("a100") == before.total("a100") == 10_000
    assert after.total("t4") == 40


@pytest.mark.parametrize("hour_of_day", [0, 12], ids=lambda h: f"compacted-at-{h:02}h")
@pytest.mark.parametrize(
    "window", [DAY, 7 * DAY, 7 * DAY + HOUR], ids=lambda w: f"window-{duration(w)}"
)
def test_compaction_changes_no_window_of_at_most_fine_for(hour_of_day: int, window: int) -> None:
    # As the leader compacts for a 7d budget: buckets that ended more than the longest
    # window (and a bucket) ago are merged. What any window up to that reads, and so every
    # verdict and the moment a budget frees, must stay as it was: a pod of one GPU that ran
    # all along used `window` GPU-seconds in the last `window`, not more.
    now = T0 + 10 * DAY + hour_of_day * HOUR
    runs = [run(0)]
    before = accrue(counted(0), runs, now=now, width=WIDTH)
    after = compact(before, now=now, tiers=tiers(7 * DAY, WIDTH))
    assert len(after.classes["a100"].buckets) < len(before.classes["a100"].buckets)
    assert before.within("a100", now - window) == window
    assert after.within("a100", now - window) == window
    assert after.total("a100") == before.total("a100") == now - T0


@pytest.mark.parametrize(
    ("longest", "width", "expected"),
    [
        pytest.param(0, HOUR, Tiers(HOUR, HOUR, 8 * DAY + HOUR, 35 * DAY), id="no-budget"),
        pytest.param(
            7 * DAY, HOUR, Tiers(HOUR, 7 * DAY + HOUR, 8 * DAY + HOUR, 35 * DAY), id="7d-hourly"
        ),
        pytest.param(
            30 * DAY, HOUR, Tiers(HOUR, 30 * DAY + HOUR, 30 * DAY + HOUR, 35 * DAY), id="30d"
        ),
        # A thousand hours, 41 days and 16 hours, hour by hour; then day by day.
        pytest.param(
            MAX_WINDOW, HOUR, Tiers(HOUR, 1000 * HOUR, 1000 * HOUR, 367 * DAY), id="366d-hourly"
        ),
        # A thousand minutes, 16 hours and 40 minutes; then hours to 31 days; then days.
        pytest.param(
            MAX_WINDOW, 60, Tiers(60, 60_000, 31 * DAY, 367 * DAY), id="366d-by-the-minute"
        ),
        pytest.param(7 * DAY, 60, Tiers(60, 60_000, 8 * DAY + HOUR, 35 * DAY), id="7d-minutes"),
        pytest.param(30, 10, Tiers(10, 40, 8 * DAY + HOUR, 35 * DAY), id="30s-in-tens"),
    ],
)
def test_tiers_follow_the_namespaces_own_longest_window(
    longest: int, width: int, expected: Tiers
) -> None:
    assert tiers(longest, width) == expected


def test_compact_merges_narrow_buckets_into_hours_then_days() -> None:
    now = 3 * DAY
    minutes = Tiers(60, fine_for=2 * HOUR, hourly_for=DAY, keep_for=2 * DAY + HOUR)
    before = counted(
        now,
        a100=usage(
            1000,
            bucket(DAY - 2 * HOUR, 1, width=60),  # its day ended 2 days ago: merged to it
            bucket(DAY + 60, 2, width=60),  # its day ended a day ago: merged to it
            bucket(DAY + 120, 3, width=60),
            bucket(2 * DAY + HOUR, 4, width=60),  # its hour ended 2 hours ago: to the hour
            bucket(now - 2 * HOUR - 60, 5, width=60),
            bucket(now - 2 * HOUR + 60, 6, width=60),  # its hour ended an hour ago: kept
            bucket(now - 60, 7, width=60),
        ),
    )
    assert compact(before, now=T0 + now, tiers=minutes) == counted(
        now,
        a100=usage(
            1000,
            bucket(DAY, 5, width=DAY),
            bucket(2 * DAY + HOUR, 4),
            bucket(now - 3 * HOUR, 5),
            bucket(now - 2 * HOUR + 60, 6, width=60),
            bucket(now - 60, 7, width=60),
        ),
    )


# A record as the leader writes it for a namespace that ran 16 classes around the clock for
# the year its budgets look back on, in hourly buckets kept as `tiers` keeps them: some 37
# KiB of text a class, more than `RECORD_MAX_BYTES` in all.
YEAR_NOW = T0 + 400 * DAY + 5 * HOUR
CLASSES = [f"class-{n}" for n in range(16)]


@functools.cache
def _a_year_of_one_gpu() -> ClassHours:
    shape = tiers(MAX_WINDOW, HOUR)
    all_along = [Run("team-a", "a100", F(1), YEAR_NOW - MAX_WINDOW - DAY)]
    counted_ = accrue(Hours(), all_along, now=YEAR_NOW, width=HOUR, since=YEAR_NOW - shape.keep_for)
    return compact(counted_, now=YEAR_NOW, tiers=shape).classes["a100"]


def year_of(classes: list[str]) -> Hours:
    """The record of pods of `classes` that ran all along, the n-th of (n + 1) / 7 GPUs."""
    one = _a_year_of_one_gpu()
    return Hours(
        YEAR_NOW,
        {
            name: ClassHours(
                one.total * F(n + 1, 7),
                tuple(Bucket(b.start, b.width, b.seconds * F(n + 1, 7)) for b in one.buckets),
            )
            for n, name in enumerate(classes)
        },
    )


def test_record_bytes_is_the_length_of_the_text() -> None:
    for record_ in (RECORD, Hours(), year_of(CLASSES[:2]), counted(5, t4=usage(F(1, 3)))):
        assert record_bytes(record_) == len(orjson.dumps(encode_hours(record_)))


def test_fit_leaves_a_record_that_fits_as_it_is() -> None:
    small = year_of(CLASSES[:1])
    assert fit(small, max_bytes=RECORD_MAX_BYTES) is small
    assert fit(small, max_bytes=record_bytes(small)) is small


def test_fit_keeps_a_record_within_its_bytes_and_the_recent_windows_as_they_were() -> None:
    before = year_of(CLASSES)
    assert record_bytes(before) > RECORD_MAX_BYTES
    after = fit(before, max_bytes=RECORD_MAX_BYTES)
    assert record_bytes(after) <= RECORD_MAX_BYTES
    assert decode_hours(orjson.loads(orjson.dumps(encode_hours(after)))) == after
    for name in CLASSES:
        assert after.total(name) == before.total(name)
        # The oldest time is merged first: what any window of up to 30 days reads, and
        # what the whole record holds, stays; a window reaching into the merged time
        # counts no less than it did.
        for window in (DAY, 30 * DAY, 2 * MAX_WINDOW):
            assert after.within(name, YEAR_NOW - window) == before.within(name, YEAR_NOW - window)
        for window in (40 * DAY + 7 * HOUR, 200 * DAY + 13 * HOUR, MAX_WINDOW):
            assert after.within(name, YEAR_NOW - window) >= before.within(name, YEAR_NOW - window)


def test_fit_merges_the_merges_that_end_soonest_first() -> None:
    now = 10 * DAY
    before = counted(
        now,
        a100=usage(
            21,
            bucket(4 * DAY, 1, width=DAY),  # merged with the next into [4d, 6d): it ends first
            bucket(5 * DAY, 2, width=DAY),
            bucket(6 * DAY, 3, width=DAY),
            bucket(9 * DAY, 4),
            bucket(9 * DAY + HOUR, 5),
            bucket(now - HOUR, 6),
        ),
    )
    merged_once = counted(
        now,
        a100=usage(
            21,
            bucket(4 * DAY, 3, width=2 * DAY),
            bucket(6 * DAY, 3, width=DAY),
            bucket(9 * DAY, 4),
            bucket(9 * DAY + HOUR, 5),
            bucket(now - HOUR, 6),
        ),
    )
    # It stops as soon as the text takes no more than it may.
    assert fit(before, max_bytes=record_bytes(merged_once)) == merged_once


def test_fit_merges_into_a_bucket_that_ends_at_the_checkpoint() -> None:
    # The checkpoint on a day's edge, and on the edges of 2 and 4 days from the epoch: the
    # day's hours merge into it, and it into those, which end there too; not into 8 days.
    now = 10 * DAY
    before = counted(now, a100=usage(24, *(bucket(9 * DAY + h * HOUR, 1) for h in range(24))))
    assert fit(before, max_bytes=0) == counted(now, a100=usage(24, bucket(6 * DAY, 24, 4 * DAY)))


def test_fit_merges_nothing_past_the_checkpoint_nor_wider_than_it_reads() -> None:
    # Asked for no bytes at all, fit merges all it may: every bucket into the widest that
    # ends by the checkpoint. What comes after the last whole day stays as it was, for the
    # next checkpoint to add to.
    before = year_of(CLASSES[:1])
    after = fit(before, max_bytes=0)
    buckets = after.classes[CLASSES[0]].buckets
    assert len(buckets) < 40
    assert all(b.width <= MAX_BUCKET_WIDTH for b in buckets)
    assert all(a.end <= b.start for a, b in itertools.pairwise(buckets))
    assert [(b.start, b.width) for b in buckets if b.end > YEAR_NOW - 5 * HOUR] == [
        (YEAR_NOW - h * HOUR, HOUR) for h in range(5, 0, -1)
    ]
    assert decode_hours(orjson.loads(orjson.dumps(encode_hours(after)))) == after


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 40 * 24 - 1),
            st.sampled_from([60, HOUR, DAY]),
            st.integers(0, 10**6),
        ),
        max_size=40,
    ),
    st.integers(0, 60 * 60),
    st.integers(0, 2000),
    st.integers(1, 41 * DAY),
)
def test_compact_and_fit_never_count_a_window_less(
    raw: list[tuple[int, int, int]], extra: int, max_bytes: int, window: int
) -> None:
    # Buckets as the leader leaves them: aligned to their width, not overlapping.
    now = T0 + 40 * DAY + extra
    by_start: dict[int, Bucket] = {}
    for hour, width, seconds in raw:
        start = T0 + hour * HOUR
        start -= start % width
        if start + width <= now and not any(
            b.start < start + width and start < b.end for b in by_start.values()
        ):
            by_start[start] = Bucket(start, width, F(seconds))
    before = Hours(
        now, {"a100": ClassHours(F(0), tuple(sorted(by_start.values(), key=lambda b: b.start)))}
    )
    shape = Tiers(60, fine_for=2 * HOUR, hourly_for=3 * DAY, keep_for=50 * DAY)
    compacted = compact(before, now=now, tiers=shape)
    fitted = fit(compacted, max_bytes=max_bytes)
    begin = now - window
    assert compacted.within("a100", begin) >= before.within("a100", begin)
    assert fitted.within("a100", begin) >= compacted.within("a100", begin)
    if window <= shape.fine_for:
        assert compacted.within("a100", begin) == before.within("a100", begin)
    assert fitted.within("a100", 0) == before.within("a100", 0)


def test_counting_into_a_bucket_of_another_width_never_ends_usage_sooner() -> None:
    # Buckets of a minute, then the leader restarted with buckets of an hour: the hour's
    # usage goes into the minute's bucket of the same start, which then spans the hour.
    before = counted(60, a100=usage(60, bucket(0, 60, width=60)))
    after = accrue(before, [run(0)], now=T0 + HOUR, width=HOUR)
    assert after.classes["a100"].buckets == (bucket(0, HOUR),)
    assert after.within("a100", T0 + HOUR - 1) == HOUR


# --- The window's usage, and when a spent budget frees ------------------------------------


def spending(hours_: Hours, rates: dict[str, F] | None = None) -> Spending:
    return Spending(hours_, rates or {})


USED = spending(
    counted(
        3 * HOUR,
        a100=usage(99_999, bucket(0, 100), bucket(HOUR, 200), bucket(2 * HOUR, 300)),
        t4=usage(50, bucket(2 * HOUR, 50)),
    )
)


@pytest.mark.parametrize(
    ("key", "window", "used"),
    [
        pytest.param("a100", 3 * HOUR, 600, id="whole-window"),
        pytest.param("a100", DAY, 600, id="longer-window-has-no-more"),
        pytest.param("a100", HOUR + 1800, 500, id="straddling-bucket-counts-whole"),
        pytest.param("a100", HOUR + 1, 500, id="one-second-into-a-bucket-counts-it"),
        pytest.param("a100", HOUR, 300, id="bucket-ending-where-the-window-begins-left"),
        pytest.param("a100", 1, 300, id="one-second-window"),
        pytest.param("t4", 3 * HOUR, 50, id="other-class"),
        pytest.param("h100", DAY, 0, id="class-never-used"),
        pytest.param("*", 3 * HOUR, 650, id="star-sums-every-class"),
        pytest.param("*", HOUR, 350, id="star-in-a-short-window"),
    ],
)
def test_spending_used(key: str, window: int, used: int) -> None:
    assert USED.used(key, now=T0 + 3 * HOUR, window=window) == used


def test_spending_used_by_now_counts_the_runs_since_the_checkpoint() -> None:
    # The record accrued to now: a run since the checkpoint is in the window, at its share.
    record = counted(HOUR, a100=usage(100, bucket(0, 100)))
    runs = [run(HOUR - 600, share=F(1, 2)), run(0, HOUR + 60, class_name="t4")]
    now = T0 + HOUR + 1800
    spent = Spending(accrue(record, runs, now=now, width=WIDTH), running_shares(runs, now=now))
    assert spent.used("a100", now=now, window=DAY) == 100 + 900
    assert spent.used("t4", now=now, window=DAY) == 60
    assert spent.used("*", now=now, window=DAY) == 1060
    assert spent.rate("a100") == F(1, 2)
    assert spent.rate("t4") == 0
    assert spent.rate("*") == F(1, 2)


TEN_HOURS_A_DAY = parse_budget("10h/1d")
NOW = 10 * HOUR
THREE_BUCKETS = usage(36_000, bucket(0, 20_000), bucket(HOUR, 10_000), bucket(2 * HOUR, 6000))


@pytest.mark.parametrize(
    ("key", "spent", "frees"),
    [
        pytest.param(
            "a100",
            spending(counted(NOW, a100=usage(36_000, bucket(0, 30_000), bucket(HOUR, 6000)))),
            HOUR + DAY,
            id="first-bucket-leaving-frees-enough",
        ),
        pytest.param(
            "a100",
            spending(counted(NOW, a100=usage(36_100, bucket(0, 100), bucket(HOUR, 36_000)))),
            2 * HOUR + DAY,
            id="first-bucket-leaving-is-not-enough",
        ),
        pytest.param(
            "a100",
            spending(counted(NOW, a100=usage(36_000, bucket(HOUR, 6000), bucket(0, 30_000)))),
            HOUR + DAY,
            id="buckets-leave-in-time-order",
        ),
        pytest.param(
            "a100", spending(counted(NOW, a100=THREE_BUCKETS)), HOUR + DAY, id="no-pod-running"
        ),
        pytest.param(
            "a100",
            spending(counted(NOW, a100=THREE_BUCKETS), {"a100": F(1, 2)}),
            2 * HOUR + DAY,
            id="running-pod-keeps-accruing-so-later",
        ),
        pytest.param(
            "a100",
            spending(counted(NOW, a100=THREE_BUCKETS), {"t4": F(8)}),
            HOUR + DAY,
            id="another-class-running-does-not-delay",
        ),
        pytest.param(
            "a100",
            spending(
                counted(NOW, a100=usage(36_000, bucket(0, 30_000), bucket(HOUR, 6000))),
                {"a100": F(1)},
            ),
            None,
            id="running-pods-fill-the-window-again",
        ),
        pytest.param(
            "a100",
            spending(counted(NOW, a100=usage(36_000, bucket(NOW - 1800, 36_000))), {"a100": F(20)}),
            None,
            id="only-the-running-pods-ending-frees-it",
        ),
        pytest.param(
            "*",
            spending(
                counted(
                    NOW,
                    a100=usage(100, bucket(0, 100)),
                    t4=usage(36_000, bucket(HOUR, 36_000)),
                )
            ),
            2 * HOUR + DAY,
            id="star-reads-every-class",
        ),
        pytest.param(
            "*",
            spending(
                counted(NOW, a100=THREE_BUCKETS, t4=usage(1, bucket(5 * HOUR, 1))),
                {"a100": F(1, 4), "t4": F(1, 4)},
            ),
            2 * HOUR + DAY,
            id="star-rate-sums-every-class",
        ),
    ],
)
def test_frees_at(key: str, spent: Spending, frees: int | None) -> None:
    assert spent.used(key, now=T0 + NOW, window=DAY) >= TEN_HOURS_A_DAY.gpu_seconds
    moment = spent.frees_at(key, TEN_HOURS_A_DAY, now=T0 + NOW)
    assert moment == (None if frees is None else T0 + frees)


def window_then(spent: Spending, key: str, moment: int) -> F:
    """What the window ending at `moment` will hold if the pods running now keep running."""
    return spent.used(key, now=moment, window=DAY) + spent.rate(key) * (moment - T0 - NOW)


@pytest.mark.parametrize(
    "rate", [F(0), F(1, 10), F(1, 2), F(3, 4), F(1)], ids=lambda r: f"rate-{r}"
)
def test_frees_at_is_the_first_moment_the_window_holds_less(rate: F) -> None:
    spent = spending(
        counted(
            NOW,
            a100=usage(0, *(bucket(h * HOUR, 4000 - 300 * h) for h in range(10))),
        ),
        {"a100": rate},
    )
    budget = parse_budget("7h/1d")
    assert spent.used("a100", now=T0 + NOW, window=DAY) >= budget.gpu_seconds
    moment = spent.frees_at("a100", budget, now=T0 + NOW)
    moments = range(T0 + NOW, T0 + NOW + 2 * DAY, 60)
    first = next((m for m in moments if window_then(spent, "a100", m) < budget.gpu_seconds), None)
    assert moment == first


def test_a_budget_spent_by_pods_that_ended_since_the_checkpoint_frees_without_them() -> None:
    # A pod of 10 GPUs ran an hour since the last checkpoint and has ended: nothing runs
    # now, and the budget frees as that hour leaves the window.
    record = counted(0)
    runs = [run(0, HOUR, share=F(10))]
    now = T0 + 2 * HOUR
    spent = Spending(accrue(record, runs, now=now, width=WIDTH), running_shares(runs, now=now))
    assert spent.used("a100", now=now, window=DAY) == 36_000
    assert spent.frees_at("a100", TEN_HOURS_A_DAY, now=now) == T0 + HOUR + DAY


# --- Verdicts -----------------------------------------------------------------------------


SPENT = spending(counted(2 * HOUR, a100=usage(36_000, bucket(0, 36_000))))
SPENT_MESSAGE = (
    'namespace "team-a": a100 GPU-hour budget spent: used 10h of 10h in the last 1d; '
    "enough frees at 2027-01-17T01:00:00Z; running pods are not stopped"
)
STAR_SPENT_MESSAGE = (
    'namespace "team-a": all classes ("*") GPU-hour budget spent: used 10h of 10h in the '
    "last 1d; enough frees at 2027-01-17T01:00:00Z; running pods are not stopped"
)
WARNED = " (quota mode is warn: admitted, but enforce would deny)"


@pytest.mark.parametrize(
    ("class_name", "budgets", "spent", "mode", "verdict"),
    [
        pytest.param(
            "a100",
            {"a100": TEN_HOURS_A_DAY},
            SPENT,
            "enforce",
            QuotaVerdict(False, SPENT_MESSAGE, exceeded=("a100",)),
            id="enforce-refuses-a-spent-class",
        ),
        pytest.param(
            "a100",
            {"a100": TEN_HOURS_A_DAY},
            SPENT,
            "queue",
            QuotaVerdict(False, SPENT_MESSAGE, exceeded=("a100",)),
            id="queue-judges-as-enforce",
        ),
        pytest.param(
            "a100",
            {"a100": TEN_HOURS_A_DAY},
            SPENT,
            "warn",
            QuotaVerdict(
                True,
                SPENT_MESSAGE,
                (SPENT_MESSAGE + WARNED,),
                would_deny=True,
                exceeded=("a100",),
            ),
            id="warn-admits-saying-enforce-would-deny",
        ),
        pytest.param(
            "a100",
            {"a100": TEN_HOURS_A_DAY},
            spending(counted(2 * HOUR, a100=usage(36_000, bucket(HOUR, 36_000))), {"a100": F(10)}),
            "enforce",
            QuotaVerdict(
                False,
                'namespace "team-a": a100 GPU-hour budget spent: used 10h of 10h in the '
                "last 1d; it frees only as the class's running pods end; "
                "running pods are not stopped",
                exceeded=("a100",),
            ),
            id="spent-by-pods-still-running",
        ),
        pytest.param(
            "a100",
            {"a100": parse_budget("100s/1h")},
            spending(counted(2 * HOUR, a100=usage(250, bucket(HOUR, 250)))),
            "enforce",
            QuotaVerdict(
                False,
                'namespace "team-a": a100 GPU-hour budget spent: used 250s of 100s in the '
                "last 1h; enough frees at 2027-01-16T03:00:00Z; running pods are not stopped",
                exceeded=("a100",),
            ),
            id="said-in-the-budgets-own-unit",
        ),
        pytest.param(
            "a100",
            {"a100": TEN_HOURS_A_DAY},
            spending(counted(2 * HOUR, a100=usage(30_000, bucket(0, 30_000)))),
            "enforce",
            QuotaVerdict(True, None),
            id="under-the-budget-admits",
        ),
        pytest.param(
            "a100",
            {"a100": TEN_HOURS_A_DAY},
            spending(counted(2 * HOUR, a100=usage(33_000, bucket(0, 33_000)))),
            "enforce",
            QuotaVerdict(
                True,
                None,
                (
                    'namespace "team-a": a100 GPU-hour budget is 91% used '
                    "(9.17h of 10h/1d in the last 1d)",
                ),
            ),
            id="above-90-percent-warns",
        ),
        pytest.param(
            "a100",
            {"a100": parse_budget("600m/1d")},
            spending(counted(2 * HOUR, a100=usage(33_000, bucket(0, 33_000)))),
            "warn",
            QuotaVerdict(
                True,
                None,
                (
                    'namespace "team-a": a100 GPU-hour budget is 91% used '
                    "(550m of 600m/1d in the last 1d)",
                ),
            ),
            id="above-90-percent-in-minutes",
        ),
        pytest.param(
            "a100",
            {"a100": TEN_HOURS_A_DAY},
            spending(counted(2 * HOUR, a100=usage(32_400, bucket(0, 32_400)))),
            "enforce",
            QuotaVerdict(True, None),
            id="exactly-90-percent-is-quiet",
        ),
        pytest.param(
            "a100",
            {"a100": TEN_HOURS_A_DAY},
            spending(counted(2 * HOUR, a100=usage(35_999, bucket(0, 35_999)))),
            "enforce",
            QuotaVerdict(
                True,
                None,
                (
                    'namespace "team-a": a100 GPU-hour budget is 99% used '
                    "(10h of 10h/1d in the last 1d)",
                ),
            ),
            id="a-gpu-second-short-admits",
        ),
        pytest.param(
            "a100",
            {"a100": TEN_HOURS_A_DAY},
            spending(counted(DAY + HOUR, a100=usage(36_000, bucket(0, 36_000)))),
            "enforce",
            QuotaVerdict(True, None),
            id="usage-that-left-the-window-is-free",
        ),
        pytest.param(
            "a100",
            {"*": TEN_HOURS_A_DAY},
            spending(counted(2 * HOUR, t4=usage(36_000, bucket(0, 36_000)))),
            "enforce",
            QuotaVerdict(False, STAR_SPENT_MESSAGE, exceeded=("*",)),
            id="star-budget-spent-by-another-class",
        ),
        pytest.param(
            "a100",
            {"a100": parse_budget("100h/1d"), "*": TEN_HOURS_A_DAY},
            spending(
                counted(
                    2 * HOUR,
                    a100=usage(20_000, bucket(0, 20_000)),
                    t4=usage(16_000, bucket(HOUR, 16_000)),
                )
            ),
            "enforce",
            QuotaVerdict(False, STAR_SPENT_MESSAGE, exceeded=("*",)),
            id="class-budget-left-but-star-spent",
        ),
        pytest.param(
            "a100",
            {"a100": TEN_HOURS_A_DAY, "*": parse_budget("100h/1d")},
            spending(counted(2 * HOUR, a100=usage(33_000, bucket(0, 33_000)))),
            "enforce",
            QuotaVerdict(
                True,
                None,
                (
                    'namespace "team-a": a100 GPU-hour budget is 91% used '
                    "(9.17h of 10h/1d in the last 1d)",
                ),
            ),
            id="class-warns-star-quiet",
        ),
        pytest.param(
            "a100",
            {"a100": TEN_HOURS_A_DAY, "*": parse_budget("10h/1d")},
            spending(
                counted(
                    2 * HOUR,
                    a100=usage(33_000, bucket(0, 33_000)),
                    t4=usage(660, bucket(0, 660)),
                )
            ),
            "enforce",
            QuotaVerdict(
                True,
                None,
                (
                    'namespace "team-a": a100 GPU-hour budget is 91% used '
                    "(9.17h of 10h/1d in the last 1d)",
                    'namespace "team-a": all classes ("*") GPU-hour budget is 93% used '
                    "(9.35h of 10h/1d in the last 1d)",
                ),
            ),
            id="class-and-star-both-warn",
        ),
        pytest.param(
            "a100",
            {"t4": TEN_HOURS_A_DAY},
            SPENT,
            "enforce",
            None,
            id="class-without-a-budget-is-not-judged",
        ),
        pytest.param("a100", {}, SPENT, "enforce", None, id="no-budgets"),
    ],
)
def test_judge_budget(
    class_name: str,
    budgets: dict[str, Budget],
    spent: Spending,
    mode: Mode,
    verdict: QuotaVerdict | None,
) -> None:
    judged = judge_budget(
        namespace="team-a",
        class_name=class_name,
        budgets=budgets,
        spending=spent,
        now=spent.hours.checkpoint,
        mode=mode,
    )
    assert judged == verdict


def test_spent_message_names_the_numbers_and_the_moment() -> None:
    budget = parse_budget("1.5h/2h")
    spent = spending(counted(HOUR, a100=usage(5400, bucket(0, 5400))))
    assert spent_message("team-b", "a100", F(5400), budget, spent, "a100", T0 + HOUR) == (
        'namespace "team-b": a100 GPU-hour budget spent: used 1.5h of 1.5h in the last 2h; '
        "enough frees at 2027-01-16T03:00:00Z; running pods are not stopped"
    )


def test_a_zero_budget_refuses_and_never_says_running_pods_free_it() -> None:
    # `a100: 0h/1d` forbids the class. Nothing of it runs, so nothing that ends can free it.
    budget = parse_budget("0h/1d")
    judged = judge_budget(
        namespace="team-a",
        class_name="a100",
        budgets={"a100": budget},
        spending=spending(counted(HOUR)),
        now=T0 + HOUR,
    )
    assert judged is not None
    assert not judged.allowed
    assert judged.exceeded == ("a100",)
    assert judged.message is not None
    assert "running pods end" not in judged.message, judged.message


# --- The record's text --------------------------------------------------------------------


RECORD = counted(
    2 * HOUR,
    a100=usage(F(7, 3), bucket(0, F(4, 3)), bucket(HOUR, 1)),
    t4=usage(F(10**30, 7), bucket(0, 0, width=DAY)),
    a100_mig=usage(0),
)


def test_a_record_is_written_as_exact_fractions() -> None:
    assert encode_hours(RECORD) == {
        "checkpoint": T0 + 2 * HOUR,
        "classes": {
            "a100": {"total": "7/3", "buckets": [[T0, HOUR, "4/3"], [T0 + HOUR, HOUR, "1"]]},
            "a100-mig": {"total": "0", "buckets": []},
            "t4": {"total": f"{10**30}/7", "buckets": [[T0, DAY, "0"]]},
        },
    }


@pytest.mark.parametrize(
    "hours_", [pytest.param(RECORD, id="fractions"), pytest.param(Hours(), id="empty")]
)
def test_a_record_reads_back_as_written(hours_: Hours) -> None:
    assert decode_hours(json.loads(json.dumps(encode_hours(hours_)))) == hours_


def record(**changes: object) -> dict[str, Any]:
    """A good record's data with some keys changed (None: taken out)."""
    data: dict[str, Any] = {
        "checkpoint": T0,
        "classes": {"a100": {"total": "5", "buckets": [[T0, HOUR, "5"]]}},
    }
    for key, value in changes.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    return data


def a100(total: object = "5", buckets: object = None) -> dict[str, Any]:
    return {"classes": {"a100": {"total": total, "buckets": buckets or [[T0, HOUR, "5"]]}}}


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        pytest.param([], "the record is not an object", id="a-list"),
        pytest.param("{}", "the record is not an object", id="text"),
        pytest.param(None, "the record is not an object", id="none"),
        pytest.param(record(checkpoint=None), "checkpoint None is not a time", id="no-checkpoint"),
        pytest.param(
            record(checkpoint=True), "checkpoint True is not a time", id="bool-checkpoint"
        ),
        pytest.param(
            record(checkpoint=-1), "checkpoint -1 is not a time", id="negative-checkpoint"
        ),
        pytest.param(record(checkpoint=1.5), "checkpoint 1.5 is not a time", id="float-checkpoint"),
        pytest.param(
            record(checkpoint="10"), "checkpoint '10' is not a time", id="text-checkpoint"
        ),
        pytest.param(record(classes=None), "classes is not an object", id="no-classes"),
        pytest.param(record(classes=[]), "classes is not an object", id="classes-a-list"),
        pytest.param(
            record(classes={"a100": []}), "class 'a100' has no list of buckets", id="class-a-list"
        ),
        pytest.param(
            record(classes={"a100": {"total": "1"}}),
            "class 'a100' has no list of buckets",
            id="no-buckets",
        ),
        pytest.param(
            record(**a100(buckets={"start": T0})),
            "class 'a100' has no list of buckets",
            id="buckets-a-mapping",
        ),
        pytest.param(
            record(**a100(total=None)), "class 'a100': None is not an amount", id="no-total"
        ),
        pytest.param(record(**a100(total=5)), "class 'a100': 5 is not an amount", id="int-total"),
        pytest.param(
            record(**a100(total="-7/3")), "class 'a100': '-7/3' is negative", id="negative-total"
        ),
        pytest.param(record(**a100(total="abc")), "'abc' is not an amount", id="words-total"),
        pytest.param(record(**a100(total="1/0")), "'1/0' is not an amount", id="divide-by-zero"),
        pytest.param(record(**a100(total="1" * 65)), "is not an amount", id="over-long-total"),
        pytest.param(
            record(**a100(buckets=[[T0, HOUR]])), "is not [start, width, seconds]", id="two-items"
        ),
        pytest.param(
            record(**a100(buckets=[[T0, HOUR, "1", "1"]])),
            "is not [start, width, seconds]",
            id="four-items",
        ),
        pytest.param(
            record(**a100(buckets=["x"])),
            "bucket 'x' is not [start, width, seconds]",
            id="text-bucket",
        ),
        pytest.param(
            record(**a100(buckets=[{"start": T0, "width": HOUR, "seconds": "1"}])),
            "is not [start, width, seconds]",
            id="mapping-bucket",
        ),
        pytest.param(
            record(**a100(buckets=[[str(T0), HOUR, "1"]])),
            "is not [start, width, seconds]",
            id="text-start",
        ),
        pytest.param(
            record(**a100(buckets=[[True, HOUR, "1"]])),
            "is not [start, width, seconds]",
            id="bool-start",
        ),
        pytest.param(
            record(**a100(buckets=[[T0, True, "1"]])),
            "is not [start, width, seconds]",
            id="bool-width",
        ),
        pytest.param(
            record(**a100(buckets=[[T0, 0, "1"]])),
            "is not [start, width, seconds]",
            id="zero-width",
        ),
        pytest.param(
            record(**a100(buckets=[[T0, -HOUR, "1"]])),
            "is not [start, width, seconds]",
            id="negative-width",
        ),
        pytest.param(
            record(**a100(buckets=[[T0, 1.5, "1"]])),
            "is not [start, width, seconds]",
            id="float-width",
        ),
        pytest.param(
            record(**a100(buckets=[[T0, HOUR, 5]])),
            "class 'a100': 5 is not an amount",
            id="int-seconds",
        ),
        pytest.param(
            record(**a100(buckets=[[T0, HOUR, "-1"]])), "'-1' is negative", id="negative-seconds"
        ),
        pytest.param(
            record(**a100(buckets=[[T0, HOUR, "5"], [T0, HOUR, None]])),
            "None is not an amount",
            id="second-bucket-bad",
        ),
    ],
)
def test_decode_refuses_a_malformed_record_saying_what(data: object, problem: str) -> None:
    with pytest.raises(RecordError, match=re.escape(problem)):
        decode_hours(data)


def test_the_good_record_the_refusals_start_from_reads() -> None:
    assert decode_hours(record()) == counted(0, a100=usage(5, bucket(0, 5)))


@pytest.mark.parametrize("amount", ["1e999999999", "1E9", "1.5", " 7", "0x10", "1/0"])
def test_only_what_the_encoder_writes_is_read_as_an_amount(amount: str) -> None:
    # `Fraction("1e999999999")` computes a number of a billion digits: a reader that let it
    # through would hang on one hand-edited record. encode_hours writes `n` or `n/d` only.
    bad = {"checkpoint": 0, "classes": {"a100": {"total": amount, "buckets": []}}}
    with pytest.raises(RecordError, match="is not an amount of GPU-seconds"):
        decode_hours(bad)


def test_a_budget_of_zero_says_it_allows_none() -> None:
    spending = Spending(Hours(), {})
    verdict = judge_budget(
        namespace="team-a",
        class_name="a100",
        budgets={"a100": parse_budget("0h/1d")},
        spending=spending,
        now=DAY,
    )
    assert verdict is not None
    assert verdict.message == (
        'namespace "team-a": a100 GPU-hour budget spent: used 0h of 0h in the last 1d; '
        "a budget of 0 allows none; running pods are not stopped"
    )


def test_a_run_that_says_it_started_long_ago_fills_no_more_than_since_allows() -> None:
    ancient = Run("team-a", "a100", F(1), 0)
    counted = accrue(Hours(), [ancient], now=100 * DAY, width=HOUR, since=99 * DAY)
    assert counted.total("a100") == DAY
    assert len(counted.classes["a100"].buckets) == 24


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"checkpoint": 10**12, "classes": {}}, id="checkpoint-past-the-year-5138"),
        pytest.param(
            {"checkpoint": 0, "classes": {"a100": {"total": "1", "buckets": [[10**12, 60, "1"]]}}},
            id="bucket-past-the-year-5138",
        ),
        pytest.param(
            {"checkpoint": 0, "classes": {"a100": {"total": "1", "buckets": [[0, 10**9, "1"]]}}},
            id="bucket-wider-than-512-days",
        ),
        pytest.param(
            {
                "checkpoint": 0,
                "classes": {"a100": {"total": "1", "buckets": [[0, MAX_BUCKET_WIDTH + 1, "1"]]}},
            },
            id="bucket-a-second-wider-than-512-days",
        ),
    ],
)
def test_a_record_naming_moments_no_date_can_say_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(RecordError):
        decode_hours(bad)


# A record as the version before this one wrote it: hourly buckets, and older ones merged
# into days.
PREVIOUS_VERSION = (
    '{"checkpoint":1800064800,"classes":{"a100":{"total":"10801/3","buckets":'
    '[[1799971200,86400,"3600"],[1800057600,3600,"3600"],[1800061200,3600,"1/3"]]}}}'
)


def test_a_record_the_previous_version_wrote_reads() -> None:
    assert decode_hours(json.loads(PREVIOUS_VERSION)) == counted(
        2 * HOUR,
        a100=usage(
            F(10801, 3), bucket(-DAY, 3600, width=DAY), bucket(0, 3600), bucket(HOUR, F(1, 3))
        ),
    )


@pytest.mark.parametrize("width", [1, 60, HOUR, DAY, 2 * DAY, 64 * DAY, MAX_BUCKET_WIDTH])
def test_a_bucket_of_any_width_fit_merges_to_reads(width: int) -> None:
    data = {"checkpoint": T0, "classes": {"a100": {"total": "1", "buckets": [[T0, width, "1"]]}}}
    assert decode_hours(data) == counted(0, a100=usage(1, bucket(0, 1, width=width)))
