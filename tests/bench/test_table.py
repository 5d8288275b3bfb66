"""The benchmark's burst rows compare like with like: a burst through gpuadm's replicas
against the no-op webhooks behind the same kind of balancer, one replica against one no-op
process called straight."""

from __future__ import annotations

from typing import Any

from bench.table import Row, burst_rows

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
