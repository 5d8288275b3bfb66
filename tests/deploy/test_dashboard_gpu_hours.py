"""The dashboard's GPU-hours row, and a layout in which no panel covers another."""

from __future__ import annotations

from typing import Any

from tests.deploy.test_monitoring import (
    dashboard_panels,
    exported_metrics,
    load_dashboard,
    metric_names,
)

HOURS_METRICS = {
    "gpuadm_gpu_seconds": {"gpuadm_gpu_seconds_total"},
    "gpuadm_gpu_budget_used_seconds": {"gpuadm_gpu_budget_used_seconds"},
    "gpuadm_gpu_budget_seconds": {"gpuadm_gpu_budget_seconds"},
}


def cells(panel: dict[str, Any]) -> set[tuple[int, int]]:
    grid = panel["gridPos"]
    return {
        (x, y)
        for x in range(grid["x"], grid["x"] + grid["w"])
        for y in range(grid["y"], grid["y"] + grid["h"])
    }


def test_no_panel_covers_another() -> None:
    dashboard = load_dashboard()
    taken: dict[tuple[int, int], str] = {}
    overlaps = []
    for panel in dashboard["panels"]:
        for cell in cells(panel):
            if cell in taken:
                overlaps.append((taken[cell], panel["title"]))
            taken[cell] = panel["title"]
    assert sorted(set(overlaps)) == []


def test_the_gpu_hour_metrics_are_exported_as_queried() -> None:
    families = exported_metrics()
    assert {name: families[name] for name in HOURS_METRICS} == HOURS_METRICS


def test_the_gpu_hours_row() -> None:
    dashboard = load_dashboard()
    titles = [p["title"] for p in dashboard["panels"]]
    row = titles.index("GPU-hours")
    assert dashboard["panels"][row]["type"] == "row"
    # After the queue, before the config: the tenants' side of the dashboard stays together.
    assert titles.index("Queue") < row < titles.index("Config and certificates")
    panels = {p["title"]: p for p in dashboard_panels(dashboard)}
    hours = panels["GPU-hours per namespace and class"]
    budget = panels["GPU-hour budget used"]
    assert titles[row + 1 : row + 3] == [hours["title"], budget["title"]]
    assert hours["type"] == "timeseries"
    assert budget["fieldConfig"]["defaults"]["unit"] == "percentunit"
    (hours_target,) = hours["targets"]
    (budget_target,) = budget["targets"]
    hours_expr, budget_expr = hours_target["expr"], budget_target["expr"]
    assert metric_names(hours_expr) == {"gpuadm_gpu_seconds_total"}
    assert "increase(gpuadm_gpu_seconds_total{" in hours_expr
    assert hours_expr.endswith("[1h])) / 3600")
    assert metric_names(budget_expr) == {
        "gpuadm_gpu_budget_used_seconds",
        "gpuadm_gpu_budget_seconds",
    }
    # Every replica exports the same count: the panels take it once, per namespace and class.
    for expr in (hours_expr, budget_expr):
        assert "max by (namespace, gpu_class)" in expr
        assert "sum" not in expr
        assert 'namespace=~"$namespace", gpu_class=~"$gpu_class"' in expr
