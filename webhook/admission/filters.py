"""The filters a review meets before it is judged: each answers it, or passes it on.

A filter looks at what the request is (its kind, its namespace, its operation), never at
the pod's content. The first filter that answers decides; a review that passes them all is
judged by the core (`admission.decisions`). The edge's own filters, on the HTTP request
itself (a client certificate, the headers), are in `server.handlers`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from webhook.admission.decision import Decision
from webhook.config.snapshot import ConfigSnapshot
from webhook.reviews.request import AdmissionRequest, Operation

# A filter under the config in force: a decision that answers the review, or None.
Filter = Callable[[AdmissionRequest, ConfigSnapshot], Decision | None]


def judged_kind(request: AdmissionRequest) -> Decision | None:
    """Let a review of a kind gpuadm does not judge pass unchanged, before any config is read.

    The webhooks' rules send no other kind, so this is a misrouted or hand-made review:
    well-formed, so not a 4xx, and nothing of gpuadm's to judge or rewrite.
    """
    if request.is_judged:
        return None
    return Decision(
        "allowed",
        f"gpuadm judges Pods, DRA claims and ConfigMaps only; {request.kind} passes unchanged",
    )


def exempt_namespace(request: AdmissionRequest, config: ConfigSnapshot) -> Decision | None:
    """Let everything in a namespace the policy exempts pass unchanged."""
    if request.namespace in config.policy.exempt_namespaces:
        return _unchanged(config)
    return None


def pods(request: AdmissionRequest, config: ConfigSnapshot) -> Decision | None:
    """Let a review of anything but a Pod pass unchanged (only pods are rewritten)."""
    return None if request.is_pod else _unchanged(config)


def operations(*judged: Operation) -> Filter:
    """Return a filter that lets a review of any other operation than `judged` pass unchanged."""

    def operation(request: AdmissionRequest, config: ConfigSnapshot) -> Decision | None:
        return None if request.operation in judged else _unchanged(config)

    return operation


def first_answer(
    filters: Sequence[Filter], request: AdmissionRequest, config: ConfigSnapshot
) -> Decision | None:
    """Return the answer of the first filter that gives one, or None if the review passes."""
    for step in filters:
        if (answer := step(request, config)) is not None:
            return answer
    return None


def _unchanged(config: ConfigSnapshot) -> Decision:
    return Decision("allowed", revisions=config.revisions)
