"""`gpuadm uninstall`: the first step of removing gpuadm, which leaves no pod refused and
none waiting forever.

1. Read the policy's domain from the ConfigMap gpuadm-policy, for the name of gpuadm's
   scheduling gate, `<domain>/quota` (the default domain's, said on stderr, when there is no
   valid policy). A read changes nothing: a cluster that cannot be read stops the command
   before anything is deleted.
2. Delete gpuadm's two webhook configurations (one already gone is no error). From then on no
   pod is gated, and none is refused by the fail-closed validating webhook while gpuadm's pods
   go. A review the apiserver had already started may still gate a pod, and the apiserver
   learns of the deletion a moment later: the command waits `--settle-seconds` for both.
3. List every pod, page by page, and remove gpuadm's gate from each that carries it, with the
   JSON patch the leader releases with (`policies.quota.queue.remove_gate`: a `test` of the gate's
   place, then its removal). A pod that changed since it was read (409, 422) is read again and
   patched again, a few times at most; a pod gone (404) is no error. No one releases these
   pods once gpuadm is gone: gated, they would wait forever. Other gates are left alone.

`helm uninstall` runs it in a pre-delete Job, as gpuadm's ServiceAccount; with kustomize, an
admin runs it before `kubectl delete -k`. It can be run again: each step is done once.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import yaml

from webhook.cli import flags
from webhook.cli.exits import CommandError, ExitCode

if TYPE_CHECKING:
    from webhook.kube.rest import AsyncApi

# The cluster, the core and the event loop are imported by the functions that use them, so
# that the commands that never do (review, check-config) start without them.

# After the webhook configurations are deleted: a review already under way takes at most the
# webhooks' timeoutSeconds (5 s in the shipped configurations), and the apiserver's view of
# its webhooks follows the deletion within a moment.
SETTLE_SECONDS = 10.0
# Patches of one gate at most, for a pod that keeps changing between its read and its patch.
MAX_ATTEMPTS = 5
# Pods patched at once: a few, so a long list goes faster without crowding the apiserver.
PARALLEL_PATCHES = 8
# The kinds of gpuadm's webhook configurations, by the name the API client gives them.
KINDS = {
    "mutating": "MutatingWebhookConfiguration",
    "validating": "ValidatingWebhookConfiguration",
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpuadm uninstall` to the command line."""
    uninstall = sub.add_parser(
        "uninstall",
        help="before removing gpuadm: delete its webhook configurations, then lift its "
        "scheduling gate from every pod waiting behind it",
        description="Delete gpuadm's Mutating- and ValidatingWebhookConfiguration, so that no "
        "pod is gated or refused while gpuadm goes, then remove gpuadm's scheduling gate "
        "(<policy domain>/quota) from every pod that waits behind it in queue mode, since "
        "nothing would release them once gpuadm is gone. Other gates stay. Run it before "
        "`kubectl delete -k`; `helm uninstall` runs it for you.",
    )
    flags.add_gpuadm_namespace(uninstall)
    uninstall.add_argument(
        "--webhook-configuration",
        default=flags.WEBHOOK_CONFIGURATION,
        help="name of gpuadm's Mutating- and ValidatingWebhookConfiguration "
        f"(default {flags.WEBHOOK_CONFIGURATION})",
    )
    uninstall.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing: say which webhook configurations would be deleted and which "
        "pods' gates lifted",
    )
    uninstall.add_argument(
        "--settle-seconds",
        type=flags.seconds_between(0, 600),
        default=SETTLE_SECONDS,
        help="after deleting the webhook configurations, wait this long for the reviews "
        "already under way before looking for gated pods (default %(default)g)",
    )
    uninstall.add_argument(
        "-o",
        "--output",
        choices=["text", "json", "yaml"],
        default="text",
        help="text (default), json or yaml",
    )
    flags.add_kubeconfig(uninstall)
    uninstall.set_defaults(run=run)


class Uninstalled:
    """What `gpuadm uninstall` did, or would do with --dry-run. (A plain class: a dataclass
    is built when its module loads, and every command loads this one.)"""

    def __init__(self, gate: str, dry_run: bool) -> None:
        self.gate = gate
        self.dry_run = dry_run
        # (kind, name, whether it existed: deleted, or would be)
        self.configurations: list[tuple[str, str, bool]] = []
        # "namespace/name" of each pod whose gate was lifted (or would be)
        self.lifted: list[str] = []

    def to_json(self) -> dict[str, Any]:
        """The result as -o json and -o yaml print it."""
        return {
            "dryRun": self.dry_run,
            "gate": self.gate,
            "webhookConfigurations": [
                {"kind": kind, "name": name, "existed": existed}
                for kind, name, existed in self.configurations
            ],
            "lifted": [
                dict(zip(("namespace", "name"), pod.split("/", 1), strict=True))
                for pod in self.lifted
            ],
        }

    def deleted(self) -> bool:
        """Tell whether a webhook configuration existed (and so was deleted, or would be)."""
        return any(existed for _, _, existed in self.configurations)

    def summary(self) -> str:
        """One line: what was deleted and how many gates were lifted."""
        would = "would " if self.dry_run else ""
        deleted = [f"{kind} {name}" for kind, name, existed in self.configurations if existed]
        if deleted:
            first = f"{would}{'delete' if self.dry_run else 'deleted'} {' and '.join(deleted)}"
        else:
            first = "no webhook configuration to delete"
        lift = "lift" if self.dry_run else "lifted"
        pods = f"{len(self.lifted)} pod{'' if len(self.lifted) == 1 else 's'}"
        return f"{first}; {would}{lift} the gate {self.gate} of {pods}"

    def lines(self) -> list[str]:
        """The text output: a line per object, as kubectl says what it did, then the summary."""
        suffix = " (dry run)" if self.dry_run else ""
        shown = []
        for kind, name, existed in self.configurations:
            done = "deleted" if existed else "not found: already gone"
            shown.append(f"{kind.lower()}/{name} {done}{suffix}")
        shown += [f"pod {pod}: gate {self.gate} lifted{suffix}" for pod in self.lifted]
        return [*shown, self.summary()]


def run(args: argparse.Namespace) -> ExitCode:
    """Delete the webhook configurations, lift the gates, and say what was done."""
    from webhook.cli.cluster import call, cluster_api
    from webhook.kube.errors import KubeError
    from webhook.kube.rest import plainly

    try:
        api = cluster_api(args)
        done = call(
            api,
            uninstall(
                api,
                args.gpuadm_namespace,
                args.webhook_configuration,
                dry_run=args.dry_run,
                settle=args.settle_seconds,
            ),
        )
    except KubeError as error:
        raise CommandError(f"cannot uninstall: {error}") from None
    except Unfinished as stopped:
        failure = stopped.error
        if isinstance(failure, KubeError):
            failure = plainly(failure, api.endpoint)
        raise CommandError(
            f"cannot finish: {stopped.done.summary()}, then: {failure}; run gpuadm uninstall "
            "again to finish"
        ) from None
    if args.output == "json":
        print(json.dumps(done.to_json(), indent=2))
    elif args.output == "yaml":
        print(yaml.safe_dump(done.to_json(), sort_keys=False).rstrip())
    else:
        print("\n".join(done.lines()))
    return ExitCode.OK


class Unfinished(Exception):
    """A call failed after the command changed the cluster: what was done, and the failure."""

    def __init__(self, done: Uninstalled, error: Exception) -> None:
        super().__init__(str(error))
        self.done = done
        self.error = error


async def uninstall(
    api: AsyncApi,
    gpuadm_namespace: str,
    configuration: str,
    *,
    dry_run: bool,
    settle: float = SETTLE_SECONDS,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> Uninstalled:
    """Do the three steps (see the module's docstring); return what was done.

    A call that fails before anything changed is raised as it came (`KubeError`); one that
    fails after is raised as `Unfinished`, with what was done by then, so that the admin
    knows the cluster is half way and that running the command again finishes the work.
    `sleep` waits the settle (asyncio's, unless a test gives its own).
    """
    import asyncio

    from webhook.kube.errors import KubeError

    done = Uninstalled(await gate_of(api, gpuadm_namespace), dry_run)
    try:
        for kind, kind_name in KINDS.items():
            if dry_run:
                existed = await api.get_webhook_configuration(kind, configuration) is not None
            else:
                existed = await api.delete_webhook_configuration(kind, configuration)
            done.configurations.append((kind_name, configuration, existed))
        if not dry_run and settle > 0 and done.deleted():
            await (sleep or asyncio.sleep)(settle)
        await lift_gates(api, done)
    except (KubeError, CommandError) as error:
        if dry_run or not (done.deleted() or done.lifted):
            raise
        raise Unfinished(done, error) from None
    return done


async def gate_of(api: AsyncApi, gpuadm_namespace: str) -> str:
    """Return gpuadm's scheduling gate under the policy in the cluster, else the default
    domain's, saying why on stderr."""
    from policies import ConfigError, Policy, load_policy
    from policies.policy import GATE_SUFFIX
    from webhook.config.configmap_source import POLICY_KEY, POLICY_MAP
    from webhook.config.read_budget import read_within

    default = f"{Policy.model_fields['domain'].default}/{GATE_SUFFIX}"
    where = f"ConfigMap {gpuadm_namespace}/{POLICY_MAP}"
    found = await api.get_configmap(gpuadm_namespace, POLICY_MAP)
    text = ((found or {}).get("data") or {}).get(POLICY_KEY)
    if found is None or not isinstance(text, str) or not text.strip():
        why = f"no {where}" if found is None else f"{where} has no {POLICY_KEY}"
    else:
        try:
            source = f"{POLICY_MAP}[{POLICY_KEY}]"
            policy = await read_within(lambda: load_policy(text, source=source), source=source)
            return policy.quota_gate
        except ConfigError as error:
            why = f"the policy in {where} is invalid ({error.problems[0]})"
    print(
        f"gpuadm: warning: {why}: lifting the default domain's gate, {default}",
        file=sys.stderr,
    )
    return default


async def lift_gates(api: AsyncApi, done: Uninstalled) -> None:
    """Lift `done.gate` from every pod that carries it, a page of the list at a time; add
    each pod lifted (or, with `done.dry_run`, to lift) to `done.lifted`.

    The pods of a page are patched a few at a time; the first failure is raised once the
    page's other patches are done, so that what was lifted is all counted.
    """
    import asyncio

    from policies.quota.queue import is_gated

    slots = asyncio.Semaphore(PARALLEL_PATCHES)

    async def lift(pod: dict[str, Any]) -> None:
        async with slots:
            name = await _lift_one(api, pod, done.gate)
        if name:
            done.lifted.append(name)

    async for page in api.list_pods():
        gated = [
            pod
            for pod in page.items
            if is_gated(pod, done.gate)
            # A pod being deleted is going, gated or not: it is never scheduled.
            and not (pod.get("metadata") or {}).get("deletionTimestamp")
        ]
        if done.dry_run:
            done.lifted += [_name(pod) for pod in gated]
            continue
        outcomes = await asyncio.gather(*(lift(pod) for pod in gated), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome


async def _lift_one(api: AsyncApi, pod: dict[str, Any], gate: str) -> str | None:
    """Remove the gate from the pod as read, reading it again when it changed meanwhile;
    return its name if this call removed the gate, None if it went or lost the gate first."""
    from policies.quota.queue import remove_gate
    from webhook.kube.errors import KubeError

    name = _name(pod)
    namespace, pod_name = name.split("/", 1)
    for _ in range(MAX_ATTEMPTS):
        patch = remove_gate(pod, gate)
        if not patch:
            return None  # lifted by someone else meanwhile: gpuadm's leader, before it went
        try:
            await api.patch_pod(namespace, pod_name, patch)
            return name
        except KubeError as error:
            if error.status == 404:
                return None
            if not error.status:
                raise  # no answer: the apiserver is out of reach, whichever the pod
            if error.status not in (409, 422):
                raise CommandError(f"cannot lift the gate of pod {name}: {error}") from None
        found = await api.get_pod(namespace, pod_name)
        if found is None:
            return None
        pod = found
    raise CommandError(
        f"cannot lift the gate of pod {name}: it changed at each of {MAX_ATTEMPTS} attempts"
    )


def _name(pod: dict[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
