"""`gpuadm check-config`: validate policy and quota files, ConfigMaps, rendered manifests
and Helm values, as `gpuadm serve` would read them.

What a file holds is known by how it is given (`--policy`, `--quotas`), by the ConfigMap key
it sits under, or by the file's name. Only a file whose name says neither is read by its
keys, as the kind they match best, and the check says so.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import yaml

from webhook.cli import flags
from webhook.cli.exits import CommandError, ExitCode

if TYPE_CHECKING:
    from policies.cluster_fit import ClusterFit, GpuNode

M = TypeVar("M")

# The config models (the policies package) are imported when a check runs, so that
# building the command line (for --help, --version, or another command) does not build them.

Kind = Literal["policy", "quotas"]
# What `gpuadm serve` reads in a cluster: these keys of these ConfigMaps, and nothing else.
CONFIG_MAPS: dict[Kind, tuple[str, str]] = {
    "policy": ("gpuadm-policy", "policy.yaml"),
    "quotas": ("gpuadm-quotas", "quotas.yaml"),
}
# An object Helm makes for a hook only: not what the release installs.
HELM_HOOK = "helm.sh/hook"


def _keys(kind: Kind) -> frozenset[str]:
    """The top-level keys of a policy or a quota config, as the file spells them."""
    from policies import Policy, QuotaConfig

    model = Policy if kind == "policy" else QuotaConfig
    return frozenset(f.alias or n for n, f in model.model_fields.items())


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpuadm check-config` to the command line."""
    check = sub.add_parser(
        "check-config",
        help="validate policy and quota files, ConfigMaps, rendered manifests or Helm values",
        description="Validate gpuadm's config as `gpuadm serve` reads it. A file is a policy or "
        "quotas by its name (policy*.yaml, quota*.yaml), by its ConfigMap key, or by "
        "--policy/--quotas; values*.yaml is a Helm values file; - reads stdin "
        "(e.g. `helm template ... | gpuadm check-config -`).",
    )
    check.add_argument("files", nargs="*", help="files to check; - for stdin")
    check.add_argument("--policy", action="append", default=[], help="a policy file")
    check.add_argument("--quotas", action="append", default=[], help="a quotas file")
    check.add_argument(
        "--from-cluster",
        action="store_true",
        help="check against the cluster: its GPU nodes (GPU Feature Discovery's labels, HAMi's "
        "registrations, the MIG profiles they advertise), and, when no file is given, "
        "gpuadm's own ConfigMaps",
    )
    flags.add_kubeconfig(check)
    flags.add_gpuadm_namespace(check, has_tenant=True)
    check.add_argument(
        "-o",
        "--output",
        choices=["text", "wide", "json", "yaml"],
        default="text",
        help="text (default; wide is the same), or json or yaml: the problems, warnings and "
        "notes as lists",
    )
    check.set_defaults(run=run)


@dataclass(frozen=True)
class Part:
    """One config found in a file: its kind, where it is, and its text."""

    kind: Kind
    source: str
    text: str
    first_line: int


@dataclass
class Findings:
    """What reading the files found: configs, problems, warnings and notes."""

    parts: list[Part]
    problems: list[str]
    warnings: list[str]
    notes: list[str]


def _within_budget(load: Callable[..., M], part: Part) -> M:
    """Load one part as `serve` does: within the read budget of a config."""
    from webhook.config.read_budget import read_within_blocking

    return read_within_blocking(
        lambda: load(part.text, source=part.source, first_line=part.first_line),
        source=part.source,
    )


def run(args: argparse.Namespace) -> ExitCode:
    """Validate each file; print every problem, or a line saying all is well.

    Warnings (a valid config that may not do what its author meant) do not fail the check.
    """
    from policies import ConfigError, Policy, QuotaConfig, load_policy, load_quotas, policy_warnings
    from policies.cluster_fit import cluster_fit
    from policies.config_advice import quota_warnings
    from policies.loading import line_of
    from policies.policy import exemption_warnings, routing_warnings
    from policies.quantity import format_memory

    given: list[tuple[str, Kind | None]] = [
        *((name, "policy") for name in args.policy),
        *((name, "quotas") for name in args.quotas),
        *((name, None) for name in args.files),
    ]
    if not given and not args.from_cluster:
        raise CommandError("give the files to check (or - for stdin), or --from-cluster")
    found = Findings([], [], [], [])
    for name, kind in given:
        _read(name, _text_of(name), kind, found)
    nodes = _from_cluster(args, found, read_config=not given) if args.from_cluster else None
    policies: list[tuple[Part, Policy]] = []
    quotas: list[tuple[Part, QuotaConfig]] = []
    for part in found.parts:
        try:
            if part.kind == "policy":
                policies.append((part, _within_budget(load_policy, part)))
            else:
                quotas.append((part, _within_budget(load_quotas, part)))
        except ConfigError as error:
            found.problems += error.problems
    for policy_part, policy in policies:
        for part, quota in quotas:
            for path, problem in quota.unknown_class_paths(policy):
                line = line_of(part.text, path, first_line=part.first_line) or part.first_line
                found.problems.append(
                    f"{part.source}:{line}: {'.'.join(path)}: {problem} ({policy_part.source})"
                )
            for path, warning in quota_warnings(quota, policy):
                line = line_of(part.text, path, first_line=part.first_line) or part.first_line
                found.warnings.append(f"{part.source}:{line}: {'.'.join(path)}: {warning}")
        for name, gpu_class in policy.classes.items():
            if gpu_class.memory_source is not None and gpu_class.memory is not None:
                chosen = (
                    f"class {name}: no `memory` given: it is {format_memory(gpu_class.memory)}, "
                    f"what {gpu_class.memory_source} reports (the least of the class's models)"
                )
                found.notes.append(f"{_at(policy_part, chosen)}: {chosen}")
        for warning in [
            *policy_warnings(policy),
            *routing_warnings(policy),
            *exemption_warnings(policy),
        ]:
            found.warnings.append(f"{_at(policy_part, warning)}: {warning}")
    if quotas and not policies:
        found.notes.append(
            "no policy given: the quotas' class names, and what each class is charged, were "
            "not checked; give the policy too (--policy) to check them"
        )
    fits = []
    for policy_part, policy in policies if nodes is not None else ():
        fit = cluster_fit(policy, nodes or [])
        fits.append(fit)
        found.warnings += [f"{policy_part.source}: nodes: {finding}" for finding in fit.findings]
    valid = bool(found.parts) and not found.problems
    if args.output in ("json", "yaml"):
        result = {
            "valid": valid,
            "policies": [part.source for part, _ in policies],
            "quotas": [part.source for part, _ in quotas],
            "problems": found.problems,
            "warnings": found.warnings,
            "notes": found.notes,
        }
        if nodes is not None:
            result["cluster"] = [
                {"nodes": len(nodes), "byClass": fit.by_class, "byModel": fit.by_model}
                for fit in fits
            ]
        if args.output == "json":
            print(json.dumps(result, indent=2))
        else:
            print(yaml.safe_dump(result, sort_keys=False).rstrip())
        return ExitCode.OK if valid else ExitCode.REFUSED
    for fit in fits:
        _print_fit(fit)
    for note in found.notes:
        print(f"note: {note}")
    for problem in found.problems:
        print(problem)
    for warning in found.warnings:
        print(f"warning: {warning}")
    if found.problems:
        return ExitCode.REFUSED
    if not found.parts:
        print("no policy or quotas found: nothing was checked")
        return ExitCode.REFUSED
    print(f"ok: {len(policies)} policy and {len(quotas)} quota config(s) are valid")
    return ExitCode.OK


def _from_cluster(args: argparse.Namespace, found: Findings, *, read_config: bool) -> list[GpuNode]:
    """Read the cluster's GPU nodes, page by page, keeping of each what its stacks say of its
    GPUs; with `read_config`, add gpuadm's ConfigMaps to the configs to check."""
    from policies.cluster_fit import gpu_node
    from webhook.cli.cluster import call, cluster_api
    from webhook.config.configmap_source import POLICY_KEY, POLICY_MAP, QUOTAS_KEY, QUOTAS_MAP
    from webhook.kube.errors import KubeError

    namespace = args.gpuadm_namespace
    wanted: tuple[tuple[str, Kind, str], ...] = (
        (POLICY_MAP, "policy", POLICY_KEY),
        (QUOTAS_MAP, "quotas", QUOTAS_KEY),
    )

    async def read() -> tuple[dict[str, Any], list[GpuNode]]:
        maps = {}
        if read_config:
            maps = {name: await api.get_configmap(namespace, name) for name, _, _ in wanted}
        nodes = []
        async for page in api.list_pages("/api/v1/nodes"):
            nodes += [node for node in map(gpu_node, page.items) if node is not None]
        return maps, nodes

    try:
        api = cluster_api(args)
        maps, nodes = call(api, read())
    except KubeError as error:
        raise CommandError(str(error)) from None
    for name, kind, key in wanted if read_config else ():
        data = (maps.get(name) or {}).get("data") or {}
        source = f"configmap {namespace}/{name}"
        if key in data:
            found.parts.append(Part(kind, source, str(data[key]), 1))
        else:
            found.problems.append(
                f"{source}: no key {key}" if maps.get(name) else f"{source}: not found"
            )
    return nodes


def _print_fit(fit: ClusterFit) -> None:
    """Print which nodes each class reaches, and each GPU model's nodes, as tables."""
    from webhook.cli.columns import column_widths, line

    rows: list[tuple[str, ...]] = [("CLASS", "NODES")]
    rows += [(name, str(len(nodes))) for name, nodes in fit.by_class.items()]
    widths = column_widths(rows, 2)
    for row in rows:
        print(line(row, widths))
    print()
    models: list[tuple[str, ...]] = [
        ("GPU MODEL (nvidia.com/gpu.product)", "NODES", "GPUS", "MEMORY", "CLASSES")
    ]
    for model, entry in sorted(fit.by_model.items()):
        memory = f"{entry['memoryMiB']}Mi" if entry["memoryMiB"] else "-"
        classes = ",".join(entry["classes"]) or "-"
        models.append((model, str(len(entry["nodes"])), str(entry["gpus"]), memory, classes))
    widths = column_widths(models, 5)
    for row in models:
        print(line(row, widths))
    print()


def part_of(name: str, kind: Kind) -> Part:
    """Return the one config of `kind` a file holds, as this check finds it (the config
    itself, or a ConfigMap manifest of gpuadm's holding it); raise `CommandError` if it
    holds none, several, or a ConfigMap gpuadm would not read."""
    found = Findings([], [], [], [])
    _read(name, _text_of(name), kind, found)
    parts = [part for part in found.parts if part.kind == kind]
    if found.problems:
        raise CommandError(f"{name}:\n  " + "\n  ".join(found.problems))
    if len(parts) != 1:
        held = "no" if not parts else f"{len(parts)}"
        raise CommandError(f"{name} holds {held} {kind} configs: give a file that holds one")
    return parts[0]


def _at(part: Part, warning: str) -> str:
    """Where a policy warning points: the line of the class it names, else the file."""
    from policies.loading import line_of

    named = re.match(r"class ([a-z0-9-]+)\b", warning)
    path = ["classes", named.group(1)] if named else warning.split(":", 1)[:1]
    line = line_of(part.text, path, first_line=part.first_line)
    return part.source if line is None else f"{part.source}:{line}"


def _text_of(name: str) -> str:
    try:
        return sys.stdin.read() if name == "-" else Path(name).read_text()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise CommandError(f"cannot read {name}: {reason}") from None


def _kind_by_name(name: str) -> Kind | Literal["values"] | None:
    stem = Path(name).name.lower()
    says = [kind for kind, word in (("policy", "polic"), ("quotas", "quota")) if word in stem]
    if len(says) == 1:
        return says[0]  # type: ignore[return-value]
    return "values" if stem.startswith("values") else None


def _read(name: str, text: str, kind: Kind | None, found: Findings) -> None:
    """Find the configs of one file, however it holds them."""
    source = "(stdin)" if name == "-" else name
    try:
        documents = [d for d in yaml.compose_all(text, Loader=yaml.SafeLoader) if not _null(d)]
    except (yaml.YAMLError, RecursionError):
        # Not YAML, or not one the reader takes apart: the loader says where and why.
        documents = []
        what = kind or _kind_by_name(name)
        found.parts.append(
            Part(what if what in ("policy", "quotas") else "policy", source, text, 1)
        )
        return
    if not documents:
        what = kind or _kind_by_name(name)
        if what in ("policy", "quotas"):
            found.parts.append(Part(what, source, text, 1))
        else:
            found.problems.append(f"{source}:1: the file is empty: neither a policy nor quotas")
        return
    single = len(documents) == 1
    for document in documents:
        _document(source, name, text, document, kind, single, found)


def _document(
    source: str,
    name: str,
    text: str,
    node: yaml.Node,
    kind: Kind | None,
    single: bool,
    found: Findings,
) -> None:
    keys = _scalar_keys(node)
    manifest_kind = keys.get("kind")
    if isinstance(manifest_kind, yaml.ScalarNode) and "apiVersion" in keys:
        if manifest_kind.value == "ConfigMap":
            _config_map(source, text, node, found)
        elif manifest_kind.value == "List":
            items = keys.get("items")
            for item in items.value if isinstance(items, yaml.SequenceNode) else []:
                _document(source, name, text, item, kind, False, found)
        return  # another object of a rendered manifest: not gpuadm's config
    whole = text if single else _block(text, node)
    first = 1 if single else node.start_mark.line + 1
    if kind is not None:
        found.parts.append(Part(kind, source, whole, first))
        return
    by_name = _kind_by_name(name)
    if by_name == "values" or (by_name is None and _looks_like_values(keys)):
        _values(source, text, keys, found)
        return
    if by_name is not None:
        found.parts.append(Part(by_name, source, whole, first))
        return
    guessed = _guess(keys)
    found.notes.append(
        f"{source}: its name says neither policy nor quotas; read as {guessed}, whose keys "
        f"it matches best (name it {guessed}.yaml, or give --{guessed} {name})"
    )
    found.parts.append(Part(guessed, source, whole, first))


def _config_map(source: str, text: str, node: yaml.Node, found: Findings) -> None:
    """Check a ConfigMap as `serve` reads it: only its name's one key counts."""
    from policies.suggest import suggestion

    keys = _scalar_keys(node)
    metadata = _scalar_keys(keys.get("metadata"))
    if HELM_HOOK in _scalar_keys(metadata.get("annotations")):
        return  # a Helm hook's (the chart's config check holds a copy): never what serve reads
    name = metadata.get("name")
    map_name = name.value if isinstance(name, yaml.ScalarNode) else ""
    data = keys.get("data")
    entries = data.value if isinstance(data, yaml.MappingNode) else []
    by_map = {m: kind for kind, (m, _) in CONFIG_MAPS.items()}
    by_key = {k: kind for kind, (_, k) in CONFIG_MAPS.items()}
    if map_name not in by_map and not any(str(k.value) in by_key for k, _ in entries):
        return  # another ConfigMap of a rendered manifest (the dashboard, ...)
    if map_name not in by_map:
        # Its keys are gpuadm's, its name is not: serve never reads it.
        line = (name.start_mark.line + 1) if isinstance(name, yaml.ScalarNode) else 1
        wanted = sorted(
            CONFIG_MAPS[by_key[str(k.value)]][0] for k, _ in entries if str(k.value) in by_key
        )
        found.problems.append(
            f"{source}:{line}: metadata.name: gpuadm reads only the ConfigMaps "
            f"{' and '.join(m for m, _ in CONFIG_MAPS.values())} in its namespace, so "
            f"{map_name or 'this ConfigMap'} is never read{suggestion(map_name, wanted)}"
        )
    for key_node, value in entries:
        key = str(key_node.value)
        line = key_node.start_mark.line + 1
        where = source
        kind = by_map.get(map_name) or by_key.get(key)
        expected = CONFIG_MAPS[kind][1] if kind else ""
        if kind is None or key != expected:
            wanted = sorted(by_key) if kind is None else [expected]
            found.problems.append(
                f"{where}:{line}: data.{key}: gpuadm reads only "
                + " and ".join(f"`{k}` from ConfigMap {CONFIG_MAPS[by_key[k]][0]}" for k in wanted)
                + f", so this key is never read{suggestion(key, wanted)}"
            )
            kind = kind or by_key.get(_closest(key, by_key)) or "policy"
        if not isinstance(value, yaml.ScalarNode):
            found.problems.append(f"{where}:{line}: data.{key}: a ConfigMap's data is text")
            continue
        block = value.style in ("|", ">")
        first = value.start_mark.line + 2 if block else line
        found.parts.append(Part(kind, source, value.value, first))


def _values(source: str, text: str, keys: dict[str, yaml.Node], found: Findings) -> None:
    """Check the `policy` and `quotas` of a Helm values file, at their lines in it: each
    given as its keys, or as its text (`policy: |`), which the chart installs as it is."""
    kinds: tuple[Kind, ...] = ("policy", "quotas")
    for kind in kinds:
        node = keys.get(kind)
        if node is None or _null(node):
            continue
        if isinstance(node, yaml.ScalarNode):
            block = node.style in ("|", ">")
            first = node.start_mark.line + (2 if block else 1)
            found.parts.append(Part(kind, source, node.value, first))
            continue
        first = node.start_mark.line + 1
        found.parts.append(Part(kind, source, _block(text, node), first))
    if "policy" not in keys and "quotas" not in keys:
        found.problems.append(f"{source}:1: a values file without `policy` or `quotas`")


def _block(text: str, node: yaml.Node) -> str:
    """Return a nested mapping's own lines, shifted left to be a document of their own."""
    lines = text.splitlines()
    start, end = node.start_mark.line, node.end_mark.line
    if node.end_mark.column > 0:
        end += 1
    column = node.start_mark.column
    out = []
    for line in lines[start:end]:
        body = line.lstrip(" ")
        if not body or body.startswith("#"):
            out.append("")
        elif len(line) - len(body) >= column:
            out.append(line[column:])
        else:
            break
    # The first line may start mid-line (`policy: {a: 1}`): keep only the node's part.
    if out and start < len(lines) and len(lines[start]) - len(lines[start].lstrip(" ")) < column:
        out[0] = lines[start][column:]
    return "\n".join(out) + "\n"


def _scalar_keys(node: yaml.Node | None) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {str(k.value): v for k, v in node.value if isinstance(k, yaml.ScalarNode)}


def _looks_like_values(keys: dict[str, yaml.Node]) -> bool:
    given = [keys.get(k) for k in ("policy", "quotas")]
    return any(
        isinstance(node, yaml.MappingNode)
        or (isinstance(node, yaml.ScalarNode) and not _null(node))
        for node in given
    ) and not (keys.keys() & (_keys("policy") | _keys("quotas")))


def _guess(keys: dict[str, yaml.Node]) -> Kind:
    """The kind whose keys a mapping's keys match best: exact matches, then near ones."""
    from policies.suggest import suggestion

    def score(kind: Kind) -> tuple[int, int]:
        known = _keys(kind)
        exact = sum(1 for key in keys if key in known)
        near = sum(1 for key in keys if key not in known and suggestion(key, known))
        return exact, near

    return "quotas" if score("quotas") > score("policy") else "policy"


def _closest(key: str, choices: dict[str, Kind]) -> str:
    from policies.suggest import suggestion

    for choice in choices:
        if suggestion(key, [choice]) or key.split(".")[0] in choice:
            return choice
    return ""


def _null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"
