"""How long the command line takes to start and answer, against `python -c pass`.

`gpuadm review` and `gpuadm check-config` are run by people and by CI on every change of a
pod or a config; they import only what they use (the core, YAML, the admission path), never
the Kubernetes client. Each is timed by hyperfine when it is installed, else by a loop of
subprocesses here, beside the interpreter's own start measured the same way in this run.
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
    """Return the mean wall time of each command, in ms, and how it was measured."""
    for argv in COMMANDS.values():
        # A command that fails would be timed failing: check each once first.
        subprocess.run(argv, cwd=ROOT, capture_output=True, check=True, timeout=60)
    hyperfine = shutil.which("hyperfine")
    means = _hyperfine(hyperfine, runs) if hyperfine else _loop(runs)
    return {"tool": "hyperfine" if hyperfine else "subprocess loop", "runs": runs, "ms": means}


def _hyperfine(binary: str, runs: int) -> dict[str, float]:
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
    return {name: r["mean"] * 1000 for name, r in zip(COMMANDS, found, strict=True)}


def _loop(runs: int) -> dict[str, float]:
    means = {}
    for name, argv in COMMANDS.items():
        times = []
        for _ in range(runs + 3):
            started = time.perf_counter()
            subprocess.run(argv, cwd=ROOT, capture_output=True, check=True, timeout=60)
            times.append((time.perf_counter() - started) * 1000)
        means[name] = statistics.mean(times[3:])  # the first runs warm the file cache
    return means


def _quoted(argv: list[str]) -> list[str]:
    return [f"'{part}'" if " " in part else part for part in argv]
