"""`gpuadm usage`: per namespace and class, the GPU-hours used over a period and in all, and
how much of each GPU-hour budget is spent; read from the GPU-hours records in the cluster.

The leader counts each namespace's GPU pods into its record (`gpuadm-gpu-hours-<namespace>`
in gpuadm's namespace, `webhook.gpu_hours.store`) at every checkpoint, 60 s by default
(`serve --gpu-hours-checkpoint-seconds`). What this command shows is the records, so:

- its figures lag the pods by at most one checkpoint interval: what ran after COUNTED-TO,
  the record's last checkpoint, is not in them yet (a checkpoint that counted nothing
  leaves the record, and its COUNTED-TO, as they were);
- a period is counted in whole buckets: the first bucket it reaches into (1 h wide by
  default, `serve --gpu-hours-bucket-seconds`; wider further back than the namespace's
  longest budget window, `policies.quota.gpu_hours.tiers`) is counted whole, as the budgets count
  it (`policies.quota.gpu_hours.ClassHours.within`), so a figure may include up to one bucket's
  usage from before the period began;
- the records keep 35 days of buckets, or the namespace's longest budget window and a day
  (`policies.quota.gpu_hours.KEEP_AT_LEAST`): a longer period counts no more than those; TOTAL
  never forgets.

Budget columns follow the quota config in the cluster (`gpuadm-quotas`), read as `gpuadm
quota` reads it: BUDGET-USED is the record's usage over the budget's own window; a `*`
budget has a row of its own, CLASS `*`, that sums every class.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from webhook.cli import flags
from webhook.cli.columns import column_widths, line
from webhook.cli.exits import CommandError, ExitCode

if TYPE_CHECKING:
    from fractions import Fraction

    from policies.quota.budget import Budget
    from policies.quota.quotas import QuotaConfig
    from webhook.gpu_hours.store import Stored
    from webhook.kube.rest import AsyncApi

# The cluster, the records and the core are imported by the functions that read them, so
# that the commands that never do (review, check-config) start without them.

DEFAULT_SINCE = "30d"
# The longest period asked for: a budget's longest window (`policies.quota.budget.MAX_WINDOW`).
MAX_SINCE_DAYS = 366

HEADER = ("NAMESPACE", "CLASS", "GPU-HOURS", "TOTAL", "COUNTED-TO", "BUDGET", "BUDGET-USED")
# The columns of `-o csv`: the keys of `-o json`'s items, in order.
CSV_FIELDS = (
    "namespace",
    "class",
    "period",
    "since",
    "gpuHours",
    "gpuSeconds",
    "totalGpuHours",
    "totalGpuSeconds",
    "countedTo",
    "budget",
    "budgetUsedGpuHours",
    "budgetUsedGpuSeconds",
    "error",
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpuadm usage` to the command line."""
    usage = sub.add_parser(
        "usage",
        help="show each namespace's GPU-hours: over a period, in all, and against its budgets",
        description="Per namespace and class, the GPU-hours used over the period --since "
        "(GPU-HOURS), in all (TOTAL), up to the record's last checkpoint (COUNTED-TO), and, "
        "where the quotas give the class a budget, the GPU-hours used in the budget's window "
        "(BUDGET-USED). Read from the GPU-hours records the leader writes at every checkpoint "
        "(default 60 s): the figures lag the pods by at most one checkpoint interval. A "
        "period is counted in whole buckets: the first bucket it reaches into (default 1 h "
        "wide) is counted whole, as budgets count it. Exits 1 if a record cannot be read.",
    )
    usage.add_argument(
        "-n",
        "--namespace",
        dest="tenant",
        type=flags.namespace_name,
        metavar="NAMESPACE",
        help="show this namespace only (default: every namespace with a GPU-hours record)",
    )
    usage.add_argument(
        "--since",
        default=DEFAULT_SINCE,
        metavar="DURATION",
        help="the period that ends now, as a whole number of weeks, days, hours, minutes or "
        f"seconds: 30d, 12h, 90m, 600s (default {DEFAULT_SINCE}). The records keep 35d of "
        "usage, so a longer period counts no more than 35d",
    )
    usage.add_argument(
        "-o",
        "--output",
        choices=["table", "wide", "json", "csv", "yaml"],
        default="table",
        help="table (default; wide is the same table, which already has every column), "
        "json, csv or yaml",
    )
    usage.add_argument(
        "--no-headers", action="store_true", help="print the table's or csv's rows only"
    )
    flags.add_gpuadm_namespace(usage, has_tenant=True)
    flags.add_kubeconfig(usage)
    usage.set_defaults(run=run)


def parse_since(text: str) -> int:
    """Read `--since`: a whole number of weeks, days, hours, minutes or seconds, as seconds
    (`policies.quota.budget.parse_duration`); raise `CommandError` naming the value otherwise."""
    from policies.quota.budget import DAY, parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError:
        raise CommandError(
            f"--since {text!r} is not a period: give a whole number of weeks, days, hours, "
            "minutes or seconds, e.g. 2w, 30d, 12h, 90m or 600s"
        ) from None
    if seconds == 0:
        raise CommandError(f"--since {text!r} is an empty period: give at least 1s")
    if seconds > MAX_SINCE_DAYS * DAY:
        raise CommandError(
            f"--since {text!r} is longer than {MAX_SINCE_DAYS}d; the records keep 35d of usage"
        )
    return seconds


@dataclass(frozen=True, slots=True)
class UsageRow:
    """A namespace's usage of one class (`*`: of all, for a `*` budget), or why its record
    cannot be read (`error`; then the figures are zero and not shown)."""

    namespace: str
    class_name: str
    # GPU-seconds over the period, and counted in all.
    used: Fraction
    total: Fraction
    # The record's checkpoint: what ran up to then is counted.
    counted_to: int
    budget: Budget | None = None
    # GPU-seconds in the budget's window.
    budget_used: Fraction | None = None
    error: str | None = None


def run(args: argparse.Namespace, *, clock: Callable[[], float] = time.time) -> ExitCode:
    """Print the usage; exit 1 if a record cannot be read."""
    since = parse_since(args.since)
    from webhook.cli.cluster import call, cluster_api
    from webhook.kube.errors import KubeError

    now = int(clock())
    try:
        api = cluster_api(args)
        rows = call(
            api, cluster_usage(api, args.gpuadm_namespace, only=args.tenant, since=since, now=now)
        )
    except KubeError as error:
        raise CommandError(f"cannot read the cluster: {error}") from None
    if args.output in ("json", "yaml"):
        document = {"items": [to_json(row, since=since, now=now) for row in rows]}
        if args.output == "json":
            print(json.dumps(document, indent=2))
        else:
            print(yaml.safe_dump(document, sort_keys=False).rstrip())
    elif args.output == "csv":
        write_csv(rows, since=since, now=now, headers=not args.no_headers)
    else:
        text = table(rows, headers=not args.no_headers)
        if text:
            print(text)
    return ExitCode.REFUSED if any(row.error is not None for row in rows) else ExitCode.OK


async def cluster_usage(
    api: AsyncApi, gpuadm_namespace: str, *, only: str | None, since: int, now: int
) -> list[UsageRow]:
    """Read the quota config and the GPU-hours records from the cluster; return the rows."""
    from webhook.cli.cluster import cluster_config
    from webhook.gpu_hours.store import HoursStore

    config = await cluster_config(api, gpuadm_namespace)
    records = await HoursStore(api, gpuadm_namespace).read_all()
    return usage_rows(records, config.quotas, only=only, since=since, now=now)


def usage_rows(
    records: Mapping[str, Stored],
    quotas: QuotaConfig,
    *,
    only: str | None,
    since: int,
    now: int,
) -> list[UsageRow]:
    """Return a row per namespace and class of the records (of `only`, if given): each class
    the record counts or the namespace's budgets name, then `*` if it has a `*` budget."""
    from fractions import Fraction

    from policies.quota.gpu_hours import RecordError
    from policies.quota.quotas import ALL_CLASSES

    rows: list[UsageRow] = []
    for namespace in sorted(records):
        if only is not None and namespace != only:
            continue
        hours = records[namespace].hours
        if isinstance(hours, RecordError):
            rows.append(UsageRow(namespace, "", Fraction(0), Fraction(0), 0, error=str(hours)))
            continue
        budgets = quotas.budgets_for(namespace)
        classes = sorted(set(hours.classes) | {k for k in budgets if k != ALL_CLASSES})
        if ALL_CLASSES in budgets:
            classes.append(ALL_CLASSES)
        for class_name in classes:
            total = (
                sum((hours.total(c) for c in hours.classes), Fraction(0))
                if class_name == ALL_CLASSES
                else hours.total(class_name)
            )
            budget = budgets.get(class_name)
            rows.append(
                UsageRow(
                    namespace,
                    class_name,
                    hours.within(class_name, now - since),
                    total,
                    hours.checkpoint,
                    budget,
                    None if budget is None else hours.within(class_name, now - budget.window),
                )
            )
    return rows


def _gpu_hours(gpu_seconds: Fraction) -> float:
    """GPU-seconds as GPU-hours, to the hundredth."""
    from policies.quota.budget import HOUR

    return float(round(gpu_seconds / HOUR, 2))


def to_json(row: UsageRow, *, since: int, now: int) -> dict[str, Any]:
    """Return a row as `-o json` shows it: GPU-hours to the hundredth, and the exact
    GPU-seconds as text (`"7/3"` where a share made them a fraction)."""
    if row.error is not None:
        return {"namespace": row.namespace, "error": row.error}
    from policies.quota.budget import duration
    from policies.quota.gpu_hours import timestamp

    data: dict[str, Any] = {
        "namespace": row.namespace,
        "class": row.class_name,
        "period": duration(since),
        "since": timestamp(now - since),
        "gpuHours": _gpu_hours(row.used),
        "gpuSeconds": str(row.used),
        "totalGpuHours": _gpu_hours(row.total),
        "totalGpuSeconds": str(row.total),
        "countedTo": timestamp(row.counted_to),
    }
    if row.budget is not None and row.budget_used is not None:
        data["budget"] = str(row.budget)
        data["budgetUsedGpuHours"] = _gpu_hours(row.budget_used)
        data["budgetUsedGpuSeconds"] = str(row.budget_used)
    return data


def write_csv(rows: list[UsageRow], *, since: int, now: int, headers: bool = True) -> None:
    """Print the rows as CSV: a header row (the json items' keys), then a row per item."""
    writer = csv.DictWriter(sys.stdout, fieldnames=CSV_FIELDS, restval="", lineterminator="\n")
    if headers:
        writer.writeheader()
    for row in rows:
        writer.writerow(to_json(row, since=since, now=now))


def table(rows: list[UsageRow], *, headers: bool = True) -> str:
    """Lay the rows out as kubectl does: a header, then a row per namespace and class; a
    record that cannot be read is its namespace and why."""
    from policies.quota.budget import hours
    from policies.quota.gpu_hours import timestamp

    shown: list[tuple[str, ...] | str] = []
    for row in rows:
        if row.error is not None:
            shown.append(f"error: {row.error}")
            continue
        shown.append(
            (
                row.namespace,
                row.class_name,
                hours(row.used),
                hours(row.total),
                timestamp(row.counted_to),
                "-" if row.budget is None else str(row.budget),
                "-" if row.budget_used is None else hours(row.budget_used),
            )
        )
    cells = [c for c in shown if isinstance(c, tuple)] + ([HEADER] if headers else [])
    widths = column_widths(cells, len(HEADER))
    widths[0] = max([widths[0], *(len(row.namespace) for row in rows)])
    lines = [line(HEADER, widths)] if headers else []
    for row, cells_or_error in zip(rows, shown, strict=True):
        if isinstance(cells_or_error, str):
            lines.append(line((row.namespace, cells_or_error), widths[:1]))
        else:
            lines.append(line(cells_or_error, widths))
    return "\n".join(lines)
