"""`gpuadm models`: the GPU models gpuadm knows, with what the hardware reports of each and
every stack's spelling of its name, to copy into a policy."""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from webhook.cli.columns import column_widths, line
from webhook.cli.exits import ExitCode

HEADERS = ("NAME", "MEMORY", "MIG PROFILES", "NODE LABEL (nvidia.com/gpu.product)")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpuadm models` to the command line."""
    models = sub.add_parser(
        "models",
        help="list the GPU models gpuadm knows: names, memory, MIG profiles, spellings",
        description="List the GPU models of gpuadm's catalogue by the name the driver "
        "reports (the name a class's `models` takes), with the memory NVML reports for it "
        "and its MIG profiles where they are known, and the spelling each stack uses. Exit 1 "
        "if no model matches the filter.",
    )
    models.add_argument(
        "filter",
        nargs="?",
        default="",
        help="list only the models whose name holds this text (any case), e.g. h100",
    )
    models.add_argument(
        "--output",
        "-o",
        choices=["text", "wide", "json", "yaml"],
        default="text",
        help="text (default), wide (with HAMi's and Volcano's spellings), json or yaml",
    )
    models.set_defaults(run=run)


def run(args: argparse.Namespace) -> ExitCode:
    """Print the models that match the filter."""
    from policies.classes.catalogue import GPU_NAMES
    from policies.classes.hardware import HARDWARE
    from policies.classes.models import gfd_product, hami_device_type, volcano_device_type

    wanted = args.filter.casefold()
    found = []
    for name in GPU_NAMES:
        if wanted not in name.casefold():
            continue
        known = HARDWARE.get(name)
        found.append(
            {
                "name": name,
                "memoryMiB": known.memory_mib if known else None,
                "migProfiles": [
                    {"name": p.name, "memoryMiB": p.memory_mib, "instances": p.instances}
                    for p in (known.mig if known else ())
                ],
                "spellings": {
                    "nodeLabel": gfd_product(name),
                    "hami": hami_device_type(name),
                    "volcano": volcano_device_type(name),
                    "dra": name,
                },
            }
        )
    if not found:
        print(f"no GPU model gpuadm knows has {args.filter!r} in its name")
        return ExitCode.REFUSED
    if args.output == "json":
        print(json.dumps({"models": found}, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump({"models": found}, sort_keys=False).rstrip())
    else:
        _table(found, wide=args.output == "wide")
    return ExitCode.OK


def _table(found: list[dict[str, Any]], *, wide: bool) -> None:
    headers: tuple[str, ...] = (*HEADERS, "HAMI TYPE", "VOLCANO TYPE") if wide else HEADERS
    rows: list[tuple[str, ...]] = [headers]
    for model in found:
        memory = f"{model['memoryMiB']}Mi" if model["memoryMiB"] else "-"
        profiles = ",".join(p["name"] for p in model["migProfiles"]) or "-"
        spellings = model["spellings"]
        row: tuple[str, ...] = (model["name"], memory, profiles, spellings["nodeLabel"])
        rows.append((*row, spellings["hami"], spellings["volcano"]) if wide else row)
    widths = column_widths(rows, len(headers))
    for row in rows:
        print(line(row, widths))
