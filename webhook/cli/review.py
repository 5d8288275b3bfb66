"""`gpuadm review`: what gpuadm would do to a pod, offline, as the apiserver would see it."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

from webhook.admission.decisions import Trusted, mutate_under, validate_under
from webhook.claims.lookup import NoClaims
from webhook.claims.templates import LABELS, NoTemplates
from webhook.cli import flags
from webhook.cli.config_files import load_config
from webhook.cli.exits import CommandError, ExitCode
from webhook.config.snapshot import ConfigSnapshot
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.reviews.request import AdmissionRequest


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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpuadm review` to the command line."""
    review = sub.add_parser("review", help="show offline what gpuadm would do to a pod")
    review.add_argument("pod", type=Path, help="a Pod manifest (YAML or JSON); - for stdin")
    flags.add_config_files(review, required=True)
    review.add_argument("--namespace", "-n", help="namespace to judge the pod in")
    review.add_argument("--output", "-o", choices=["text", "json"], default="text")
    review.set_defaults(run=run)


def run(args: argparse.Namespace) -> ExitCode:
    """Print what gpuadm would do to a pod: verdict, warnings, patch and the mutated pod."""
    config = load_config(args.policy, args.quotas)
    try:
        text = sys.stdin.read() if str(args.pod) == "-" else args.pod.read_text()
        pod = yaml.load(text, Loader=ManifestLoader)
    except (OSError, yaml.YAMLError) as error:
        raise CommandError(f"cannot read pod {args.pod}: {error}") from None
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        raise CommandError(f"{args.pod} is not a Pod manifest")
    try:
        # As kubectl sends it: keys as text (a key 1 is "1"), and no value JSON has no form
        # for (an explicit tag such as !!binary or !!set, .nan, .inf).
        pod = json.loads(json.dumps(pod, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise CommandError(f"{args.pod} holds a value JSON cannot carry: {error}") from None
    metadata = pod.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise CommandError(f"{args.pod}: metadata is not a mapping")
    # The apiserver gives every object its metadata before any webhook sees it.
    pod["metadata"] = metadata
    namespace = str(args.namespace or metadata.get("namespace") or "default")
    result = asyncio.run(simulate_admission(pod, namespace, config))
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    return ExitCode.OK if result["allowed"] else ExitCode.REFUSED


async def simulate_admission(
    pod: dict[str, Any], namespace: str, config: ConfigSnapshot
) -> dict[str, Any]:
    """Run the pod through /mutate then /validate, as the apiserver would."""
    # A fresh ledger: the pod is judged against the quota as if the namespace held nothing.
    ledger = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False)
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


def _request(pod: dict[str, Any], namespace: str) -> AdmissionRequest:
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
