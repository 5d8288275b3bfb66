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
    from webhook.config.snapshot import ConfigSnapshot
    from webhook.reviews.request import AdmissionRequest

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


# Where each workload kind keeps the template of its pods.
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "PodTemplate": ("template",),
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpuadm review` to the command line."""
    review = sub.add_parser(
        "review",
        help="show offline what gpuadm would do to a pod, or to the pods of a workload",
        description="Run each Pod, or each pod template of a Deployment, StatefulSet, "
        "ReplicaSet, DaemonSet, Job or CronJob, through gpuadm's admission as the apiserver "
        "would. A file may hold several documents and Lists. Exit 0 if every pod would be "
        "admitted, 1 if one would be denied.",
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
    """Print what gpuadm would do to each pod: verdict, warnings, patch and the stored pod."""
    import asyncio

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
    pods = [found for document in documents for found in _pods_of(document, args.pod)]
    if not pods:
        raise CommandError(f"{args.pod} is not a Pod manifest, and holds no pod template")
    results = []
    for label, pod, namespace in pods:
        if args.namespace and namespace and namespace != args.namespace:
            # kubectl's words: a manifest of one namespace is never judged in another.
            raise CommandError(
                f"the namespace from the provided object {namespace!r} does not match the "
                f"namespace {args.namespace!r}: give -n {namespace}, or no -n"
            )
        namespace = str(args.namespace or namespace or "default")
        # The apiserver stores a pod in the namespace it is created in.
        pod["metadata"]["namespace"] = namespace
        held = in_use if cluster is None else _added(in_use, cluster.held(namespace))
        result = asyncio.run(simulate_admission(pod, namespace, config, in_use=held))
        results.append({"object": label, **result} if len(pods) > 1 else result)
    if args.output == "json":
        print(json.dumps(results[0] if len(results) == 1 else {"items": results}, indent=2))
    elif args.output == "yaml":
        shown = results[0] if len(results) == 1 else {"items": results}
        print(yaml.safe_dump(shown, sort_keys=False).rstrip())
    else:
        for result in results:
            if len(results) > 1:
                print(f"--- {result['object']}")
            _print(result)
    return ExitCode.OK if all(r["allowed"] for r in results) else ExitCode.REFUSED


def _pods_of(document: Any, path: Path) -> list[tuple[str, dict[str, Any], str | None]]:
    """Return (label, pod, namespace) for each pod a document stands for: a Pod, the pod
    template of a workload, or each item of a List."""
    if not isinstance(document, dict):
        raise CommandError(f"{path} is not a Pod manifest")
    kind = document.get("kind", "Pod")
    if isinstance(document.get("items"), list) and str(kind).endswith("List"):
        return [found for item in document["items"] for found in _pods_of(item, path)]
    metadata = document.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise CommandError(f"{path}: metadata is not a mapping")
    name = metadata.get("name") or metadata.get("generateName") or ""
    namespace = metadata.get("namespace")
    if kind == "Pod":
        pod = _as_json(document, path)
        label = f"Pod/{name}"
    elif kind in TEMPLATE_PATHS:
        template: Any = document
        for key in TEMPLATE_PATHS[kind]:
            template = template.get(key) if isinstance(template, dict) else None
        if not isinstance(template, dict):
            raise CommandError(f"{path}: {kind}/{name} has no pod template")
        template_metadata = template.get("metadata") or {}
        if not isinstance(template_metadata, dict):
            raise CommandError(f"{path}: {kind}/{name}: the template's metadata is not a mapping")
        # The pod its controller creates: the template's metadata and spec, named after it.
        pod = _as_json(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": f"{name}-", **template_metadata},
                "spec": template.get("spec"),
            },
            path,
        )
        label = f"{kind}/{name}"
    else:
        return []  # a Service, a ConfigMap...: nothing gpuadm admits
    pod_metadata = pod.get("metadata") or {}
    if not isinstance(pod_metadata, dict):
        raise CommandError(f"{path}: metadata is not a mapping")
    # The apiserver gives every object its metadata before any webhook sees it.
    pod["metadata"] = pod_metadata
    return [(label, pod, namespace if isinstance(namespace, str) else None)]


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
        from webhook.cli.cluster import call, cluster_api, cluster_config
        from webhook.kube.errors import KubeError

        self._call = call
        try:
            self._api = cluster_api(args)
            self.config = call(self._api, cluster_config(self._api, args.gpuadm_namespace))
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


async def simulate_admission(
    pod: dict[str, Any],
    namespace: str,
    config: ConfigSnapshot,
    *,
    in_use: dict[str, Fraction] | None = None,
) -> dict[str, Any]:
    """Run the pod through /mutate then /validate, as the apiserver would."""
    import jsonpatch

    from policies import Denial, pod_charge
    from policies.quantity import format_amount
    from webhook.admission.decisions import Trusted, mutate_under, validate_under
    from webhook.claims.lookup import NoClaims
    from webhook.claims.templates import LABELS, NoTemplates
    from webhook.quota.ledger import QuotaLedger
    from webhook.quota.reservations import MemoryStore
    from webhook.quota.usage import UsageIndex

    # A fresh ledger: the namespace holds what --in-use says, as pods the usage index sees.
    usage = UsageIndex()
    for class_name, gpus in (in_use or {}).items():
        # As pods would hold them: whole GPUs in one, a share of one in another.
        for index, part in enumerate((Fraction(int(gpus)), gpus - int(gpus))):
            if part:
                holder = _holder(namespace, class_name, part, config.policy.domain, index)
                try:
                    pod_charge(holder, config.policy, namespace_default_class=None)
                except Denial as denial:
                    raise CommandError(
                        f"--in-use {class_name}={format_amount(gpus)}: no pod can hold that: "
                        f"{denial.message}"
                    ) from None
                usage.observe(holder, config.policy, config.quotas, now=0.0)
    ledger = QuotaLedger(usage, MemoryStore(), pods_visible=False)
    # A review is a dry run: nothing is made, and the templates are shown instead.
    mutated = await mutate_under(
        _request(pod, namespace), config, templates=NoTemplates(), quota=ledger
    )
    result: dict[str, Any] = {
        "namespace": namespace,
        "allowed": mutated.outcome != "denied",
        "reason": mutated.reason,
        "warnings": list(mutated.warnings),
        "patch": mutated.patch,
        "pod": pod,
    }
    if not result["allowed"]:
        return result
    stored = jsonpatch.apply_patch(pod, mutated.patch) if mutated.patch else pod
    validated = await validate_under(
        _request(stored, namespace), config, quota=ledger, claims=NoClaims(), trusted=Trusted()
    )
    templates = mutated.plan.claim_templates if mutated.plan else ()
    result.update(
        allowed=validated.outcome != "denied",
        reason=validated.reason,
        warnings=list(dict.fromkeys([*mutated.warnings, *validated.warnings])),
        pod=stored,
        demand=mutated.plan.demand if mutated.plan else None,
        claimTemplates=[t.manifest(namespace, labels=LABELS) for t in templates],
    )
    return result


def _holder(
    namespace: str, class_name: str, gpus: Fraction, domain: str, index: int
) -> dict[str, Any]:
    """A running pod that holds `gpus` GPUs of a class, as the usage index would see it."""
    from policies.quantity import format_amount

    name = f"in-use-{class_name}-{index}"
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": name},
        "spec": {
            "nodeName": "node",
            "containers": [
                {
                    "name": "main",
                    "resources": {"limits": {f"{domain}/{class_name}": format_amount(gpus)}},
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def _request(pod: dict[str, Any], namespace: str) -> AdmissionRequest:
    import uuid

    from webhook.reviews.request import AdmissionRequest

    return AdmissionRequest(
        uid=str(uuid.uuid4()),
        operation="CREATE",
        namespace=namespace,
        name="",  # the pod's own name, if any, is read from the object as the apiserver's is
        object=pod,
        old_object=None,
        dry_run=True,
        user="gpuadm-review",
        groups=(),
    )


def _print(result: dict[str, Any]) -> None:
    verdict = "allowed" if result["allowed"] else "denied"
    print(f"verdict: {verdict} (namespace {result['namespace']})")
    if result.get("demand"):
        print(f"demand: {result['demand']}")
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


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.rstrip().splitlines())
