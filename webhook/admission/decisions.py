"""Turn a decoded request into a decision, by calling the pure core and the quota gate.

A request first meets the filters of `admission.filters`: a kind gpuadm does not judge, an
exempt namespace, an operation it leaves alone, each answered without judging. What passes
them all is judged here.

Two error families meet here, each with its own channel: a pod that breaks a rule is a
`policies.Denial` and becomes `allowed: false` with the rule's message; a review that is not
a review was refused earlier, as an HTTP 400, by the edge in `webhook.server.handlers`.

`mutate` and `validate` take typed inputs only; the server binds them once, in its app
factory, to the config holder, the quota gate, the keepers of DRA claims and the users it
trusts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies import (
    Denial,
    Plan,
    check_added_containers,
    check_guard,
    check_update,
    require_fixed_point,
)
from policies.access.claims import check_claim, check_named_claim, check_template, named_claims
from policies.access.guard import check_allocation_update, check_devices_config_map
from policies.pods.pod_shape import check_update_shape
from policies.pods.pod_view import PodView, view_pod
from policies.quota.judge import QuotaVerdict, joined
from policies.quota.queue import add_gate, is_gated, may_gate
from webhook.admission.decision import Decision, Outcome
from webhook.admission.filters import (
    Filter,
    exempt_namespace,
    first_answer,
    judged_kind,
    operations,
    pods,
)
from webhook.claims.lookup import Claims
from webhook.claims.templates import ClaimError, Templates
from webhook.config.snapshot import ConfigHolder, ConfigSnapshot, NoConfig
from webhook.gpu_hours.gate import NO_BUDGETS, BudgetGate
from webhook.quota.gate import QuotaGate
from webhook.quota.line import held_in_line
from webhook.reviews.large_pods import off_loop_if_large
from webhook.reviews.request import CLAIM, CLAIM_TEMPLATE, CONFIG_MAP, AdmissionRequest

# What a pod's creation meets before it is rewritten.
MUTATE_FILTERS: tuple[Filter, ...] = (exempt_namespace, pods, operations("CREATE"))
# What a request meets before it is judged as stored: pods, DRA claims and ConfigMaps are
# judged when created or updated.
VALIDATE_FILTERS: tuple[Filter, ...] = (exempt_namespace, operations("CREATE", "UPDATE"))


def _judged_or_snapshot(
    request: AdmissionRequest, config: ConfigHolder
) -> Decision | ConfigSnapshot:
    """The edge's answer if a filter judged the request already; else the config to judge by,
    or an error to retry when none is loaded."""
    if (answer := judged_kind(request)) is not None:
        return answer
    try:
        return config.current
    except NoConfig as error:
        return Decision("error", f"{error}; retry")


async def mutate(
    request: AdmissionRequest, *, config: ConfigHolder, templates: Templates, quota: QuotaGate
) -> Decision:
    """Rewrite a pod created with a GPU class into its backend's form."""
    snapshot = _judged_or_snapshot(request, config)
    if isinstance(snapshot, Decision):
        return snapshot
    return await mutate_under(request, snapshot, templates=templates, quota=quota)


async def mutate_under(
    request: AdmissionRequest, config: ConfigSnapshot, *, templates: Templates, quota: QuotaGate
) -> Decision:
    """Rewrite a pod under one given config snapshot (as `gpuadm review` does).

    In a queue namespace a pod under a limit is also given gpuadm's scheduling gate. The
    ResourceClaimTemplates a `dra` pod will name are made first, unless the request is a dry
    run, which stores nothing.
    """
    if (answer := first_answer(MUTATE_FILTERS, request, config)) is not None:
        return answer
    revisions = config.revisions
    try:
        plan, view = await _plan_and_guard(request, config)
        verdict = _gate_verdict(request, view, config, plan, quota)
        if verdict is not None and not verdict.allowed:
            raise Denial(verdict.message or "GPU quota exceeded")
        if plan.claim_templates and not request.dry_run:
            await templates.ensure(request.namespace, plan.claim_templates)
    except (Denial, ClaimError) as denial:
        return Decision("denied", denial.message, revisions=revisions)
    if verdict is not None:
        # Whether the pod waits is for the validating judgement to say: a pod that fits is
        # charged there, and the leader removes its gate moments later.
        return Decision(
            "mutated",
            warnings=plan.warnings,
            plan=plan,
            patch=[*plan.patch, add_gate(view, config.policy.quota_gate)],
            revisions=revisions,
        )
    outcome: Outcome = "mutated" if plan.patch else "allowed"
    return Decision(
        outcome,
        warnings=plan.warnings,
        plan=plan,
        patch=plan.patch,
        revisions=revisions,
        encoded_patch=plan.patch_json,
    )


def _gate_verdict(
    request: AdmissionRequest, view: PodView, config: ConfigSnapshot, plan: Plan, quota: QuotaGate
) -> QuotaVerdict | None:
    """Say whether the pod gets gpuadm's scheduling gate (allowed), is refused because it
    could never fit (not allowed), or neither (None): see `QuotaGate.should_gate`."""
    if plan.class_name is None:
        return None
    if not may_gate(view):
        return None
    verdict = quota.should_gate(request.namespace, plan, config)
    if verdict is not None and verdict.allowed and is_gated(view, config.policy.quota_gate):
        return None  # created with the gate already
    return verdict


@dataclass(frozen=True, slots=True)
class Trusted:
    """Who may do what gpuadm refuses to others."""

    # gpuadm itself: it changes its own labels and annotations, and writes its templates.
    gpuadm: str = ""
    # Kubernetes' resourceclaim controller: it makes the ResourceClaims of pods' templates.
    claim_controllers: tuple[str, ...] = ()


async def validate(
    request: AdmissionRequest,
    *,
    config: ConfigHolder,
    quota: QuotaGate,
    claims: Claims,
    trusted: Trusted,
    budgets: BudgetGate = NO_BUDGETS,
) -> Decision:
    """Judge a pod as it will be stored: its rewrite, its quota, its GPU-hour budget, and
    updates to gpuadm's keys; and judge DRA claims and templates, and ConfigMaps, written in
    a governed namespace."""
    snapshot = _judged_or_snapshot(request, config)
    if isinstance(snapshot, Decision):
        return snapshot
    return await validate_under(
        request, snapshot, quota=quota, claims=claims, trusted=trusted, budgets=budgets
    )


async def validate_under(
    request: AdmissionRequest,
    config: ConfigSnapshot,
    *,
    quota: QuotaGate,
    claims: Claims,
    trusted: Trusted,
    budgets: BudgetGate = NO_BUDGETS,
) -> Decision:
    """Judge a request under one given config snapshot (as `gpuadm review` does)."""
    if (answer := first_answer(VALIDATE_FILTERS, request, config)) is not None:
        return answer
    if request.kind == CONFIG_MAP:
        return _validate_config_map(request, config)
    if not request.is_pod:
        return _validate_claim_object(request, config, trusted)
    if request.operation == "UPDATE":
        return _validate_update(request, config, trusted_user=trusted.gpuadm)
    revisions = config.revisions
    try:
        # The guard runs before the fixed-point check: a pod the guard denies would only be
        # denied again after the retry that check asks for.
        planned, _ = await _plan_and_guard(request, config)
        plan = require_fixed_point(planned)
        await _check_named_claims(request, config, claims)
    except (Denial, ClaimError) as denial:
        return Decision("denied", denial.message, revisions=revisions)
    if plan.class_name is None:
        return Decision("allowed", plan=plan, revisions=revisions)
    if config.quotas_missing is not None:
        # Never "no limits": until an admin gives a valid quota config, GPU pods wait.
        message = (
            f"gpuadm has no valid GPU quota config ({config.quotas_missing}), so it admits "
            "no GPU pods in this namespace until an admin fixes it; retry then"
        )
        return Decision("denied", message, plan.warnings, plan, revisions=revisions)
    budget = budgets.judge(request.namespace, plan.class_name, config)
    if budget is not None and not budget.allowed:
        return _over_budget(request, config, plan, budget)
    verdict = joined(await quota.admit(request, plan, config), budget)
    if verdict is None:
        return Decision("allowed", "", plan.warnings, plan=plan, revisions=revisions)
    warnings = (*plan.warnings, *verdict.warnings)
    if not verdict.allowed:
        message = verdict.message or "GPU quota exceeded"
        return Decision("denied", message, warnings, plan, quota=verdict, revisions=revisions)
    outcome: Outcome = "queued" if verdict.queued else "warned" if verdict.warnings else "allowed"
    return Decision(
        outcome, verdict.message or "", warnings, plan, quota=verdict, revisions=revisions
    )


def _over_budget(
    request: AdmissionRequest, config: ConfigSnapshot, plan: Plan, budget: QuotaVerdict
) -> Decision:
    """Refuse a pod whose class's GPU-hour budget is spent; in a queue namespace, a pod
    created behind gpuadm's gate waits in line instead, uncharged, until the budget frees
    (the leader's releaser holds its class: `QueueLine.release`)."""
    message = budget.message or "GPU-hour budget spent"
    gate = config.policy.quota_gate
    revisions = config.revisions
    if config.quotas.mode_for(request.namespace) == "queue" and is_gated(request.object, gate):
        held = held_in_line(message, gate, None)
        warnings = (*plan.warnings, *held.warnings)
        return Decision("queued", message, warnings, plan, quota=held, revisions=revisions)
    return Decision("denied", message, plan.warnings, plan, quota=budget, revisions=revisions)


async def _check_named_claims(
    request: AdmissionRequest, config: ConfigSnapshot, claims: Claims
) -> None:
    """Refuse a pod that names a claim holding GPUs, or one that does not exist yet."""
    if not config.policy.guard.foreign_gpu_claims:
        return
    for name in named_claims(request.object):
        check_named_claim(name, await claims.get(request.namespace, name), config.policy)


def _validate_claim_object(
    request: AdmissionRequest, config: ConfigSnapshot, trusted: Trusted
) -> Decision:
    """Judge a ResourceClaim or ResourceClaimTemplate (`policies.access.claims`)."""
    revisions = config.revisions
    policy = config.policy
    if not policy.guard.foreign_gpu_claims:
        return Decision("allowed", revisions=revisions)
    try:
        if request.kind == CLAIM_TEMPLATE and not (
            trusted.gpuadm and request.user == trusted.gpuadm
        ):
            check_template(request.object, policy, old=request.old_object)
        elif (
            request.kind == CLAIM
            and request.operation == "CREATE"
            and request.user not in trusted.claim_controllers
        ):
            check_claim(request.object, policy)
    except Denial as denial:
        return Decision("denied", denial.message, revisions=revisions)
    return Decision("allowed", revisions=revisions)


def _validate_config_map(request: AdmissionRequest, config: ConfigSnapshot) -> Decision:
    """Judge a ConfigMap written in a governed namespace: those through which KAI's binder
    hands a share its GPUs are the GPU stack's to write (`policies.access.guard`)."""
    metadata = request.object.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    try:
        check_devices_config_map(
            name if isinstance(name, str) and name else request.name,
            config.policy,
            user=request.user,
            namespace=request.namespace,
        )
    except Denial as denial:
        return Decision("denied", denial.message, revisions=config.revisions)
    return Decision("allowed", revisions=config.revisions)


def _validate_update(
    request: AdmissionRequest, config: ConfigSnapshot, *, trusted_user: str
) -> Decision:
    revisions = config.revisions
    assert request.old_object is not None  # decode_review guarantees it for UPDATE
    try:
        # A stored pod has an object for its spec; a review whose pods do not is hand-made.
        check_update_shape(request.object)
        check_update_shape(request.old_object, whose="the old pod's ")
        # Whoever asks: gpuadm itself never adds ephemeral containers.
        check_added_containers(
            request.old_object, request.object, config.policy, namespace=request.namespace
        )
        # The GPU stack's scheduler and device plugin write these; gpuadm never does.
        check_allocation_update(request.old_object, request.object, config.policy, request.user)
        if not (trusted_user and request.user == trusted_user):
            check_update(request.old_object, request.object, config.policy)
    except Denial as denial:
        return Decision("denied", denial.message, revisions=revisions)
    return Decision("allowed", revisions=revisions)


async def _plan_and_guard(
    request: AdmissionRequest, config: ConfigSnapshot
) -> tuple[Plan, PodView]:
    """Plan the pod under `config` and apply the guard; return the plan and the pod's view.

    A large pod is worked on in a worker thread (`off_loop_if_large`), both steps in one.
    """
    return await off_loop_if_large(
        request.size, _plan_and_guard_now, request.object, request.namespace, config
    )


def _plan_and_guard_now(
    pod: dict[str, Any], namespace: str, config: ConfigSnapshot
) -> tuple[Plan, PodView]:
    """Read the pod's view once, plan with it, then apply the policy's guard rules to it.

    The view tolerates fields of the wrong type (they read as absent), so it is made before
    any shape check: `plan` checks the pod's shape before it reads the view, and on a plan
    memo hit, whose spec is not checked again, only the guard reads it.

    The guard runs beside the plan, not in it: the plan memo is keyed by what `plan` reads,
    which leaves out the env, volumes and security contexts the guard reads, so the guard
    runs on every review. Raise `Denial`.
    """
    view = view_pod(pod)
    plan = config.plan(pod, namespace, view)
    check_guard(view, config.policy, plan.class_name, namespace=namespace, requests=plan.requests)
    return plan, view
