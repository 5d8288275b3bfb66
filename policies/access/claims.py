"""Keep GPU devices behind gpuadm's classes on the DRA path: who may write which claims.

With Dynamic Resource Allocation a pod gets devices through ResourceClaims, made from a
ResourceClaimTemplate or made on their own and named by the pod. In a namespace gpuadm
governs, GPU devices come through gpuadm's templates only, so that every GPU a pod holds is
charged to a class:

- a ResourceClaimTemplate that requests a GPU DeviceClass, carries gpuadm's name or label,
  or is one of gpuadm's, is written by gpuadm alone;
- a ResourceClaim that requests a GPU DeviceClass is made by Kubernetes' resourceclaim
  controller alone (from a template, for one pod);
- a pod may name an existing claim (`resourceClaimName`) only if it requests no GPU
  DeviceClass: a claim made for another pod would share that pod's GPUs uncharged.

Deleting a template is not refused: a namespace being deleted takes its templates with it,
and gpuadm makes its own again when a pod needs one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from policies.errors import Denial
from policies.pods.dra_templates import parse_template_name, requested_device_classes
from policies.pods.pod_shape import check_metadata, shown
from policies.policy import MANAGED_BY, MANAGER, Policy


def check_template(
    template: Mapping[str, Any], policy: Policy, *, old: Mapping[str, Any] | None = None
) -> None:
    """Refuse a ResourceClaimTemplate written by anyone but gpuadm that is, or looks, gpuadm's.

    `old` is the template before an update.
    """
    for version, whose in ((template, ""), (old, "the old template's ")):
        if version is None:
            continue
        check_metadata(version, whose=whose)
        metadata = version.get("metadata") or {}
        name = str(metadata.get("name") or "")
        if parse_template_name(name) is not None or (
            (metadata.get("labels") or {}).get(MANAGED_BY) == MANAGER
        ):
            raise Denial(
                f"ResourceClaimTemplate {shown(name)} is gpuadm's (by its name or its "
                f"{MANAGED_BY} label): only gpuadm writes it; ask for {policy.domain}/<class> "
                "in a pod's container and gpuadm names the template"
            )
    _refuse_gpus("ResourceClaimTemplate", _spec(template.get("spec"), "spec"), policy)


def check_claim(claim: Mapping[str, Any], policy: Policy) -> None:
    """Refuse a ResourceClaim for GPUs made by anyone but the resourceclaim controller."""
    _refuse_gpus("ResourceClaim", claim.get("spec"), policy)


def named_claims(pod: Mapping[str, Any]) -> list[str]:
    """Return the ResourceClaims a pod names directly, in `spec.resourceClaims` order.

    Call it on a pod whose fields `policies.pods.pod_shape.check_pod` has checked.
    """
    entries = (pod.get("spec") or {}).get("resourceClaims") or ()
    return [e["resourceClaimName"] for e in entries if e.get("resourceClaimName")]


def check_named_claim(name: str, claim: Mapping[str, Any] | None, policy: Policy) -> None:
    """Refuse a pod that names claim `name` (None: it does not exist) if it could be GPUs."""
    if claim is None:
        raise Denial(
            f"spec.resourceClaims names ResourceClaim {shown(name)}, which does not exist; "
            "create the claim first, then the pod"
        )
    gpu = _gpu_classes(claim.get("spec"), policy)
    if gpu:
        raise Denial(
            f"spec.resourceClaims names ResourceClaim {shown(name)}, which holds devices of "
            f"DeviceClass {', '.join(gpu)}: GPUs come through gpuadm's classes, one claim per "
            f"pod; ask for {policy.domain}/<class> in the container instead"
        )


def _refuse_gpus(kind: str, spec: object, policy: Policy) -> None:
    """Refuse a claim or template spec that requests a GPU DeviceClass."""
    gpu = _gpu_classes(spec, policy)
    if gpu:
        raise Denial(
            f"{kind} requests DeviceClass {', '.join(gpu)}: in this namespace GPUs come "
            f"through gpuadm's classes; ask for {policy.domain}/<class> in a pod's container "
            "instead"
        )


def _gpu_classes(spec: object, policy: Policy) -> list[str]:
    gpu_classes = policy.gpu_device_class_names
    return _unique(name for name in requested_device_classes(spec) if name in gpu_classes)


def _spec(value: object, field: str) -> object:
    if value is not None and not isinstance(value, Mapping):
        raise Denial(f"{field}: {shown(value)} is not an object")
    return (value or {}).get("spec")


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))
