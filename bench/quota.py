"""Quota judgement time and resident memory, by the number of tracked GPU pods."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.reviews import ASKS, realistic_pod
from policies import check_final, plan
from tests.builders import POLICY_YAML
from webhook.config.snapshot import snapshot_from_text
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest

NAMESPACES = 100


def stored(index: int, policy: Any) -> dict[str, Any]:
    """Return a GPU pod as the apiserver stores it after gpuadm's rewrite."""
    import jsonpatch

    class_name, amount = ASKS[index % len(ASKS)]
    pod = realistic_pod(class_name, amount, index)
    pod = dict(jsonpatch.apply_patch(pod, plan(pod, policy).patch))
    pod["metadata"]["namespace"] = f"team-{index % NAMESPACES}"
    pod["metadata"]["uid"] = str(uuid.UUID(int=index))
    return pod


def tracked_index(count: int) -> tuple[UsageIndex, Any]:
    """Return a usage index holding `count` GPU pods spread over the namespaces."""
    quotas = "namespaces:\n" + "".join(
        f"  team-{n}: {{a100: 1000000, '*': 1000000}}\n" for n in range(NAMESPACES)
    )
    snapshot = snapshot_from_text(POLICY_YAML, quotas, policy_source="p", quotas_source="q")
    usage = UsageIndex()
    template = [stored(i, snapshot.policy) for i in range(len(ASKS))]
    for index in range(count):
        pod = template[index % len(template)]
        pod["metadata"]["uid"] = str(uuid.UUID(int=index))
        pod["metadata"]["namespace"] = f"team-{index % NAMESPACES}"
        usage.observe(pod, snapshot.policy, snapshot.quotas, now=0)
    return usage, snapshot


def judgement_seconds(count: int, calls: int = 3000) -> float:
    """Return the median time of one quota judgement with `count` GPU pods tracked."""
    usage, snapshot = tracked_index(count)
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    pod = stored(1, snapshot.policy)
    pod["metadata"]["namespace"] = "team-7"
    result = check_final(pod, snapshot.policy)
    request = AdmissionRequest(
        uid="bench",
        operation="CREATE",
        namespace="team-7",
        name="p",
        object=pod,
        old_object=None,
        dry_run=True,
        user="alice",
        groups=(),
    )

    async def measure() -> list[float]:
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            outcome = await ledger.admit(request, result, snapshot)
            times.append(time.perf_counter() - started)
            assert outcome is not None
            assert outcome.allowed
        return times

    return statistics.median(asyncio.run(measure()))


def resident_megabytes(count: int) -> float:
    """Return the resident memory (VmRSS) of a fresh process that tracks `count` GPU pods.

    Read from /proc, not getrusage: a child's ru_maxrss can carry its parent's peak.
    """
    code = (
        "import gc; from bench.quota import tracked_index, vm_rss_megabytes; "
        f"index, _ = tracked_index({count}); gc.collect(); print(vm_rss_megabytes(), len(index))"
    )
    output = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    ).stdout.split()
    assert int(output[1]) == count
    return float(output[0])


def vm_rss_megabytes() -> float:
    """Return this process's resident memory in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")
