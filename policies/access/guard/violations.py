"""What the guard's checks find: a `Violation`, where it is and how it is shown, and the
denial that lists them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from policies.errors import Denial
from policies.pods.pod_shape import clipped, shown
from policies.pods.pod_view import ContainerView

CONTAINER_KINDS = {
    "initContainers": "init container",
    "containers": "container",
    "ephemeralContainers": "ephemeral container",
}
# A denial lists this many violations, then counts the rest: one pod may hold thousands.
MAX_LISTED = 5
# Names and values come from the user, unchecked by the apiserver before mutation.
MAX_SHOWN = 64


class Violation(NamedTuple):
    """One way a pod reaches GPUs outside its resources."""

    where: str
    field: str
    reason: str

    def describe(self) -> str:
        """Return the violation as the user reads it."""
        return f"{self.where}: {self.field} {self.reason}"


def refuse(violations: list[Violation], namespace: str | None) -> None:
    """Deny the pod, listing what it does and how the admin lets a GPU stack's pod do it.

    The way out named is the namespace's exemption, never a `guard` key: a GPU stack's own
    pods (its device plugin, container toolkit, driver) reach GPUs outside resources on
    purpose and belong in a namespace gpuadm leaves alone, while switching a rule off would
    open that way to every tenant of the cluster.
    """
    if not violations:
        return
    listed = [violation.describe() for violation in violations[:MAX_LISTED]]
    if len(violations) > MAX_LISTED:
        listed.append(f"and {len(violations) - MAX_LISTED} more")
    raise Denial(
        "GPU access outside the pod's resources: " + "; ".join(listed) + ". " + exempt(namespace)
    )


def exempt(namespace: str | None) -> str:
    """Say how an admin lets a GPU stack's own pod through: exempt its namespace."""
    which = f"its namespace {shown_value(namespace)}" if namespace else "its namespace"
    return (
        "If this is a GPU stack's own pod (a device plugin, the container toolkit, a driver), "
        f"{which} must be exempt: an admin adds it to the policy's exemptNamespaces "
        "(the Helm value policy.exemptNamespaces)"
    )


def place_of(container: ContainerView) -> str:
    """Name a container as the user knows it: `init container "setup"`."""
    label = "sidecar" if container.sidecar else CONTAINER_KINDS[container.kind]
    return f'{label} "{shown_value(container.name)}"'


def shown_value(value: object) -> str:
    """Return a value for a message: text as it is, other values as the core shows them.

    Names and paths read better unquoted (`env NVIDIA_VISIBLE_DEVICES=all`); both are cut
    to MAX_SHOWN characters the same way as every value a message shows.
    """
    if isinstance(value, str):
        return clipped(value, MAX_SHOWN)
    return shown(value, MAX_SHOWN)


def mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []
