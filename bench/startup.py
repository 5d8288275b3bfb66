"""How long the command line takes to start and answer, against `python -c pass`.

`gpuadm review` and `gpuadm check-config` are run by people and by CI on every change of a
pod or a config; they import only what they use (the core, YAML, the admission path), never
the Kubernetes client, aiohttp or the metrics exporter. Each is timed by hyperfine when it
is installed, else by a loop of subprocesses here, beside the interpreter's own start
measured the same way in this run. A figure is the median of the runs, as elsewhere in the
benchmark: on a shared machine, a run that waited for the CPU moves the mean, not the
median. The means are kept in the results too.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
COMMANDS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "gpuadm --version": [sys.executable, "-m", "webhook.cli", "--version"],
    "gpuadm check-config": [
        sys.executable,
        "-m",
        "webhook.cli",
        "check-config",
        str(EXAMPLES / "policy.yaml"),
        str(EXAMPLES / "quotas.yaml"),
    ],
    "gpuadm review": [
        sys.executable,
        "-m",
        "webhook.cli",
        "review",
        str(EXAMPLES / "pods" / "a100-half.yaml"),
        "--policy",
        str(EXAMPLES / "policy.yaml"),
        "--quotas",
        str(EXAMPLES / "quotas.yaml"),
    ],
}


def startup_figures(runs: int) -> dict[str, Any]:
    """Return the median wall time of each command, in ms (`ms`; the means in `mean_ms`),
    and how it was measured."""
    for argv in COMMANDS.values():
        # A command that fails would be timed failing: check each once first.
        subprocess.run(argv, cwd=ROOT, capture_output=True, check=True, timeout=60)
    hyperfine = shutil.which("hyperfine")
    times = _hyperfine(hyperfine, runs) if hyperfine else _loop(runs)
    return {
        "tool": "hyperfine" if hyperfine else "subprocess loop",
        "runs": runs,
        "ms": {name: statistics.median(found) for name, found in times.items()},
        "mean_ms": {name: statistics.mean(found) for name, found in times.items()},
    }


def _hyperfine(binary: str, runs: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as directory:
        exported = Path(directory) / "startup.json"
        subprocess.run(
            [binary, "-N", "--warmup", "3", "--runs", str(runs), "--export-json", str(exported)]
            + [" ".join(_quoted(argv)) for argv in COMMANDS.values()],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=600,
        )
        found = json.loads(exported.read_text())["results"]
    return {
        name: [seconds * 1000 for seconds in r["times"]]
        for name, r in zip(COMMANDS, found, strict=True)
    }


def _loop(runs: int) -> dict[str, list[float]]:
    times = {}
    for name, argv in COMMANDS.items():
        taken = []
        for _ in range(runs + 3):
            started = time.perf_counter()
            subprocess.run(argv, cwd=ROOT, capture_output=True, check=True, timeout=60)
            taken.append((time.perf_counter() - started) * 1000)
        times[name] = taken[3:]  # the first runs warm the file cache
    return times


def _quoted(argv: list[str]) -> list[str]:
    return [f"'{part}'" if " " in part else part for part in argv]
