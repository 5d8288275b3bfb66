"""`gpuadm quota`: per namespace and class, the limit, what is in use, reserved and waiting,
and the pods that hold it; read from the cluster and counted as the webhook counts."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

import yaml

from webhook.cli import flags
from webhook.cli.columns import column_widths, line
from webhook.cli.exits import CommandError, ExitCode

if TYPE_CHECKING:
    from webhook.kube.rest import AsyncApi
    from webhook.quota.report import ClassReport

# The cluster and quota modules are imported by the functions that read the cluster, so
# that the commands that never do (review, check-config) start without them.


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpuadm quota` to the command line."""
    quota = sub.add_parser(
        "quota",
        help="show each namespace's GPU quota: limit, in use, reserved, waiting, and who holds it",
    )
    quota.add_argument(
        "-n",
        "--namespace",
        dest="tenant",
        type=flags.namespace_name,
        help="show this namespace only (default: every namespace the quotas list, or that "
        "holds, reserves or waits for GPUs)",
    )
    quota.add_argument(
        "-o",
        "--output",
        choices=["table", "wide", "json", "yaml"],
        default="table",
        help="table (default; wide is the same table, which already has every column), "
        "json or yaml",
    )
    quota.add_argument("--no-headers", action="store_true", help="print the table's rows only")
    flags.add_gpuadm_namespace(quota, has_tenant=True)
    flags.add_kubeconfig(quota)
    quota.set_defaults(run=run)


def run(args: argparse.Namespace) -> ExitCode:
    """Print the reports."""
    from webhook.cli.cluster import call, cluster_api
    from webhook.kube.errors import KubeError

    try:
        api = cluster_api(args)
        reports = call(api, cluster_reports(api, args.gpuadm_namespace, only=args.tenant))
    except KubeError as error:
        raise CommandError(f"cannot read the cluster: {error}") from None
    if args.output == "json":
        print(json.dumps({"items": [r.to_json() for r in reports]}, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump({"items": [r.to_json() for r in reports]}, sort_keys=False).rstrip())
    else:
        print(table(reports, headers=not args.no_headers))
    return ExitCode.OK


async def cluster_reports(
    api: AsyncApi, gpuadm_namespace: str, *, only: str | None
) -> list[ClassReport]:
    """Read config, pods and usage records from the cluster; report as the webhook counts,
    with each GPU-hour budget's window as the GPU-hour records count it."""
    from fractions import Fraction

    from policies.quota.gpu_hours import Hours, RecordError, used_in_windows
    from policies.quota.queue import Waiting
    from webhook.cli.cluster import cluster_config
    from webhook.gpu_hours.store import HoursStore
    from webhook.kube.objects import USAGE_RECORD_LABEL
    from webhook.quota.claims import CLAIM_PREFIX
    from webhook.quota.configmap_store import record_of
    from webhook.quota.holdings import Holding, pod_state
    from webhook.quota.ledger import RESERVATION_TTL
    from webhook.quota.report import namespace_report, reported_namespaces, reservations_to_report
    from webhook.quota.reservations import Reservation

    config = await cluster_config(api, gpuadm_namespace)
    # The records before the pods: a reservation leaves its record only once a watch has
    # shown its pod, so every pod whose reservation is gone by now is in the list that
    # follows; read the other way round, a pod admitted in between would be in neither.
    records = (await api.list_configmaps(gpuadm_namespace, USAGE_RECORD_LABEL)).items
    holdings: dict[str, Holding] = {}
    waiting: dict[str, Waiting] = {}
    ended: set[str] = set()
    async for page in api.list_pods(namespace=only):
        for pod in page.items:
            uid = str(pod["metadata"]["uid"])
            state = pod_state(pod, config.policy, config.quotas)
            if isinstance(state, Holding):
                holdings[uid] = state
            elif isinstance(state, Waiting):
                waiting[uid] = state
            else:
                ended.add(uid)
    reserved: dict[str, list[Reservation]] = {}
    charged: set[str] = set()  # gated pods with a reservation: their gate is about to go
    now = time.time()
    for config_map in records:
        key = str(config_map["metadata"]["labels"][USAGE_RECORD_LABEL])
        live = {
            uid: r
            for uid, r in record_of(config_map).reservations.items()
            if now - r.at < RESERVATION_TTL and not uid.startswith(CLAIM_PREFIX)
        }
        # A reservation stops counting once its pod is seen holding GPUs or ended; in a
        # cohort's record, each names the member it charges.
        for r in reservations_to_report(live, holdings.keys() | ended):
            reserved.setdefault(r.namespace or key, []).append(r)
        charged.update(live)
    names = reported_namespaces(
        config.quotas,
        {h.namespace for h in holdings.values()},
        {w.namespace for w in waiting.values()},
        [ns for ns, found in reserved.items() if found],
        only=only,
    )
    hours = await HoursStore(api, gpuadm_namespace).read_all()
    held: dict[str, dict[str, Fraction]] = {}
    for h in holdings.values():
        classes = held.setdefault(h.namespace, {})
        classes[h.class_name] = classes.get(h.class_name, Fraction(0)) + h.charge
    for namespace, found in reserved.items():
        for r in found:
            classes = held.setdefault(namespace, {})
            classes[r.class_name] = classes.get(r.class_name, Fraction(0)) + r.charge
    reports = []
    for namespace in names:
        budgets = config.quotas.budgets_for(namespace)
        stored = hours.get(namespace)
        counted = Hours() if stored is None else stored.hours
        used = (
            {}
            if isinstance(counted, RecordError)
            else used_in_windows(counted, budgets, now=int(now))
        )
        reports += namespace_report(
            namespace,
            config.quotas,
            [h for h in holdings.values() if h.namespace == namespace],
            reserved.get(namespace, []),
            [w for w in waiting.values() if w.namespace == namespace and w.uid not in charged],
            budget_used=used,
            cohort_usage=held,
        )
    return reports


def _limit_cell(data: dict[str, Any]) -> str:
    """The LIMIT column: the limit, and in a cohort what the namespace borrows and lends."""
    limit = str(data.get("limit", "none"))
    if "cohort" not in data:
        return limit
    said = [f"cohort {data['cohort']}"]
    said += [f"{data[k]} {k}" for k in ("borrowed", "lent") if data.get(k) not in (None, "0")]
    return f"{limit} ({', '.join(said)})"


def table(reports: list[ClassReport], *, headers: bool = True) -> str:
    """Lay the reports out as kubectl does: a header, then a row per namespace and class."""
    header = (
        "NAMESPACE",
        "CLASS",
        "MODE",
        "LIMIT",
        "IN USE",
        "RESERVED",
        "WAITING",
        "BUDGET",
        "BUDGET USED",
        "PODS",
    )
    rows = [header]
    for report in reports:
        data: dict[str, Any] = report.to_json()
        pods = ", ".join(f"{h['pod']} ({h['gpus']})" for h in data["holders"])
        if data.get("holdersNotListed"):
            pods += f", and {data['holdersNotListed']} more"
        rows.append(
            (
                report.namespace,
                report.class_name,
                report.mode,
                _limit_cell(data),
                data["inUse"],
                data["reserved"],
                str(data["waiting"]),
                data.get("budget", "-"),
                data.get("budgetUsed", "-"),
                pods or "-",
            )
        )
    if len(rows) == 1:
        return "No GPU quotas, and no namespace holds or waits for GPUs." if headers else ""
    if not headers:
        rows = rows[1:]
    widths = column_widths(rows, len(header))
    return "\n".join(line(row, widths) for row in rows)
