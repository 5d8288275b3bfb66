"""`gpuadm review`: what gpuadm would do to a pod, offline, as the apiserver would see it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from webhook.cli import flags
from webhook.cli.exits import CommandError, ExitCode

if TYPE_CHECKING:
    from policies.workloads import PodSet
    from webhook.cli.admission_run import PodsToJudge
    from webhook.config.snapshot import ConfigSnapshot

# Admission, the core, the quota ledger and the event loop are imported when a review runs,
# so that building the command line (for --help, --version, or another command) does not load
# them.


class ManifestLoader(yaml.SafeLoader):
    """YAML read as kubectl reads a manifest before sending it as JSON: a timestamp such as
    2026-01-01, and a number in base 60 such as 12:30:00, stay the text they are written
    as, since JSON has no dates and kubectl's YAML no base 60."""


ManifestLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _number_unless_base_60(
    construct: Callable[[yaml.SafeLoader, yaml.ScalarNode], object],
) -> Callable[[yaml.SafeLoader, yaml.ScalarNode], object]:
    def constructor(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> object:
        text = loader.construct_scalar(node)
        return text if ":" in text else construct(loader, node)

    return constructor


for _tag, _construct in (
    ("tag:yaml.org,2002:int", yaml.SafeLoader.construct_yaml_int),
    ("tag:yaml.org,2002:float", yaml.SafeLoader.construct_yaml_float),
):
    ManifestLoader.add_constructor(_tag, _number_unless_base_60(_construct))


# Objects of one input at most, Lists' items counted, and the pod templates among them.
MAX_OBJECTS = 10_000
MAX_POD_SETS = 1000
# Values (scalars, mappings, lists) an input stands for, aliases written out, and how deep
# they nest: far beyond any manifest, far below what takes seconds to write out.
MAX_VALUES = 2_000_000
MAX_DEPTH = 100


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpuadm review` to the command line."""
    review = sub.add_parser(
        "review",
        help="show offline what gpuadm would do to a pod, or to the pods of a workload",
        description="Run each Pod, and each pod a workload's controller would make (as many "
        "as its replicas, parallelism or replica specs say), through gpuadm's admission as "
        "the apiserver would, one after the other, so that each meets the room the ones "
        "before it took. A file may hold several documents and Lists; every object that "
        "holds a pod template is judged, whatever its kind. Exit 0 if every pod would run, "
        "1 if one would be refused, 3 if none would be refused but one would wait in line.",
    )
    review.add_argument("pod", type=Path, help="a manifest (YAML or JSON); - for stdin")
    flags.add_config_files(review, otherwise="or --from-cluster")
    review.add_argument(
        "--from-cluster",
        action="store_true",
        help="judge against the cluster's own policy and quotas (gpuadm's ConfigMaps) and what "
        "each namespace already holds and reserves (its GPUQuota objects), instead of files",
    )
    flags.add_kubeconfig(review)
    flags.add_gpuadm_namespace(review, has_tenant=True)
    review.add_argument(
        "--namespace",
        "-n",
        type=flags.namespace_name,
        help="namespace to judge the pods in (default: the manifest's; one that names "
        "another is refused, as kubectl refuses it)",
    )
    review.add_argument(
        "--in-use",
        action="append",
        default=[],
        metavar="CLASS=GPUS",
        help="GPUs of a class the namespace already holds, to see whether the pod fits next "
        "to them (e.g. --in-use a100=3,t4=0.5; repeatable); with --from-cluster, more than "
        "the cluster shows",
    )
    review.add_argument(
        "--output",
        "-o",
        choices=["text", "wide", "json", "yaml"],
        default="text",
        help="text (default; wide is the same, which already shows the whole pod), json or yaml",
    )
    review.set_defaults(run=run)


def run(args: argparse.Namespace) -> ExitCode:
    """Print what gpuadm would do to each pod: verdict, warnings, patch and the stored pod;
    for a workload, how many of its pods would run, wait or be refused; then the totals."""
    import asyncio

    from webhook.cli.admission_run import MAX_CREATED, review_all
    from webhook.cli.config_files import load_documents

    if args.from_cluster == (args.policy is not None):
        raise CommandError("give either --policy (and --quotas) files or --from-cluster")
    if args.from_cluster and args.quotas is not None:
        raise CommandError("--from-cluster reads the quotas from the cluster: drop --quotas")
    cluster = _Cluster(args) if args.from_cluster else None
    config = cluster.config if cluster is not None else load_documents(args.policy, args.quotas)
    in_use = _in_use(args.in_use, config)
    try:
        text = sys.stdin.read() if str(args.pod) == "-" else args.pod.read_text()
        documents = [d for d in yaml.load_all(text, Loader=ManifestLoader) if d is not None]
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise CommandError(f"cannot read pod {args.pod}: {reason}") from None
    except RecursionError:
        raise CommandError(f"cannot read pod {args.pod}: it is nested too deep") from None
    _refuse_expansion(documents, args.pod)
    objects = _objects(documents, args.pod)
    found, not_judged = _pods_in(objects, args.pod, args.namespace or "default")
    if not found:
        raise CommandError(f"{args.pod} is not a Pod manifest, and holds no pod template")
    for judged in found:
        if args.namespace and judged.namespace and judged.namespace != args.namespace:
            # kubectl's words: a manifest of one namespace is never judged in another.
            raise CommandError(
                f"the namespace from the provided object {judged.namespace!r} does not match "
                f"the namespace {args.namespace!r}: give -n {judged.namespace}, or no -n"
            )
        judged.namespace = str(args.namespace or judged.namespace or "default")
        # The apiserver stores a pod in the namespace it is created in.
        judged.pod["metadata"]["namespace"] = judged.namespace
    held = {
        namespace: in_use if cluster is None else _added(in_use, cluster.held(namespace))
        for namespace in dict.fromkeys(str(judged.namespace) for judged in found)
    }
    results, totals = asyncio.run(review_all(found, config, held))
    several = len(results) > 1
    if several or not_judged:
        for judged, result in zip(found, results, strict=True):
            result["object"] = judged.pod_set.label
        shown: dict[str, Any] = {"items": results, "totals": totals, "notJudged": not_judged}
    else:
        shown = {**results[0], "totals": totals}
    if args.output == "json":
        print(json.dumps(shown, indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(shown, sort_keys=False).rstrip())
    else:
        for result in results:
            if several:
                print(f"--- {result['object']}")
            _print(result)
        _print_totals(totals, not_judged, several=several)
    unjudged = sum(result["workload"]["notJudged"] for result in results)
    if unjudged:
        raise CommandError(
            f"{unjudged} pods of the input were not judged: a review creates "
            f"{MAX_CREATED} pods at most; review the workloads in parts"
        )
    # A template refused as it stands is refused too, even of a workload scaled to 0.
    if any(not result["allowed"] or result["workload"]["refused"] for result in results):
        return ExitCode.REFUSED
    return ExitCode.WAITS if any(r["workload"]["waiting"] for r in results) else ExitCode.OK


def _refuse_expansion(documents: list[Any], path: Path) -> None:
    """Refuse documents whose YAML aliases make them stand for more than `MAX_VALUES`
    values: each is written out as JSON, aliases and all, as kubectl would send it. Each
    object is counted once, however many aliases name it."""
    sizes: dict[int, int] = {}

    def size(value: Any, depth: int) -> int:
        if not isinstance(value, (dict, list)):
            return 1
        if id(value) in sizes:
            return sizes[id(value)]
        if depth > MAX_DEPTH:
            raise CommandError(f"{path} is nested more than {MAX_DEPTH} levels deep")
        items = value.values() if isinstance(value, dict) else value
        total = 1 + sum(size(item, depth + 1) for item in items)
        sizes[id(value)] = total
        return total

    if sum(size(document, 0) for document in documents) > MAX_VALUES:
        raise CommandError(
            f"{path} stands for more than {MAX_VALUES} values once its YAML aliases are "
            "written out: review it in parts"
        )


def _objects(documents: list[Any], path: Path) -> list[dict[str, Any]]:
    """Return the objects of the documents: each one, or each item of a List, at most
    `MAX_OBJECTS` (YAML aliases can make a few lines stand for millions)."""
    found: list[dict[str, Any]] = []
    pending = list(reversed(documents))
    while pending:
        document = pending.pop()
        if not isinstance(document, dict):
            raise CommandError(f"{path} is not a Pod manifest")
        kind = document.get("kind", "Pod")
        if isinstance(document.get("items"), list) and str(kind).endswith("List"):
            pending += reversed(document["items"])
        elif not isinstance(document.get("metadata") or {}, dict):
            raise CommandError(f"{path}: metadata is not a mapping")
        else:
            found.append(document)
        if len(found) + len(pending) > MAX_OBJECTS:
            raise CommandError(f"{path} holds more than {MAX_OBJECTS} objects: review it in parts")
    return found


def _pods_in(
    objects: list[dict[str, Any]], path: Path, default_namespace: str
) -> tuple[list[PodsToJudge], list[str]]:
    """Return the pod sets of every object, each with its pod; and the objects that make no
    pod (a Service, a ConfigMap), by kind and name. The PodGroups among the objects give
    their groups' sizes, each to the pods of its own namespace."""
    from policies.workloads import GangError, min_member, pod_group_key, pod_sets
    from webhook.cli.admission_run import PodsToJudge

    def namespace_of(document: dict[str, Any]) -> str:
        namespace = (document.get("metadata") or {}).get("namespace")
        return namespace if isinstance(namespace, str) and namespace else default_namespace

    try:
        groups: dict[str, dict[tuple[str, str], int]] = {}
        for document in objects:
            if (key := pod_group_key(document)) is not None:
                groups.setdefault(namespace_of(document), {})[key] = min_member(document)
        found: list[PodsToJudge] = []
        not_judged: list[str] = []
        for document in objects:
            metadata = document.get("metadata") or {}
            namespace = metadata.get("namespace")
            sets = pod_sets(document, groups.get(namespace_of(document), {}))
            if not sets and pod_group_key(document) is None:
                name = metadata.get("name") or metadata.get("generateName") or ""
                not_judged.append(f"{document.get('kind', 'Pod')}/{name}")
            if len(found) + len(sets) > MAX_POD_SETS:
                raise CommandError(
                    f"{path} holds more than {MAX_POD_SETS} pod templates: review it in parts"
                )
            for pod_set in sets:
                pod = _pod_of(pod_set, path)
                found.append(
                    PodsToJudge(pod_set, pod, namespace if isinstance(namespace, str) else None)
                )
    except GangError as error:
        raise CommandError(f"{path}: {error}") from None
    return found, not_judged


def _pod_of(pod_set: PodSet, path: Path) -> dict[str, Any]:
    """Return the pod a pod set stands for: a Pod as written, or the pod a controller makes
    of the template (the template's metadata and spec, named after the workload)."""
    if pod_set.kind == "Pod":
        pod = _as_json(dict(pod_set.template), path)
    else:
        template_metadata = pod_set.template.get("metadata") or {}
        if not isinstance(template_metadata, dict):
            raise CommandError(f"{path}: {pod_set.label}: the template's metadata is not a mapping")
        pod = _as_json(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": f"{pod_set.name}-", **template_metadata},
                "spec": pod_set.template.get("spec"),
            },
            path,
        )
    pod_metadata = pod.get("metadata") or {}
    if not isinstance(pod_metadata, dict):
        raise CommandError(f"{path}: metadata is not a mapping")
    # The apiserver gives every object its metadata before any webhook sees it.
    pod["metadata"] = pod_metadata
    return pod


def _as_json(document: dict[str, Any], path: Path) -> dict[str, Any]:
    try:
        # As kubectl sends it: keys as text (a key 1 is "1"), and no value JSON has no form
        # for (an explicit tag such as !!binary or !!set, .nan, .inf).
        pod: dict[str, Any] = json.loads(json.dumps(document, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise CommandError(f"{path} holds a value JSON cannot carry: {error}") from None
    return pod


class _Cluster:
    """The cluster as `--from-cluster` reads it: gpuadm's config, and per namespace what
    its GPUQuota objects say it holds and reserves, as the webhook counts it."""

    def __init__(self, args: argparse.Namespace) -> None:
        from webhook.cli.cluster import TENANT_GRANT, call, cluster_api, cluster_config
        from webhook.kube.errors import KubeError
        from webhook.kube.rest import GPUADM_API

        self._call = call
        try:
            self._api = cluster_api(args)
            self.config = call(
                self._api,
                cluster_config(self._api, args.gpuadm_namespace, when_forbidden=TENANT_GRANT),
            )
            # Without the CRD every GPUQuota reads as absent: no reading of what is held.
            if not call(self._api, self._api.serves_quota_api()):
                raise CommandError(
                    f"the cluster serves no GPUQuota API ({GPUADM_API.removeprefix('/apis/')}): "
                    "what namespaces hold cannot be read; install gpuadm's CRD "
                    "(docs/operations.md)"
                )
        except KubeError as error:
            raise CommandError(str(error)) from None
        self._held: dict[str, dict[str, Fraction]] = {}

    def held(self, namespace: str) -> dict[str, Fraction]:
        """Return the GPUs per class the namespace holds or has reserved now."""
        from webhook.kube.errors import KubeError

        if namespace not in self._held:
            try:
                self._held[namespace] = self._call(self._api, self._read(namespace))
            except KubeError as error:
                raise CommandError(
                    f"cannot read the GPUQuota objects of namespace {namespace}: {error}"
                ) from None
        return self._held[namespace]

    async def _read(self, namespace: str) -> dict[str, Fraction]:
        from policies.quantity import QuantityError, parse_quantity

        held: dict[str, Fraction] = {}
        for class_name in self.config.policy.classes:
            found = await self._api.get_quota_status(namespace, class_name)
            status = (found or {}).get("status") or {}
            try:
                gpus = parse_quantity(str(status.get("inUse") or 0)) + parse_quantity(
                    str(status.get("reserved") or 0)
                )
            except QuantityError as error:
                raise CommandError(
                    f"GPUQuota {namespace}/{class_name} says what gpuadm never writes: {error}"
                ) from None
            if gpus:
                held[class_name] = gpus
        return held


def _added(one: dict[str, Fraction], other: dict[str, Fraction]) -> dict[str, Fraction]:
    return {
        name: one.get(name, Fraction(0)) + other.get(name, Fraction(0)) for name in {*one, *other}
    }


def _in_use(values: list[str], config: ConfigSnapshot) -> dict[str, Fraction]:
    """Parse --in-use CLASS=GPUS[,CLASS=GPUS...] against the policy's classes."""
    from policies.quantity import QuantityError, parse_quantity
    from policies.suggest import suggestion

    in_use: dict[str, Fraction] = {}
    for item in (part.strip() for value in values for part in value.split(",")):
        if not item:
            continue
        class_name, _, amount = item.partition("=")
        if class_name not in config.policy.classes:
            known = ", ".join(config.policy.classes)
            raise CommandError(
                f"--in-use {item}: no class {class_name!r} in the policy "
                f"(classes: {known}){suggestion(class_name, config.policy.classes)}"
            )
        try:
            gpus = parse_quantity(amount)
        except QuantityError as error:
            raise CommandError(f"--in-use {item}: {error}") from None
        if gpus < 0:
            raise CommandError(f"--in-use {item}: a number of GPUs is 0 or more")
        in_use[class_name] = in_use.get(class_name, Fraction(0)) + gpus
    return in_use


def _print(result: dict[str, Any]) -> None:
    verdict = "allowed" if result["allowed"] else "denied"
    print(f"verdict: {verdict} (namespace {result['namespace']})")
    if result.get("demand"):
        print(f"demand: {result['demand']}" + (" each" if result["workload"]["pods"] != 1 else ""))
    print(f"pods: {result['workload']['summary']}")
    if result["reason"]:
        print(f"reason: {result['reason']}")
    for warning in result["warnings"]:
        print(f"warning: {warning}")
    if not result["allowed"]:
        return
    if result["patch"]:
        print("patch:")
        print(_indent(yaml.safe_dump(result["patch"], sort_keys=False)))
        print("pod after admission:")
        print(_indent(yaml.safe_dump(result["pod"], sort_keys=False)))
        for template in result.get("claimTemplates") or ():
            print("ResourceClaimTemplate gpuadm makes in the namespace, if it is missing:")
            print(_indent(yaml.safe_dump(template, sort_keys=False)))
    else:
        print("patch: none (the pod is stored as written)")


def _print_totals(totals: list[dict[str, Any]], not_judged: list[str], *, several: bool) -> None:
    """Print what the pods add up to per namespace and class, and what becomes of each gang;
    then the objects that make no pod."""
    workload = [t for t in totals if t["pods"] != 1 or "gang" in t] if not several else totals
    if workload:
        print("totals:" if several else "workload:")
        for total in workload:
            print(f"  {total['summary']}")
    if not_judged:
        print(f"not judged (they make no pod): {', '.join(not_judged)}")


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.rstrip().splitlines())
