"""The benchmark's burst rows compare like with like: a burst through gpuadm's replicas
against the no-op webhooks behind the same kind of balancer, one replica against one no-op
process called straight."""

from __future__ import annotations

from typing import Any

import pytest

from bench.table import Row, burst_rows, queue_rows

SIZE, FIT = 200, 150


def _runs(seconds: float, admitted: int = FIT) -> list[dict[str, Any]]:
    return [{"seconds": seconds, "admitted": admitted, "stored": admitted}]


def _rows(bursts: dict[str, list[dict[str, Any]]]) -> dict[str, Row]:
    found = burst_rows({"bursts": bursts, "burst_size": SIZE, "burst_fit": FIT})
    return {row.figure: row for row in found}


def test_three_replicas_are_held_to_the_balanced_no_op_and_one_to_the_straight_one() -> None:
    rows = _rows(
        {
            "native": _runs(1.0),
            "noop": _runs(2.0),
            "noop-3": _runs(2.5),
            "gpuadm-1": _runs(2.2),
            "gpuadm-3": _runs(3.0),
        }
    )
    one = rows[f"burst of {SIZE}, gpuadm x1 vs two no-op webhooks (s)"]
    assert (one.value, one.anchor, one.met) == (2.2, 2.0, True)  # 1.10 <= 1.15
    three = rows[f"burst of {SIZE}, gpuadm x3 vs two no-op webhooks (s)"]
    assert (three.value, three.anchor, three.met) == (3.0, 2.5, True)  # 1.20 <= 1.25
    balanced = rows[f"burst of {SIZE}, no-op x3 balanced vs x1 straight (s)"]
    assert (balanced.value, balanced.anchor, balanced.met) == (2.5, 2.0, None)
    assert rows[f"burst admitted, noop-3 (pods of {FIT} that fit)"].met is True


def test_a_burst_just_past_its_ratio_misses() -> None:
    rows = _rows(
        {
            "native": _runs(1.0),
            "noop": _runs(2.0),
            "noop-3": _runs(2.0),
            "gpuadm-1": _runs(2.31),
            "gpuadm-3": _runs(2.51),
        }
    )
    assert rows[f"burst of {SIZE}, gpuadm x1 vs two no-op webhooks (s)"].met is False
    assert rows[f"burst of {SIZE}, gpuadm x3 vs two no-op webhooks (s)"].met is False


def test_results_from_before_the_balanced_no_op_say_their_anchor_was_unbalanced() -> None:
    rows = _rows({"native": _runs(1.0), "noop": _runs(2.0), "gpuadm-3": _runs(3.0)})
    three = rows[f"burst of {SIZE}, gpuadm x3 vs two no-op webhooks, unbalanced (s)"]
    assert (three.anchor, three.met) == (2.0, False)


def _queue(**extra: Any) -> dict[str, Any]:
    return {
        "long_line": 20_000,
        "fresh_line": 2_000,
        "gated_admission_ms": {"0": 0.2, "long": 0.3},
        "beside_p50_ms": {"0": 0.2, "long": 0.2},
        "beside_p99_ms": {"0": 0.4, "long": 1.0},
        "release_ms": {"0": 5.0, "fresh": 5.5},
        **extra,
    }


@pytest.mark.parametrize(
    ("gang_ms", "met"),
    [pytest.param(400.0, True, id="at-the-ratio"), pytest.param(401.0, False, id="just-past")],
)
def test_a_gang_of_64_is_held_to_64_lone_pods(gang_ms: float, met: bool) -> None:
    queue = _queue(gang_size=64, release_all_ms={"pods": 320.0, "gang": gang_ms})
    (row,) = [r for r in queue_rows(queue) if "gang" in r.figure]
    assert row.figure == "queue: release a gang of 64 vs 64 lone pods (ms)"
    assert (row.value, row.anchor, row.met) == (gang_ms, 320.0, met)


def test_results_from_before_gangs_have_no_gang_row() -> None:
    assert not [r for r in queue_rows(_queue()) if "gang" in r.figure]
