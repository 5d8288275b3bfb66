"""gpuadm's quota at scale through a real kube-apiserver: 1,000 namespaces, 100,000 GPU pods.

`python -m bench.scale`, or `python -m bench --scale`. Not part of `make bench`: filling the
apiserver takes minutes, and so does a replica's start among the pods.

1. The end-to-end suite's control plane, 1,000 namespaces, gpuadm's quota ConfigMap with an
   entry for each (`h100: 1000`, never reached), the test policy, the GPUQuota CRD.
2. With no pod stored: one `gpuadm serve` in cluster mode, as the suite runs it, is timed
   from its start to /readyz answering 200, with the CPU it, kube-apiserver and etcd spent
   meanwhile; its resident memory is read; once it has published every namespace's
   GPUQuota, it is registered with the webhooks deploy/ ships and 200 pods asking for
   `gpuadm.io/h100: 1` are created one after another in one namespace, through the
   apiserver, in turn with pods gpuadm never sees (what the machine and the apiserver alone
   take at that moment). The replica stops, the GPU pods are deleted.
3. With the webhooks unregistered, 100 pods a namespace are stored as gpuadm's rewrite leaves
   them: gpuadm's own plan, applied to the same pod, checked against a pod it admitted.
4. A fresh replica, measured as in 2, must count every one of them.

Prints each figure with 0 pods and with the pods stored, and writes every raw figure to
bench/results/scale-<time>.json. `--namespaces` and `--pods-per-namespace` make a short trial.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import ssl
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes.client
import orjson
from kubernetes.client.exceptions import ApiException

from bench.apiserver import NATIVE_RESOURCE
from bench.creates import PodCreator, interleaved_latencies
from certs import TLSPaths
from policies import plan
from tests.builders import POLICY_YAML
from tests.e2e.cluster import ControlPlane
from tests.e2e.fixtures import pod_body
from tests.e2e.gpuadm import (
    NAMESPACE,
    GpuadmProcess,
    install_quota_view,
    make_tls,
    put_configmap,
    register_webhooks,
    shipped_webhook_configurations,
    wait_until,
)
from webhook.config.snapshot import snapshot_from_text
from webhook.kube.endpoint import LIST_PAGE_SIZE

RESULTS = Path(__file__).resolve().parent / "results"
NAMESPACES = 1_000
PODS_PER_NAMESPACE = 100
# Each namespace's quota: never reached, so that every create pays the whole check.
LIMIT = 1_000
RESOURCE = "gpuadm.io/h100"
# Where pods gpuadm's webhooks never see are created, in turn with those under quota.
PLAIN = "scale-plain"
CREATES = 200
WARMUP_CREATES = 10
FILL_CONNECTIONS = 32
# How long a replica may take to be ready, and to publish every GPUQuota, before the run fails.
START_SECONDS = 1_800.0
PUBLISH_SECONDS = 600.0
# The targets: resident memory, and create medians within this ratio of the empty cluster's.
MEMORY_MB = 300
FLAT = 1.2
# The replica's log lines kept in the results: its start, and a little more.
LOG_LINES = 40
CPU = "process_cpu_seconds_total"
ETCD_SIZES = ("etcd_mvcc_db_total_size_in_bytes", "etcd_mvcc_db_total_size_in_use_in_bytes")
# A row's target: its text, and whether the figures (with no pods, with them) meet it.
Target = tuple[str, Callable[[float, float], bool]]


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, write the results, print the table."""
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--namespaces", type=int, default=NAMESPACES)
    parser.add_argument("--pods-per-namespace", type=int, default=PODS_PER_NAMESPACE)
    args = parser.parse_args(argv)
    started = time.monotonic()
    results: dict[str, Any] = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}",
        "load_average_start": os.getloadavg(),
        "namespaces": args.namespaces,
        "pods_per_namespace": args.pods_per_namespace,
        **measure(args.namespaces, args.pods_per_namespace),
        "load_average_end": os.getloadavg(),
        "seconds": time.monotonic() - started,
    }
    path = RESULTS / f"scale-{results['time'].replace(':', '').replace('+0000', 'Z')}.json"
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(report(results))
    print(f"\nfigures written to {path}")
    return 0


def measure(namespaces: int, per_namespace: int) -> dict[str, Any]:
    """Measure a replica among no pods, fill the apiserver, and measure a fresh one."""
    names = [f"scale-{n:04d}" for n in range(namespaces)]
    quotas = "namespaces:\n" + "".join(f"  {name}: {{h100: {LIMIT}}}\n" for name in names)
    with (
        ControlPlane() as plane,
        tempfile.TemporaryDirectory() as workdir,
        plane.api_client() as api,
    ):
        core = kubernetes.client.CoreV1Api(api)
        prepare(core, api, names, quotas)
        tls = make_tls(Path(workdir) / "tls")
        rewritten = stored_pod(quotas)
        empty = replica_figures(plane, api, tls, Path(workdir), 0, names, pods=0)
        check_rewrite(core, names[0], rewritten)
        core.delete_collection_namespaced_pod(names[0], grace_period_seconds=0)
        wait_until(lambda: not core.list_namespaced_pod(names[0]).items, "the creates deleted")
        fill_seconds = asyncio.run(fill(plane, names, per_namespace, rewritten))
        pods = namespaces * per_namespace
        fill_figures = {
            "seconds": fill_seconds,
            "pods": pods,
            **asyncio.run(timed_list(plane)),
            **etcd_sizes(plane),
        }
        full = replica_figures(plane, api, tls, Path(workdir), 1, names, pods=pods)
    return {"empty": empty, "fill": fill_figures, "full": full}


def prepare(
    core: kubernetes.client.CoreV1Api,
    api: kubernetes.client.ApiClient,
    names: list[str],
    quotas: str,
) -> None:
    """Make gpuadm's namespace, its config and GPUQuota CRD, and the tenants' namespaces."""
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    put_configmap(core, "gpuadm-policy", "policy.yaml", POLICY_YAML)
    put_configmap(core, "gpuadm-quotas", "quotas.yaml", quotas)
    install_quota_view(api)
    for name in [*names, PLAIN]:
        core.create_namespace({"metadata": {"name": name}})


def stored_pod(quotas: str) -> dict[str, Any]:
    """Return a pod asking for one H100 as the apiserver stores it after gpuadm's rewrite."""
    policy = snapshot_from_text(POLICY_YAML, quotas, policy_source="p", quotas_source="q").policy
    pod = pod_body({RESOURCE: "1"}, name="template")
    rewritten: dict[str, Any] = jsonpatch.apply_patch(pod, plan(pod, policy).patch)
    return rewritten


def check_rewrite(
    core: kubernetes.client.CoreV1Api, namespace: str, rewritten: dict[str, Any]
) -> None:
    """Fail unless a pod gpuadm admitted carries what the fill's pods will carry."""
    admitted = json.loads(
        core.read_namespaced_pod(f"seq0-{CREATES - 1}", namespace, _preload_content=False).data
    )

    def gpuadm_fields(pod: dict[str, Any]) -> list[Any]:
        spec = pod["spec"]
        meta = pod["metadata"]
        return [meta.get("labels"), meta.get("annotations"), spec.get("affinity")] + [
            c["resources"] for c in spec["containers"]
        ]

    if gpuadm_fields(admitted) != gpuadm_fields(rewritten):
        raise RuntimeError(
            "the fill's pods would differ from gpuadm's: "
            f"{gpuadm_fields(admitted)} != {gpuadm_fields(rewritten)}"
        )


async def fill(
    plane: ControlPlane, names: list[str], per_namespace: int, rewritten: dict[str, Any]
) -> float:
    """Store `per_namespace` copies of `rewritten` in each namespace; return the seconds."""
    jobs = iter([(name, f"pod-{n:04d}") for n in range(per_namespace) for name in names])
    total = len(names) * per_namespace
    done = 0
    started = time.monotonic()

    async def worker(creator: PodCreator) -> None:
        nonlocal done
        for namespace, name in jobs:
            body = {**rewritten, "metadata": {**rewritten["metadata"], "name": name}}
            for attempt in range(5):
                status = await creator.create(namespace, body)
                # 409: an earlier attempt was stored, its answer lost.
                if status == 201 or (status == 409 and attempt):
                    break
                await asyncio.sleep(1)
            else:
                raise RuntimeError(f"storing pod {namespace}/{name} answered HTTP {status}")
            done += 1
            if done % max(1, total // 10) == 0:
                rate = done / (time.monotonic() - started)
                print(f"stored {done:,} of {total:,} pods, {rate:.0f}/s", file=sys.stderr)

    async with PodCreator(plane, connections=FILL_CONNECTIONS) as creator:
        await asyncio.gather(*(worker(creator) for _ in range(FILL_CONNECTIONS)))
    return time.monotonic() - started


async def timed_list(plane: ControlPlane) -> dict[str, Any]:
    """List every pod in gpuadm's pages, decoded as gpuadm decodes them: the apiserver's share
    of a replica's start. Return the seconds it took, and the CPU seconds each side spent."""
    started, client_cpu, servers = time.monotonic(), time.process_time(), control_plane_cpu(plane)
    query = {"limit": str(LIST_PAGE_SIZE)}
    async with PodCreator(plane, connections=1) as creator:
        while True:
            async with creator.session.get("/api/v1/pods", params=query) as answer:
                page = orjson.loads(await answer.read())
            query["continue"] = page["metadata"].get("continue", "")
            if not query["continue"]:
                break
    return {
        "list_s": time.monotonic() - started,
        "list_client_cpu_s": time.process_time() - client_cpu,
        "list_cpu_s": cpu_since(plane, servers),
    }


def replica_figures(
    plane: ControlPlane,
    api: kubernetes.client.ApiClient,
    tls: TLSPaths,
    workdir: Path,
    index: int,
    names: list[str],
    *,
    pods: int,
) -> dict[str, Any]:
    """Start a replica among `pods` GPU pods; time its start, read its memory and count, and
    time creates through it; stop it."""
    core = kubernetes.client.CoreV1Api(api)
    process = GpuadmProcess(plane, tls, workdir, index)
    figures: dict[str, Any] = {"pods": pods}
    servers = control_plane_cpu(plane)
    started_at = time.time()
    started = time.monotonic()
    try:
        process.start()
        figures["listening_s"] = time.monotonic() - started
        ready = f"gpuadm ready among {pods} pods"
        wait_until(process.ready, ready, process.log_tail, seconds=START_SECONDS)
        figures["ready_s"] = time.monotonic() - started
        figures["memory_at_ready"] = memory(process)
        figures["cpu_s_at_ready"] = cpu_seconds(process)
        figures["cpu_s_until_ready"] = cpu_since(plane, servers)
        figures["tracked_at_ready"] = process.metric("gpuadm_tracked_gpu_pods")
        figures["published_in_use"] = wait_published(api, len(names), pods)
        figures["published_s"] = time.monotonic() - started - figures["ready_s"]
        figures["memory_at_published"] = memory(process)
        base = f"https://127.0.0.1:{process.port}"
        register_webhooks(
            api, tls.ca_file, mutate_url=f"{base}/mutate", validate_url=f"{base}/validate"
        )
        wait_until(lambda: reviews(process, core, names[0]), "gpuadm's webhooks in force")
        figures.update(asyncio.run(timed_creates(plane, process, names[0], f"seq{index}")))
        counted = pods + WARMUP_CREATES + CREATES
        wait_until(
            lambda: process.metric("gpuadm_tracked_gpu_pods") == counted,
            f"gpuadm to track {counted} pods",
            lambda: str(process.metric("gpuadm_tracked_gpu_pods")),
        )
        figures["tracked_after_creates"] = counted
        figures["memory_at_end"] = memory(process)
        unregister_webhooks(api)
        wait_until(lambda: not reviews(process, core, names[0]), "gpuadm's webhooks gone")
    except Exception:
        print(f"--- gpuadm on port {process.port} ---\n{process.log_tail()}", file=sys.stderr)
        raise
    finally:
        process.stop()
    figures["log"] = startup_log(process.log_path, started_at)
    figures["listed_s"] = next(
        (at for at, message in figures["log"] if "listed pods:" in message), float("nan")
    )
    return figures


def memory(process: GpuadmProcess) -> dict[str, float]:
    """Return the replica's resident memory now and at its peak, and its own metric, in MB."""
    assert process.process is not None
    status = Path(f"/proc/{process.process.pid}/status").read_text().splitlines()
    fields = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in status if "kB" in line}
    return {
        "vm_rss_mb": fields["VmRSS"],
        "vm_hwm_mb": fields["VmHWM"],
        "metric_mb": process.metric("gpuadm_process_resident_memory_bytes") / 2**20,
    }


def cpu_seconds(process: GpuadmProcess) -> float:
    """Return the CPU time, user and system, the replica has spent."""
    assert process.process is not None
    stat = Path(f"/proc/{process.process.pid}/stat").read_text()
    utime, stime = stat.rsplit(")", 1)[1].split()[11:13]
    return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


def wait_published(api: kubernetes.client.ApiClient, namespaces: int, pods: int) -> float:
    """Wait until the leader's GPUQuota objects show every namespace and every pod; return
    the GPUs they show in use."""
    custom = kubernetes.client.CustomObjectsApi(api)
    shown = {"namespaces": 0, "in_use": 0.0}

    def published() -> bool:
        items = custom.list_cluster_custom_object("gpuadm.io", "v1alpha1", "gpuquotas")["items"]
        shown["namespaces"] = len({item["metadata"]["namespace"] for item in items})
        shown["in_use"] = sum(float(item["status"]["inUse"]) for item in items)
        return shown["namespaces"] == namespaces and shown["in_use"] == pods

    wait_until(published, "every GPUQuota published", lambda: str(shown), PUBLISH_SECONDS)
    return shown["in_use"]


def reviews(process: GpuadmProcess, core: kubernetes.client.CoreV1Api, namespace: str) -> bool:
    """Tell whether a dry-run create of a GPU pod in `namespace` reached the replica."""
    before = process.metric("gpuadm_admission_requests_total")
    core.create_namespaced_pod(namespace, pod_body({RESOURCE: "1"}), dry_run="All")
    return process.metric("gpuadm_admission_requests_total") > before


def unregister_webhooks(api: kubernetes.client.ApiClient) -> None:
    """Delete the webhook configurations `register_webhooks` made."""
    admission = kubernetes.client.AdmissionregistrationV1Api(api)
    for configuration in shipped_webhook_configurations():
        name = configuration["metadata"]["name"]
        try:
            if configuration["kind"].startswith("Mutating"):
                admission.delete_mutating_webhook_configuration(name)
            else:
                admission.delete_validating_webhook_configuration(name)
        except ApiException as error:
            if error.status != 404:
                raise


async def timed_creates(
    plane: ControlPlane, process: GpuadmProcess, namespace: str, prefix: str
) -> dict[str, Any]:
    """Create GPU pods one after another in `namespace`, in turn with pods gpuadm never sees
    in `PLAIN`: the latter tell what the machine and the apiserver alone take at that moment.
    Return the latencies, and gpuadm's own time per review."""
    kinds = {"gpuadm": (namespace, RESOURCE), "plain": (PLAIN, NATIVE_RESOURCE)}
    async with PodCreator(plane, connections=1) as creator:
        await creator.open_connections()
        await interleaved_latencies(creator, kinds, count=WARMUP_CREATES, prefix=f"warm{prefix}")
        reviewed = process.metric("gpuadm_admission_duration_seconds_count")
        spent = process.metric("gpuadm_admission_duration_seconds_sum")
        latencies = await interleaved_latencies(creator, kinds, count=CREATES, prefix=prefix)
    reviewed = process.metric("gpuadm_admission_duration_seconds_count") - reviewed
    spent = process.metric("gpuadm_admission_duration_seconds_sum") - spent
    figures: dict[str, Any] = {"review_mean_ms": spent / reviewed * 1000}
    for kind, seconds in latencies.items():
        figures[f"{kind}_median_ms"] = statistics.median(seconds) * 1000
        figures[f"{kind}_p90_ms"] = statistics.quantiles(seconds, n=10)[-1] * 1000
        figures[f"{kind}_ms"] = [latency * 1000 for latency in seconds]
    figures["added_median_ms"] = figures["gpuadm_median_ms"] - figures["plain_median_ms"]
    # The machine's load, shared with others, moves both kinds alike: this ratio does not.
    figures["relative_median"] = figures["gpuadm_median_ms"] / figures["plain_median_ms"]
    return figures


def startup_log(log_path: Path, started_at: float) -> list[tuple[float, str]]:
    """Return the replica's first operational log lines (not its audit records), each with
    the seconds since it was started."""
    found = []
    for line in log_path.read_text(errors="replace").splitlines():
        entry = json.loads(line) if line.startswith("{") else {}
        if "logger" in entry:
            at = datetime.fromisoformat(entry["time"]).timestamp() - started_at
            found.append((round(at, 3), f"{entry['logger']}: {entry['message']}"))
    return found[:LOG_LINES]


def etcd_sizes(plane: ControlPlane) -> dict[str, float]:
    """Return etcd's database size, allocated and in use, from its /metrics."""
    return scraped(plane.etcd_url, ETCD_SIZES)


def control_plane_cpu(plane: ControlPlane) -> dict[str, float]:
    """Return the CPU seconds kube-apiserver and etcd have spent, from their /metrics."""
    return {
        "apiserver": scraped(plane.url, [CPU], plane)[CPU],
        "etcd": scraped(plane.etcd_url, [CPU])[CPU],
    }


def cpu_since(plane: ControlPlane, before: dict[str, float]) -> dict[str, float]:
    """Return the CPU seconds kube-apiserver and etcd have spent since `before`."""
    return {name: spent - before[name] for name, spent in control_plane_cpu(plane).items()}


def scraped(url: str, names: Sequence[str], plane: ControlPlane | None = None) -> dict[str, float]:
    """Return the samples of `names` (metrics without labels) in `url`/metrics; `plane`'s
    admin token and CA for the apiserver's."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    request = urllib.request.Request(f"{url}/metrics")
    if plane is not None:
        context = ssl.create_default_context(cafile=str(plane.ca_file))
        handlers.append(urllib.request.HTTPSHandler(context=context))
        request.add_header("Authorization", f"Bearer {plane.token}")
    with urllib.request.build_opener(*handlers).open(request, timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    return {
        name: float(line.split()[1])
        for line in lines
        for name in names
        if line.startswith(name + " ")
    }


def report(results: dict[str, Any]) -> str:
    """Return the table: each figure with no pods, with the pods stored, the ratio, and the
    target the figure with the pods stored meets or not."""
    empty, full, fill_ = results["empty"], results["full"], results["fill"]
    pods = fill_["pods"]
    under_memory: Target = (f"< {MEMORY_MB} MB", lambda _, after: after < MEMORY_MB)
    flat: Target = (f"ratio <= {FLAT}", lambda before, after: after <= before * FLAT)
    counted: Target = (f"= {pods:,}", lambda _, after: after == pods)
    rows: list[tuple[str, str | tuple[str, str], Target | None]] = [
        ("replica start to /readyz (s)", "ready_s", None),
        ("  of which: to the pods listed (its log) (s)", "listed_s", None),
        ("  gpuadm's CPU time until ready, user + system (s)", "cpu_s_at_ready", None),
        ("  kube-apiserver's CPU time meanwhile (s)", ("cpu_s_until_ready", "apiserver"), None),
        ("  etcd's CPU time meanwhile (s)", ("cpu_s_until_ready", "etcd"), None),
        ("  ready to every GPUQuota published (s)", "published_s", None),
        ("resident memory at ready, VmRSS (MB)", ("memory_at_ready", "vm_rss_mb"), under_memory),
        ("  its gpuadm_process_resident_memory_bytes (MB)", ("memory_at_ready", "metric_mb"), None),
        ("  once every GPUQuota is published (MB)", ("memory_at_published", "vm_rss_mb"), None),
        ("  at the end, after the creates (MB)", ("memory_at_end", "vm_rss_mb"), None),
        (
            "  peak over its life, VmHWM at the end (MB)",
            ("memory_at_end", "vm_hwm_mb"),
            under_memory,
        ),
        ("create under quota, median (ms)", "gpuadm_median_ms", flat),
        ("  p90 (ms)", "gpuadm_p90_ms", None),
        ("  in turn, create gpuadm never sees, median (ms)", "plain_median_ms", None),
        ("  gpuadm's share: the difference (ms)", "added_median_ms", None),
        ("  create under quota / create never seen, medians", "relative_median", flat),
        ("gpuadm's own time per review, mean (ms)", "review_mean_ms", None),
        ("GPU pods tracked at ready", "tracked_at_ready", counted),
    ]
    lines = [
        f"\ngpuadm at scale, {results['time']}, {results['seconds']:.0f} s ({results['machine']})",
        f"{results['namespaces']:,} namespaces with quotas; load average (1, 5, 15 min) "
        f"{_loads(results['load_average_start'])} at the start, "
        f"{_loads(results['load_average_end'])} at the end",
        f"fill: {pods:,} pods stored in {fill_['seconds']:.0f} s "
        f"({pods / fill_['seconds']:.0f}/s); etcd db {_mb(fill_, ETCD_SIZES[0])} MB "
        f"({_mb(fill_, ETCD_SIZES[1])} MB in use)",
        f"the benchmark lists them all, in gpuadm's pages, in {fill_['list_s']:.1f} s, spending "
        f"{fill_['list_client_cpu_s']:.1f} s of CPU; kube-apiserver {_cpu(fill_, 'apiserver')} s, "
        f"etcd {_cpu(fill_, 'etcd')} s\n",
        f"{'figure':<50}{'0 pods':>9}{f'{pods:,} pods':>14}{'ratio':>7}  {'target':<14}met",
    ]
    for figure, key, target in rows:
        before, after = _figure(empty, key), _figure(full, key)
        ratio = f"{after / before:.2f}" if before else ""
        met = ("yes" if target[1](before, after) else "NO") if target else ""
        lines.append(
            f"{figure:<50}{_number(before):>9}{_number(after):>14}{ratio:>7}  "
            f"{target[0] if target else '':<14}{met}".rstrip()
        )
    return "\n".join(lines)


def _figure(phase: dict[str, Any], key: str | tuple[str, str]) -> float:
    if isinstance(key, tuple):
        return float(phase[key[0]][key[1]])
    return float(phase[key])


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.1f}"


def _mb(figures: dict[str, Any], name: str) -> str:
    return f"{figures.get(name, float('nan')) / 1e6:.0f}"


def _cpu(figures: dict[str, Any], name: str) -> str:
    return f"{figures['list_cpu_s'][name]:.1f}"


def _loads(loads: Sequence[float]) -> str:
    return ", ".join(f"{load:.2f}" for load in loads)


if __name__ == "__main__":
    sys.exit(main())
