"""Quota judgement time and resident memory, by the number of tracked GPU pods.

Judgement must not grow with the pods tracked: each namespace's use is a running sum. The
anchor of both figures is 10 tracked pods.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jsonpatch

from bench.reviews import ASKS, realistic_pod
from policies import Policy, plan, require_fixed_point
from tests.builders import POLICY_YAML
from webhook.config.snapshot import ConfigSnapshot, snapshot_from_text
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest

NAMESPACES = 100
SIZES = (10, 1_000, 100_000)
# Judgements timed against one index before moving to the next.
BATCH = 50
# Not tests.support.ROOT: that module brings aiohttp into the process whose memory is measured.
ROOT = Path(__file__).resolve().parents[1]


def stored(index: int, policy: Policy) -> dict[str, Any]:
    """Return a GPU pod as the apiserver stores it after gpuadm's rewrite."""
    class_name, amount = ASKS[index % len(ASKS)]
    pod = realistic_pod(class_name, amount, index)
    pod = dict(jsonpatch.apply_patch(pod, plan(pod, policy).patch))
    pod["metadata"]["namespace"] = f"team-{index % NAMESPACES}"
    pod["metadata"]["uid"] = str(uuid.UUID(int=index))
    return pod


def tracked_index(count: int) -> tuple[UsageIndex, ConfigSnapshot]:
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


def quota_figures(judgements: int) -> dict[str, Any]:
    """Return judgement time by tracked pods, and resident memory with the most and fewest.

    Memory is read in fresh processes, one per size, so that nothing carries from one to
    the next. Judgements are timed in one process holding every size, a batch of each in
    turn, so that a change in the machine's load falls on every size alike.
    """
    largest = _in_fresh_process(f"measure_here({judgements})")
    anchor_rss = _in_fresh_process("resident_megabytes_here()")
    return {
        "judgement_us": largest["judgement_us"],
        "rss_mb": {str(SIZES[0]): anchor_rss, str(SIZES[-1]): largest["rss_mb"]},
        "create_us": cohort_create_us(max(judgements, 300)),
    }


def _in_fresh_process(call: str) -> Any:
    """Return what `bench.quota.<call>` returns, run in a new interpreter."""
    code = f"import json, sys; from bench import quota; json.dump(quota.{call}, sys.stdout)"
    done = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
    )
    return json.loads(done.stdout)


def measure_here(judgements: int) -> dict[str, Any]:
    """Track the most pods and read memory; then add the smaller sizes and judge all in turn."""
    largest = SIZES[-1]
    indexes = {largest: tracked_index(largest)}
    gc.collect()
    rss = vm_rss_megabytes()
    for size in SIZES[:-1]:
        indexes[size] = tracked_index(size)
    return {"rss_mb": rss, "judgement_us": judgement_us_in_turn(indexes, judgements)}


def resident_megabytes_here() -> float:
    """Track the fewest pods; return this process's resident memory."""
    tracked_index(SIZES[0])
    gc.collect()
    return vm_rss_megabytes()


def judgement_us_in_turn(
    indexes: dict[int, tuple[UsageIndex, ConfigSnapshot]], judgements: int
) -> dict[str, float]:
    """Time `judgements` judgements against each index; return the median of each, in us."""
    judges = {size: one_judgement(usage, snapshot) for size, (usage, snapshot) in indexes.items()}

    async def measure() -> dict[int, list[float]]:
        times: dict[int, list[float]] = {size: [] for size in judges}
        for _ in range(max(1, judgements // BATCH)):
            for size, judge in judges.items():
                for _ in range(BATCH):
                    started = time.perf_counter()
                    await judge()
                    times[size].append(time.perf_counter() - started)
        return times

    found = asyncio.run(measure())
    return {str(size): statistics.median(found[size]) * 1e6 for size in sorted(found)}


def one_judgement(usage: UsageIndex, snapshot: ConfigSnapshot) -> Callable[[], Awaitable[None]]:
    """Return a call that judges one dry-run GPU pod of team-7 against `usage`."""
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=True)
    pod = stored(1, snapshot.policy)
    pod["metadata"]["namespace"] = "team-7"
    result = require_fixed_point(plan(pod, snapshot.policy))
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

    async def judge() -> None:
        outcome = await ledger.admit(request, result, snapshot)
        assert outcome is not None
        assert outcome.allowed

    return judge


def vm_rss_megabytes() -> float:
    """Return this process's resident memory in MiB, from /proc.

    Not getrusage: a child's ru_maxrss can carry its parent's peak.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


H100_ASK = next(i for i, (name, _) in enumerate(ASKS) if name == "h100")
COHORT_QUOTAS = """
namespaces:
  plain: {h100: 1000000}
  lab-a: {cohort: lab, h100: 1000000}
  lab-b: {cohort: lab, h100: 1000000}
  lab-c: {cohort: lab, h100: 1000000}
"""


def cohort_create_us(creates: int) -> dict[str, float]:
    """Time `creates` admissions of one-H100 pods (real creates, each charged) under a plain
    namespace quota and under a cohort of three, in turn; return the median of each, in us.

    Both run as users run them: the plain namespace admits from its room aside, without a
    write, where it can; a cohort's record sets none aside, so each create there writes it
    (to an in-process store: what is measured is gpuadm's own work, not the apiserver's)."""
    snapshot = snapshot_from_text(POLICY_YAML, COHORT_QUOTAS, policy_source="p", quotas_source="q")
    ledger = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=True, holder="bench")

    def request_in(namespace: str, index: int) -> tuple[AdmissionRequest, Any]:
        pod = stored(H100_ASK, snapshot.policy)  # an h100 pod, the class the quotas limit
        pod["metadata"].update(namespace=namespace, name=f"p{index}", uid=str(uuid.UUID(int=index)))
        result = require_fixed_point(plan(pod, snapshot.policy))
        request = AdmissionRequest(
            uid=f"bench-{index}",
            operation="CREATE",
            namespace=namespace,
            name=f"p{index}",
            object=pod,
            old_object=None,
            dry_run=False,
            user="alice",
            groups=(),
        )
        return request, result

    async def measure() -> dict[str, list[float]]:
        times: dict[str, list[float]] = {"plain": [], "cohort": []}
        for index in range(creates):
            for kind, namespace in (("plain", "plain"), ("cohort", f"lab-{'abc'[index % 3]}")):
                request, result = request_in(namespace, index * 2 + (kind == "cohort"))
                started = time.perf_counter()
                outcome = await ledger.admit(request, result, snapshot)
                times[kind].append(time.perf_counter() - started)
                assert outcome is not None
                assert outcome.allowed
        return times

    found = asyncio.run(measure())
    return {kind: statistics.median(found[kind]) * 1e6 for kind in found}
