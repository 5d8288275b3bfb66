"""Throughput and tail latency of /mutate and /validate, gpuadm against the bare handler.

Both servers run at once on the server CPU, and each measurement takes them in turn, round
after round, so that a change in the machine's load falls on both alike. A figure is the
median of its rounds.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench import cpus
from bench.reviews import mutate_and_validate_bodies
from bench.server import serving_bare, serving_gpuadm
from bench.vegeta import Attack, Vegeta

CONNECTIONS = 16
WARMUP_SECONDS = 1.0


def endpoint_figures(vegeta: Path, workdir: Path, *, seconds: float, rounds: int) -> dict[str, Any]:
    """Return, per endpoint and server, the closed-loop figures and those at half the ceiling.

    Half the ceiling is half the bare handler's throughput on that endpoint: both servers are
    sent that rate, and the bare handler's own p99 there is the anchor of gpuadm's.
    """
    mutate, validate = mutate_and_validate_bodies()
    bodies = {"/mutate": mutate, "/validate": validate}
    figures: dict[str, Any] = {
        "pinning": cpus.describe(),
        "connections": CONNECTIONS,
        "review_bytes": len(mutate[0]),
        "rounds": rounds,
        "seconds": seconds,
    }
    with cpus.pinned(cpus.GENERATOR_CPU), contextlib.ExitStack() as stack:
        with cpus.pinned(cpus.SERVER_CPU):
            servers = {
                "bare": stack.enter_context(serving_bare(workdir / "bare")),
                "gpuadm": stack.enter_context(serving_gpuadm(workdir / "gpuadm")),
            }
        attacks = {
            kind: Vegeta(vegeta, served.url, served.ca_file, CONNECTIONS, workdir)
            for kind, served in servers.items()
        }
        for path, sample in bodies.items():
            figures[path] = one_endpoint(attacks, path, sample, seconds, rounds)
    return figures


def one_endpoint(
    attacks: dict[str, Vegeta], path: str, bodies: list[bytes], seconds: float, rounds: int
) -> dict[str, dict[str, float]]:
    """Measure one endpoint of both servers.

    Keys: "bare" and "gpuadm" in closed loop; "bare@half" and "gpuadm@half" at half the bare
    ceiling (the target's rate); "bare@half-gpuadm" and "gpuadm@half-gpuadm" at half gpuadm's
    own ceiling, a rate gpuadm can carry even when it cannot carry the first.
    """

    closed = partial(Vegeta.closed_loop, path=path, bodies=bodies)
    in_turn(attacks, 1, partial(closed, seconds=WARMUP_SECONDS))
    found = in_turn(attacks, rounds, partial(closed, seconds=seconds))
    for suffix, ceiling in (("half", "bare"), ("half-gpuadm", "gpuadm")):
        rate = found[ceiling]["rps"] / 2
        fixed = partial(Vegeta.fixed_rate, path=path, bodies=bodies, rate=rate, seconds=seconds)
        at_rate = in_turn(attacks, rounds, fixed)
        found |= {f"{kind}@{suffix}": {**one, "rate": rate} for kind, one in at_rate.items()}
    return found


def in_turn(
    attacks: dict[str, Vegeta], rounds: int, run: Callable[[Vegeta], Attack]
) -> dict[str, dict[str, float]]:
    """Run `run` on each server in turn, `rounds` times; return each one's median figures."""
    found: dict[str, list[dict[str, float]]] = {kind: [] for kind in attacks}
    for _ in range(rounds):
        for kind, attack in attacks.items():
            found[kind].append(run(attack).as_dict())
    return {
        kind: {key: statistics.median(one[key] for one in runs) for key in runs[0]}
        for kind, runs in found.items()
    }
