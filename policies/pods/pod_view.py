"""A pod as the core reads it: its fields looked up once, typed, and never changed.

A review's pod is decoded JSON. The rewrite, the demand it reads and the guard each used to
walk that dict again, each guarding every step against a field of the wrong type. `view_pod`
walks it once: each field the core reads becomes an attribute, an absent or null object an
empty mapping, an absent or null list an empty tuple, and containers of every kind come in
one tuple with where they sit.

The view reads the same values whether or not the pod passed `pod_shape.check_pod` (a field of
the wrong type reads as absent), since the guard runs on pods the plan memo has seen the like
of, whose spec is not checked again. A review makes one view, given to the rewrite and the
guard both; the rewrite reads it only after that check, so what it reads has the types
`check_pod` allows. The view holds the pod's own objects, not copies: what the
rewrite writes is built beside them, never into them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

ContainerKind = Literal["initContainers", "containers", "ephemeralContainers"]
# The kinds whose containers ask for resources, in the order a pod starts them.
RESOURCE_KINDS: tuple[ContainerKind, ...] = ("initContainers", "containers")
_EMPTY: Mapping[str, Any] = {}
_new = tuple.__new__


class ContainerView(NamedTuple):
    """One container: where it sits, and the fields the core reads of it.

    What every reader needs is read when the view is made; what only the guard reads (env,
    mounts, privilege) is read when asked for, once per check.
    """

    kind: ContainerKind
    position: int  # its index in the list of its kind
    container: Mapping[str, Any]
    # The name as written: None when absent, any value in a pod not checked yet.
    name: object
    # An init container that keeps running beside the app (`restartPolicy: Always`).
    sidecar: bool
    resources: Mapping[str, Any]

    @property
    def named(self) -> bool:
        """Tell whether the container names itself: an unnamed one is called by its index."""
        return "name" in self.container

    @property
    def limits(self) -> Mapping[str, Any]:
        """Return `resources.limits`."""
        limits = self.resources.get("limits")
        return limits if type(limits) is dict else _mapping(limits)

    @property
    def requests(self) -> Mapping[str, Any]:
        """Return `resources.requests`."""
        requests = self.resources.get("requests")
        return requests if type(requests) is dict else _mapping(requests)

    @property
    def env(self) -> Sequence[Any]:
        """Return the `env` entries, each as written."""
        env = self.container.get("env")
        return env if type(env) is list else _list(env)

    @property
    def env_from(self) -> Sequence[Any]:
        """Return the `envFrom` sources, each as written."""
        return _list(self.container.get("envFrom"))

    @property
    def volume_mounts(self) -> Sequence[Any]:
        """Return the `volumeMounts`, each as written."""
        mounts = self.container.get("volumeMounts")
        return mounts if type(mounts) is list else _list(mounts)

    @property
    def privileged(self) -> bool:
        """Tell whether `securityContext.privileged` is true."""
        context = self.container.get("securityContext")
        return context is not None and _mapping(context).get("privileged") is True


class PodView(NamedTuple):
    """The fields of a pod that the rewrite, the demand and the guard read.

    What every review reads (annotations, containers) is read when the view is made; the
    rest of the spec, which the rewrite alone reads, when asked for.
    """

    annotations: Mapping[str, Any]
    # Init containers (sidecars among them), then app containers, each list in order.
    containers: tuple[ContainerView, ...]
    ephemeral: tuple[ContainerView, ...]
    metadata: Mapping[str, Any]
    spec: Mapping[str, Any]

    @property
    def all_containers(self) -> tuple[ContainerView, ...]:
        """Return the containers, then the ephemeral containers."""
        return self.containers + self.ephemeral if self.ephemeral else self.containers

    @property
    def labels(self) -> Mapping[str, Any]:
        """Return `metadata.labels`."""
        return _mapping(self.metadata.get("labels"))

    @property
    def volumes(self) -> Sequence[Any]:
        """Return `spec.volumes`, each as written."""
        return _list(self.spec.get("volumes"))

    @property
    def scheduler_name(self) -> object:
        """Return `spec.schedulerName` as written."""
        return self.spec.get("schedulerName")

    @property
    def node_name(self) -> object:
        """Return `spec.nodeName` as written."""
        return self.spec.get("nodeName")

    @property
    def affinity(self) -> Mapping[str, Any]:
        """Return `spec.affinity`."""
        return _mapping(self.spec.get("affinity"))

    @property
    def tolerations(self) -> Sequence[Any]:
        """Return `spec.tolerations`, each as written."""
        return _list(self.spec.get("tolerations"))

    @property
    def resource_claims(self) -> Sequence[Any]:
        """Return `spec.resourceClaims`, each as written."""
        return _list(self.spec.get("resourceClaims"))

    @property
    def scheduling_gates(self) -> Sequence[Any]:
        """Return `spec.schedulingGates`, each as written: the list itself when there is one
        (empty or not), else an empty tuple."""
        return _list(self.spec.get("schedulingGates"))


def as_view(pod: Mapping[str, Any] | PodView) -> PodView:
    """Return the view of a pod, read now unless it is one already."""
    return pod if isinstance(pod, PodView) else view_pod(pod)


def view_pod(pod: Mapping[str, Any]) -> PodView:
    """Read a pod's fields once into a `PodView`."""
    # Decoded JSON holds dicts and lists: the exact types are checked first, much faster than
    # `Mapping`, and the view is made on every review.
    metadata = pod.get("metadata")
    if type(metadata) is not dict:
        metadata = _mapping(metadata)
    spec = pod.get("spec")
    if type(spec) is not dict:
        spec = _mapping(spec)
    get = spec.get
    init = get("initContainers")
    app = get("containers")
    ephemeral = get("ephemeralContainers")
    annotations = metadata.get("annotations")
    return _new(
        PodView,
        (
            annotations if type(annotations) is dict else _mapping(annotations),
            (view_containers(init, "initContainers") if init else ())
            + (view_containers(app, "containers") if app else ()),
            view_containers(ephemeral, "ephemeralContainers") if ephemeral else (),
            metadata,
            spec,
        ),
    )


def view_containers(containers: object, kind: ContainerKind) -> tuple[ContainerView, ...]:
    """Read a list of containers of one kind; an item that is no object is left out."""
    if type(containers) is not list:
        return () if containers is None else _containers(_list(containers), kind)
    return _containers(containers, kind)


def _containers(containers: Sequence[Any], kind: ContainerKind) -> tuple[ContainerView, ...]:
    init = kind == "initContainers"
    views = []
    for index, container in enumerate(containers):
        # Decoded JSON holds dicts; `dict` is checked much faster than `Mapping`.
        if type(container) is not dict and not isinstance(container, Mapping):
            continue
        resources = container.get("resources")
        if type(resources) is not dict:
            resources = _mapping(resources)
        sidecar = init and container.get("restartPolicy") == "Always"
        # `tuple.__new__` makes the view without the Python-level `__new__` of a NamedTuple,
        # a third of the cost of a view, made for every container of every review.
        views.append(
            _new(ContainerView, (kind, index, container, container.get("name"), sidecar, resources))
        )
    return tuple(views)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else _EMPTY


def _list(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else ()
