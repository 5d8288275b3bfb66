"""Run every benchmark, print one table, and write the figures to bench/results/.

`python -m bench [--quick] [--skip-apiserver]`. Every figure is compared with an anchor
measured in this same run (bench.table says which), so only ratios and differences carry
from one machine, or one moment, to another.

`python -m bench --scale` runs bench.scale instead, and nothing else: the quota with 100,000
pods stored in a real apiserver. It takes minutes, so `make bench` leaves it out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import cpus, table
from bench.endpoints import endpoint_figures
from bench.flood import flood_figures
from bench.queue import queue_figures
from bench.quota import quota_figures
from bench.startup import startup_figures
from bench.vegeta import ensure_vegeta

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Lengths:
    """How long each part runs: the quick mode trades steadiness for time."""

    seconds: float
    """Of each vegeta attack."""
    rounds: int
    """Of each HTTP comparison, and bursts of each kind; a figure is their median."""
    creates: int
    """Sequential pod creates of each kind."""
    judgements: int
    """Quota judgements timed at each size."""
    churn_seconds: float
    """Of pods churning under quota; past 100 s the record is at its steady size."""


QUICK = Lengths(seconds=3, rounds=1, creates=30, judgements=1000, churn_seconds=60)
FULL = Lengths(seconds=5, rounds=3, creates=200, judgements=3000, churn_seconds=140)


def main() -> int:
    """Measure, write the results, print the table. Missed targets are figures, not failures."""
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="shorter runs, noisier figures")
    parser.add_argument(
        "--skip-apiserver",
        action="store_true",
        help="skip the pod creates through a real kube-apiserver",
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help="instead, only the quota with 1,000 namespaces and 100,000 pods (bench.scale; "
        "minutes)",
    )
    args = parser.parse_args()
    if args.scale:
        from bench import scale

        return scale.main([])
    lengths = QUICK if args.quick else FULL
    started = time.monotonic()
    stolen_before = cpus.stolen_seconds()
    # First, so that a machine without Go fails now rather than after minutes of measuring.
    vegeta = ensure_vegeta()
    results: dict[str, Any] = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
        "mode": "quick" if args.quick else "full",
        "lengths": asdict(lengths),
        "pinning": cpus.describe(),
        "quota": quota_figures(lengths.judgements),
        "queue": queue_figures(lengths.rounds, lengths.seconds),
        "startup": startup_figures(runs=10 * lengths.rounds),
    }
    if not args.skip_apiserver:
        # Imported here: the Kubernetes client and the end-to-end helpers load only if used.
        from bench.apiserver import measure

        results["apiserver"] = measure(
            count=lengths.creates, rounds=lengths.rounds, churn_seconds=lengths.churn_seconds
        )
    with tempfile.TemporaryDirectory() as workdir:
        results["endpoints"] = endpoint_figures(
            vegeta, Path(workdir), seconds=lengths.seconds, rounds=lengths.rounds
        )
        results["flood"] = flood_figures(vegeta, Path(workdir), seconds=lengths.seconds)
    results["seconds"] = time.monotonic() - started
    stolen_after = cpus.stolen_seconds()
    if stolen_before is not None and stolen_after is not None:
        results["stolen_seconds"] = stolen_after - stolen_before
    found = table.rows(results)
    results["targets"] = [row.as_dict() for row in found]
    write(results)
    print(header(results))
    print(table.render(found))
    print(f"\nfigures written to {RESULTS / 'latest.json'}")
    return 0


def header(results: dict[str, Any]) -> str:
    """Say when, where and how the figures were taken."""
    endpoints = results["endpoints"]
    return (
        f"\ngpuadm benchmark, {results['time']}, {results['mode']} mode, "
        f"{results['seconds']:.0f} s ({results['machine']})\n"
        f"HTTP: vegeta over TLS keep-alive, {endpoints['connections']} connections, "
        f"{endpoints['review_bytes']}-byte reviews of every backend, {endpoints['seconds']:g} s "
        f"x {endpoints['rounds']} round(s) per figure; {results['pinning']}\n"
        f"{_balancer(results)}{_stolen(results)}"
    )


def _balancer(results: dict[str, Any]) -> str:
    """Say what spread the bursts over several replicas (`bench.kernel`, `bench.relay`)."""
    balancer = results.get("apiserver", {}).get("balancer")
    if balancer is None:
        return ""
    how = "NAT rules in the kernel, as a Service" if balancer == "kernel" else "a relay process"
    return f"Bursts through several replicas: balanced by {how}\n"


def _stolen(results: dict[str, Any]) -> str:
    """Say how much CPU time the host took away during the run, when it can be read."""
    stolen = results.get("stolen_seconds")
    if stolen is None:
        return ""
    share = stolen / (results["seconds"] * (os.cpu_count() or 1))
    warning = " (over 5%: the host was busy; distrust this run)" if share > 0.05 else ""
    return f"CPU time taken by the host (steal): {stolen:.1f} s, {share:.0%} of the run{warning}\n"


def write(results: dict[str, Any]) -> None:
    """Write the results as latest.json and as a copy named by the time."""
    RESULTS.mkdir(exist_ok=True)
    stamp = results["time"].replace(":", "").replace("+0000", "Z")
    text = json.dumps(results, indent=2) + "\n"
    for name in (f"bench-{stamp}.json", "latest.json"):
        (RESULTS / name).write_text(text)


if __name__ == "__main__":
    sys.exit(main())
