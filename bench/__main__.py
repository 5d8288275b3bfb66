"""Run every benchmark, print a table, and write the figures to bench/results/.

`python -m bench [--quick] [--skip-apiserver]`. Every figure is a ratio against a baseline
measured in this same run: the bare aiohttp handler for throughput, 10 tracked pods for
judgement time, an empty index for memory, no webhooks for pod-create latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import load
from bench.quota import judgement_seconds, resident_megabytes
from bench.reviews import mutate_and_validate_bodies
from tests.e2e.gpuadm import make_tls
from tests.support import free_port

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
CONNECTIONS = 16


def pin(cpu: int) -> str:
    """Pin this process to one CPU when the machine has two or more; say what was done."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {cpu})
        return f"server on CPU 0, load generator on CPU {cpu}"
    return "server and load generator share the CPUs (cannot pin here)"


def start_server(kind: str, port: int, tls_dir: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.server",
            kind,
            str(port),
            str(tls_dir / "tls.crt"),
            str(tls_dir / "tls.key"),
            "0",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the {kind} server did not start")


def http_figures(seconds: float) -> dict[str, Any]:
    """Throughput and latency of gpuadm against the bare handler, per endpoint."""
    mutate_bodies, validate_bodies = mutate_and_validate_bodies()
    bodies = {"/mutate": mutate_bodies, "/validate": validate_bodies}
    figures: dict[str, Any] = {
        "pinning": pin(1),
        "connections": CONNECTIONS,
        "review_bytes": len(mutate_bodies[0]),
    }
    with tempfile.TemporaryDirectory() as workdir:
        tls = make_tls(Path(workdir))
        context = ssl.create_default_context(cafile=tls.ca_file)
        for kind in ("bare", "gpuadm"):
            port = free_port()
            server = start_server(kind, port, Path(workdir))
            try:
                for path, sample in bodies.items():
                    asyncio.run(
                        load.closed_loop(
                            port, context, path, sample, connections=CONNECTIONS, seconds=1
                        )
                    )
                    result = asyncio.run(
                        load.closed_loop(
                            port, context, path, sample, connections=CONNECTIONS, seconds=seconds
                        )
                    )
                    figures[f"{kind}{path}"] = _summary(result)
                # Both servers at half the bare ceiling: the bare server's p99 at that rate is
                # the baseline, and shows what the load generator itself adds.
                for path, sample in bodies.items():
                    rate = figures[f"bare{path}"]["rps"] / 2
                    result = asyncio.run(
                        load.open_loop(
                            port,
                            context,
                            path,
                            sample,
                            connections=CONNECTIONS,
                            rate=rate,
                            seconds=seconds,
                        )
                    )
                    figures[f"{kind}{path}@half"] = {**_summary(result), "rate": rate}
            finally:
                server.terminate()
                server.wait()
    return figures


def _summary(result: load.Result) -> dict[str, float]:
    return {
        "rps": result.throughput,
        "p50_ms": result.percentile(50) * 1000,
        "p99_ms": result.percentile(99) * 1000,
        "requests": result.requests,
    }


def quota_figures(quick: bool) -> dict[str, Any]:
    """Judgement time by tracked pods, and resident memory with 100,000 GPU pods."""
    sizes = (10, 1_000, 100_000)
    times = {size: judgement_seconds(size, calls=1000 if quick else 3000) for size in sizes}
    memory = {size: resident_megabytes(size) for size in (0, 100_000)}
    return {
        "judgement_us": {str(size): t * 1e6 for size, t in times.items()},
        "judgement_ratio_100k_vs_10": times[100_000] / times[10],
        "rss_mb": {str(size): mb for size, mb in memory.items()},
        "rss_ratio_100k_vs_empty": memory[100_000] / memory[0],
    }


def print_table(results: dict[str, Any]) -> None:
    http, quota = results["http"], results["quota"]
    print(f"\ngpuadm benchmark, {results['time']} ({results['machine']})")
    print(
        f"HTTP: TLS keep-alive, {http['connections']} connections, {http['review_bytes']}-byte "
        f"reviews of every backend; {http['pinning']}"
    )
    print(f"{'figure':<44}{'value':>14}{'baseline':>14}{'ratio':>9}  target")
    for path in ("/mutate", "/validate"):
        ours, bare = http[f"gpuadm{path}"], http[f"bare{path}"]
        half = http[f"gpuadm{path}@half"]
        print(
            f"{path + ' throughput (req/s)':<44}{ours['rps']:>14.0f}{bare['rps']:>14.0f}"
            f"{ours['rps'] / bare['rps']:>9.2f}  >= 0.70"
        )
        print(
            f"{path + ' p50 / p99 at full load (ms)':<44}"
            f"{ours['p50_ms']:>6.2f} /{ours['p99_ms']:>6.2f}{bare['p50_ms']:>6.2f} /"
            f"{bare['p99_ms']:>6.2f}"
        )
        bare_half = http[f"bare{path}@half"]
        label = f"{path} p99 at half the ceiling, {half['rate']:.0f}/s (ms)"
        print(
            f"{label:<44}{half['p99_ms']:>14.2f}{bare_half['p99_ms']:>14.2f}"
            f"{half['p99_ms'] / bare_half['p99_ms']:>9.2f}  < 5"
        )
    judgement = quota["judgement_us"]
    print(
        f"{'quota judgement, 100,000 vs 10 pods (us)':<44}{judgement['100000']:>14.1f}"
        f"{judgement['10']:>14.1f}{quota['judgement_ratio_100k_vs_10']:>9.2f}  <= 1.5"
    )
    print(f"{'quota judgement, 1,000 pods (us)':<44}{judgement['1000']:>14.1f}")
    rss = quota["rss_mb"]
    print(
        f"{'resident memory, 100,000 vs 0 GPU pods (MB)':<44}{rss['100000']:>14.1f}"
        f"{rss['0']:>14.1f}{quota['rss_ratio_100k_vs_empty']:>9.2f}  < 200 MB"
    )
    api = results.get("apiserver")
    if api:
        open_ms = api["with_no_quota_ms"]
        print(
            f"{'pod create via apiserver, no quota (ms)':<44}{open_ms:>14.2f}"
            f"{api['without_ms']:>14.2f}{open_ms / api['without_ms']:>9.2f}"
            f"  +{open_ms - api['without_ms']:.2f} ms (< 10)"
        )
        added = api["with_ms"] - api["without_ms"]
        print(
            f"{'pod create via apiserver, under quota (ms)':<44}{api['with_ms']:>14.2f}"
            f"{api['without_ms']:>14.2f}{api['with_ms'] / api['without_ms']:>9.2f}"
            f"  +{added:.2f} ms (< 10)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="shorter runs, noisier figures")
    parser.add_argument(
        "--skip-apiserver",
        action="store_true",
        help="skip the pod-create latency through a real kube-apiserver",
    )
    args = parser.parse_args()
    seconds = 2.0 if args.quick else 5.0
    results: dict[str, Any] = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
        "quota": quota_figures(args.quick),
    }
    if not args.skip_apiserver:
        from bench.apiserver import measure

        results["apiserver"] = measure(count=100 if args.quick else 200)
    results["http"] = http_figures(seconds)
    RESULTS.mkdir(exist_ok=True)
    stamp = results["time"].replace(":", "").replace("+0000", "Z")
    for name in (f"bench-{stamp}.json", "latest.json"):
        (RESULTS / name).write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    print(f"\nfigures written to {RESULTS / 'latest.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
