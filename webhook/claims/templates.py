"""Keep gpuadm's ResourceClaimTemplates: made before a pod names one, removed when unused.

A pod of a `dra` class names a template of gpuadm's (`policies.dra`). The mutating webhook
makes it in the pod's namespace before it answers, never on a dry run; a create that finds
it there already is as good as one that made it. Every replica sweeps now and then:

- a template that no pod names, for `UNUSED_GRACE_SECONDS` on end, is deleted (if it is still
  the object that was seen: the delete carries its uid);
- a template that a pod names but that is missing (someone deleted it, or a sweep of
  another replica did just as this one made it known) is made again, when today's policy
  still writes it: the pod waits for its claim at most one sweep longer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from policies.access.demand import TERMINAL_PHASES
from policies.pods.dra_templates import ClaimTemplate, parse_template_name
from policies.policy import CLASS_NAME, MANAGED_BY, MANAGER, Policy
from webhook.config.snapshot import ConfigHolder
from webhook.kube.endpoint import RESOURCE_API
from webhook.kube.errors import KubeError

if TYPE_CHECKING:
    from webhook.kube.rest import AsyncApi

log = logging.getLogger("gpuadm.claims")

# A template this replica made or found is not asked for again for this long: the pods of a
# ReplicaSet cost one create between them, not one each.
CONFIRMED_SECONDS = 60.0
# How often a replica sweeps; also how long a pod waits at most for a template made again.
SWEEP_SECONDS = 30.0
# A template no pod names is kept this long, so that a burst of Jobs does not make, delete
# and make again the same template. Longer than CONFIRMED_SECONDS: a template confirmed
# by a replica was named by a pod since, or is confirmed no longer.
UNUSED_GRACE_SECONDS = 300.0
# Templates remembered as confirmed, at most: past it the oldest are asked for again.
MAX_CONFIRMED = 4096
LABELS = {MANAGED_BY: MANAGER}


class ClaimError(Exception):
    """A template a pod needs could not be made, or a claim it names could not be read;
    `message` says why, for the user."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Templates(Protocol):
    """Makes sure the templates a pod names exist in its namespace."""

    async def ensure(self, namespace: str, templates: Sequence[ClaimTemplate]) -> None:
        """Return once every template exists; raise `ClaimError` otherwise."""
        ...


class NoTemplates:
    """Templates where gpuadm has no apiserver to keep them (standalone, on files)."""

    async def ensure(self, namespace: str, templates: Sequence[ClaimTemplate]) -> None:
        """Refuse: without the apiserver, the template the pod would name never exists."""
        if templates:
            raise ClaimError(
                f"the pod needs ResourceClaimTemplate {templates[0].name}, which gpuadm makes "
                "only when it runs in a cluster; this gpuadm serves from files"
            )


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one sweep did: templates made again and templates deleted, as `ns/name`."""

    made: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()


class ClusterTemplates:
    """Templates kept in the cluster, through the admission path's apiserver session."""

    def __init__(
        self, api: AsyncApi, config: ConfigHolder, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Keep templates with `api`, under the policy `config` holds."""
        self.api = api
        self.config = config
        self.clock = clock
        self._confirmed: dict[tuple[str, str], float] = {}
        self._unused_since: dict[tuple[str, str], float] = {}

    async def ensure(self, namespace: str, templates: Sequence[ClaimTemplate]) -> None:
        """Make each template unless this replica saw it lately; raise `ClaimError`."""
        now = self.clock()
        for template in templates:
            key = (namespace, template.name)
            if now - self._confirmed.get(key, -CONFIRMED_SECONDS) < CONFIRMED_SECONDS:
                continue
            await self._create(namespace, template)
            self._confirm(key, now)

    async def _create(self, namespace: str, template: ClaimTemplate) -> None:
        try:
            stored = await self.api.create_claim_template(
                namespace, template.manifest(namespace, labels=LABELS)
            )
        except KubeError as error:
            if error.status != 409:
                raise ClaimError(
                    f"could not make ResourceClaimTemplate {template.name} in namespace "
                    f"{namespace}: {error}; retry"
                ) from None
            # Made by another replica, or for an earlier pod; or by someone else before
            # gpuadm governed the namespace, which only its spec and label can tell.
            await self._check_existing(namespace, template)
            return
        if not template.stored_as_written(stored):
            await self._unmake(namespace, template, stored)
        log.info("made ResourceClaimTemplate %s/%s", namespace, template.name)

    async def _unmake(
        self, namespace: str, template: ClaimTemplate, stored: dict[str, Any]
    ) -> None:
        """Delete a template the apiserver stored otherwise than written, and refuse the pod.

        An apiserver drops the fields of a feature gate that is off: a share's `capacity`
        request without `DRAConsumableCapacity`. The claim would then hold a whole device
        while the pod is charged its share, so the pod is refused instead.
        """
        uid = str((stored.get("metadata") or {}).get("uid") or "")
        try:
            await self.api.delete_claim_template(namespace, template.name, uid)
        except KubeError as error:
            log.warning(
                "could not delete ResourceClaimTemplate %s/%s, stored otherwise than written: "
                "%s; the sweep deletes it once unused",
                namespace,
                template.name,
                error,
            )
        why = (
            ": a capacity request needs the feature gate DRAConsumableCapacity on the "
            "apiserver, the scheduler and the controller manager"
            if template.asks_capacity
            else ""
        )
        raise ClaimError(
            f"the apiserver did not store ResourceClaimTemplate {template.name} as gpuadm "
            f"wrote it{why}; the pod cannot get what it would be charged for"
        )

    async def _check_existing(self, namespace: str, template: ClaimTemplate) -> None:
        try:
            found = await self.api.get_claim_template(namespace, template.name)
        except KubeError as error:
            raise ClaimError(
                f"could not read ResourceClaimTemplate {template.name} in namespace "
                f"{namespace}: {error}; retry"
            ) from None
        if found is None:
            raise ClaimError(
                f"ResourceClaimTemplate {template.name} in namespace {namespace} was deleted "
                "as it was made; retry"
            )
        labels = (found.get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_BY) == MANAGER and not template.stored_as_written(found):
            # Only gpuadm writes its label: one it made that the apiserver stored otherwise
            # (and that it could not delete then).
            await self._unmake(namespace, template, found)
        if labels.get(MANAGED_BY) != MANAGER:
            raise ClaimError(
                f"ResourceClaimTemplate {template.name} in namespace {namespace} bears gpuadm's "
                "name but is not gpuadm's (another label or spec); an admin must delete it"
            )

    def _confirm(self, key: tuple[str, str], now: float) -> None:
        self._confirmed.pop(key, None)
        self._confirmed[key] = now
        while len(self._confirmed) > MAX_CONFIRMED:
            del self._confirmed[next(iter(self._confirmed))]

    async def sweep(self) -> SweepResult:
        """Make again the templates pods name and lack; delete those long unnamed."""
        policy = self.config.current.policy
        stored = await self.api.list_all(
            f"{RESOURCE_API}/resourceclaimtemplates", f"{MANAGED_BY}={MANAGER}"
        )
        existing = {_key(t): (t.get("metadata") or {}).get("uid", "") for t in stored}
        # Classes of templates written under earlier policies too; only valid class names,
        # since they go into the pods' label selector.
        classes = _dra_classes(policy) | {
            parsed.class_name
            for _, name in existing
            if (parsed := parse_template_name(name)) and CLASS_NAME.match(parsed.class_name)
        }
        named = await self._named_templates(policy, classes)
        now = self.clock()
        made = [key for key in named - existing.keys() if await self._make_again(policy, key)]
        deleted = []
        for key, uid in existing.items():
            if key in named:
                self._unused_since.pop(key, None)
                continue
            since = self._unused_since.setdefault(key, now)
            if now - since >= UNUSED_GRACE_SECONDS and await self._delete(key, uid):
                deleted.append(key)
        for key in self._unused_since.keys() - existing.keys():
            del self._unused_since[key]
        return SweepResult(_names(made), _names(deleted))

    async def _named_templates(self, policy: Policy, classes: set[str]) -> set[tuple[str, str]]:
        if not classes:
            return set()
        selector = f"{policy.class_annotation} in ({','.join(sorted(classes))})"
        pods = await self.api.list_all("/api/v1/pods", selector)
        return {
            (str((pod.get("metadata") or {}).get("namespace")), template)
            for pod in pods
            if (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES
            for template in _templates_of(pod)
        }

    async def _make_again(self, policy: Policy, key: tuple[str, str]) -> bool:
        namespace, name = key
        parsed = parse_template_name(name)
        gpu_class = policy.classes.get(parsed.class_name) if parsed else None
        template = (
            gpu_class.claim_template(parsed.class_name, parsed.held)
            if gpu_class is not None and parsed is not None
            else None
        )
        if template is None:
            log.warning(
                "a pod in %s names ResourceClaimTemplate %s, which gpuadm cannot make", *key
            )
            return False
        if template.name != name:
            log.warning(
                "a pod in %s names ResourceClaimTemplate %s, written under an earlier policy; "
                "it is not made again",
                *key,
            )
            return False
        try:
            await self._create(namespace, template)
        except ClaimError as error:
            log.warning("%s", error.message)
            return False
        return True

    async def _delete(self, key: tuple[str, str], uid: str) -> bool:
        self._confirmed.pop(key, None)
        try:
            await self.api.delete_claim_template(*key, uid=uid)
        except KubeError as error:
            if error.status not in (404, 409):
                log.warning("could not delete ResourceClaimTemplate %s/%s: %s", *key, error)
            return False
        self._unused_since.pop(key, None)
        log.info("deleted ResourceClaimTemplate %s/%s, which no pod names", *key)
        return True

    async def run(self, progress: Callable[[], None] = lambda: None) -> None:
        """Sweep every `SWEEP_SECONDS` while the app serves; a failed sweep is raised, for
        the supervisor to log and retry. `progress` is called after each sweep."""
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            if self.config.loaded:
                await self.sweep()
            progress()


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace")), str(metadata.get("name"))


def _dra_classes(policy: Policy) -> set[str]:
    return {name for name, c in policy.classes.items() if c.claims_devices}


def _templates_of(pod: dict[str, Any]) -> Iterable[str]:
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        template = entry.get("resourceClaimTemplateName")
        if isinstance(template, str) and parse_template_name(template) is not None:
            yield template


def _names(keys: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    return tuple(sorted(f"{namespace}/{name}" for namespace, name in keys))
