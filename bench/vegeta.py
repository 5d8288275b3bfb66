"""HTTP load from vegeta, a compiled generator, so that the generator is not what is measured.

Two kinds of attack on one URL, over TLS with keep-alive, rotating a list of bodies, on a
fixed number of connections:

- closed loop (`-rate=0`): one worker per connection, each sending its next request when the
  last answer arrives; this finds the highest throughput;
- fixed rate: requests start on schedule whatever the server does. vegeta starts a worker
  for each request that finds the others busy, and the request then waits for a free
  connection; its latency counts from its scheduled start, so queueing shows in the
  latency instead of slowing the load down. Capping the connections rather than the
  workers also keeps a slow moment from turning into a storm of new TLS handshakes.

vegeta runs on whatever CPUs this process may use, which the caller pins.
"""

from __future__ import annotations

import base64
import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.support import ROOT

TOOLS_SCRIPT = ROOT / "bench" / "tools.sh"
NANOSECONDS = 1e9


@dataclass(frozen=True)
class Attack:
    """What one attack measured: throughput, latency percentiles, and the share answered 2xx."""

    rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    requests: int
    success: float

    def as_dict(self) -> dict[str, float]:
        """Return the figures for the results file."""
        return asdict(self)


def ensure_vegeta() -> Path:
    """Build vegeta if needed (cached after the first time) and return its executable."""
    built = subprocess.run(
        ["bash", str(TOOLS_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(built.stdout.strip().splitlines()[-1]) / "vegeta"


@dataclass(frozen=True)
class Vegeta:
    """Attacks on one server: its URL prefix, the CA that signed it, how many connections to
    open, and a scratch folder."""

    executable: Path
    base_url: str
    ca_file: Path
    connections: int
    workdir: Path

    def closed_loop(self, path: str, bodies: list[bytes], *, seconds: float) -> Attack:
        """Send as fast as the server answers, one request at a time per connection."""
        workers = self.connections
        return self._attack(
            path, bodies, seconds, ["-rate=0", f"-workers={workers}", f"-max-workers={workers}"]
        )

    def fixed_rate(self, path: str, bodies: list[bytes], *, rate: float, seconds: float) -> Attack:
        """Start `rate` requests per second, on schedule, however long the answers take."""
        # vegeta's rate is an integer per time unit: per minute keeps fractional rates.
        return self._attack(
            path, bodies, seconds, [f"-rate={round(rate * 60)}/1m", f"-workers={self.connections}"]
        )

    def _attack(self, path: str, bodies: list[bytes], seconds: float, pace: list[str]) -> Attack:
        targets = self.workdir / "targets.jsonl"
        targets.write_text(targets_text(self.base_url + path, bodies))
        results = self.workdir / "results.bin"
        _run(
            [
                str(self.executable),
                "attack",
                "-format=json",
                f"-targets={targets}",
                f"-root-certs={self.ca_file}",
                # aiohttp speaks HTTP/1.1 only, as the apiserver then does with a webhook.
                "-http2=false",
                f"-max-connections={self.connections}",
                f"-duration={seconds}s",
                "-timeout=10s",
                f"-output={results}",
                *pace,
            ]
        )
        # The report is made after the attack, so that it takes no CPU from the generator.
        report = _run([str(self.executable), "report", "-type=json", str(results)])
        return attack_from_report(json.loads(report))


def _run(command: list[str]) -> str:
    """Run a vegeta command; return its output, or fail with what it said."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:2])} failed: {done.stderr.strip()}")
    return done.stdout


def targets_text(url: str, bodies: list[bytes]) -> str:
    """Return vegeta's JSON targets, one POST per body, which it sends in turn."""
    header = {"Content-Type": ["application/json"]}
    return "".join(
        json.dumps(
            {
                "method": "POST",
                "url": url,
                "body": base64.b64encode(body).decode(),
                "header": header,
            }
        )
        + "\n"
        for body in bodies
    )


def attack_from_report(report: dict[str, Any]) -> Attack:
    """Read `vegeta report -type=json`; latencies there are in nanoseconds."""
    latencies = report["latencies"]
    return Attack(
        rps=float(report["throughput"]),
        p50_ms=latencies["50th"] / NANOSECONDS * 1000,
        p95_ms=latencies["95th"] / NANOSECONDS * 1000,
        p99_ms=latencies["99th"] / NANOSECONDS * 1000,
        requests=int(report["requests"]),
        success=float(report["success"]),
    )
