"""The policy: which GPU classes exist, and the tables derived from them once at load time."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import NamedTuple

from pydantic import Field, field_validator, model_validator

from policies.classes.backends import BACKENDS, GpuClass
from policies.classes.class_base import ClassBase, Model, NamespaceName
from policies.classes.memory_checks import memory_warnings
from policies.classes.model_names import model_name_warnings, overlap_warnings
from policies.classes.models import ClassModel
from policies.pods.dra_templates import DEVICE_CLASS_RESOURCE_PREFIX, NVIDIA_DEVICE_CLASSES

CLASS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$")
MEMORY_SUFFIX = "-memory"
# The quota gate's name under the policy's domain: `gpuadm.io/quota` (queue mode).
GATE_SUFFIX = "quota"
# The name every chart and operator writes; translated into the class's backend (SPEC form 3).
STANDARD_GPU = "nvidia.com/gpu"
# Resource names come from users, so the table that remembers how each was classified stops
# growing here; names past it are classified on every request instead. A policy's own names
# number in the tens, so legitimate traffic never reaches it.
MAX_REMEMBERED_NAMES = 4096
# The service accounts of HAMi's and Volcano's scheduler and device plugin, and of KAI's
# binder, as their standard installs name them: HAMi's chart installed as `hami` in
# kube-system, Volcano's scheduler in volcano-system, its vGPU device plugin's manifest in
# kube-system, and KAI's chart in kai-scheduler.
DEFAULT_GPU_STACK_USERS = (
    "system:serviceaccount:kube-system:hami-scheduler",
    "system:serviceaccount:kube-system:hami-device-plugin",
    "system:serviceaccount:volcano-system:volcano-scheduler",
    "system:serviceaccount:kube-system:volcano-device-plugin",
    "system:serviceaccount:kai-scheduler:binder",
)
# The pod annotations with which any stack gpuadm knows reads a GPU request from the pod
# (KAI's `gpu-fraction`, ...): a pod that carries one asks for GPUs, whatever its class.
REQUEST_ANNOTATIONS: tuple[str, ...] = tuple(
    dict.fromkeys(key for backend in BACKENDS for key in backend.request_annotations)
)
# The label of every object gpuadm writes (records, ResourceClaimTemplates).
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpuadm"


class ClassKey(NamedTuple):
    """A resource key of the policy's domain that names a class: `D/<class>` or its memory."""

    class_name: str
    memory: bool


class ResourceRole(Enum):
    """What a resource name is to gpuadm."""

    CLASS = "class"  # D/<class> or D/<class>-memory
    RAW = "raw"  # a GPU stack's own resource, such as nvidia.com/gpu
    UNKNOWN_CLASS = "unknown-class"  # under the domain, but naming no class
    OTHER = "other"  # nothing to do with GPUs


class ResourceKind(NamedTuple):
    """How a resource name was classified; `key` is set for the class role only."""

    role: ResourceRole
    key: ClassKey | None = None


RAW = ResourceKind(ResourceRole.RAW)
UNKNOWN_CLASS = ResourceKind(ResourceRole.UNKNOWN_CLASS)
OTHER = ResourceKind(ResourceRole.OTHER)


def _default_resource_names() -> frozenset[str]:
    """Return the resource names every backend uses out of the box."""
    names: set[str] = set()
    for backend in BACKENDS:
        for info in backend.model_fields.values():
            default = info.default
            if isinstance(default, str) and "/" in default:
                names.add(default)
            elif isinstance(default, Model):
                names.update(v for v in default.model_dump().values() if isinstance(v, str))
    return frozenset(names)


@dataclass(frozen=True, slots=True)
class _Lookup:
    keys: dict[str, ClassKey]
    raw_names: frozenset[str]
    raw_prefixes: tuple[str, ...]
    domain_prefix: str
    # The device-choice annotations each class writes, by class name.
    gputypes: dict[str, dict[str, str]]
    kinds: dict[str, ResourceKind] = field(default_factory=dict)


class Guard(Model):
    """The rules that keep GPU access inside a pod's resources (`policies.access.guard`).

    Each is on unless the policy switches it off, for a cluster whose GPU stack or workloads
    need that way in (docs/configuration.md says what each one denies).
    """

    # NVIDIA_VISIBLE_DEVICES other than void or none, in any container.
    visible_devices_env: bool = True
    # For hami and volcano classes, the variables that switch HAMi-core's limits off.
    isolation_switches: bool = True
    # A hostPath volume under /dev/nvidia.
    dev_host_path: bool = True
    # A privileged container in a pod with GPU demand.
    privileged_gpu_containers: bool = True
    # GPU devices through a ResourceClaim or ResourceClaimTemplate gpuadm did not write
    # (`policies.access.claims`).
    foreign_gpu_claims: bool = True
    # A container mount at or under /var/run/nvidia-container-devices, where the NVIDIA
    # Container Toolkit reads a device list from mount points.
    device_list_mounts: bool = True
    # A hostPath volume of /dev/char, /run/nvidia/driver/dev, or a directory above them.
    device_dir_host_path: bool = True
    # The annotations with which HAMi's and Volcano's schedulers tell their device plugins
    # which devices to give a pod, and what KAI's binder writes of a share it binds (the GPU
    # group on the pod, the GPUs in a ConfigMap of the pod's namespace): a pod may not bring
    # them, and only `gpuStackUsers` write them.
    allocation_annotations: bool = True


class Policy(Model):
    """The whole `policy.yaml`."""

    domain: str = "gpuadm.io"
    default_class: str | None = None
    exempt_namespaces: list[NamespaceName] = Field(default_factory=list)
    classes: dict[str, GpuClass]
    guard: Guard = Field(default_factory=Guard)
    # More DeviceClasses whose devices are GPUs, besides NVIDIA's and those of the policy's
    # dra classes: claims for them are gpuadm's alone (`guard.foreignGpuClaims`).
    gpu_device_classes: list[str] = Field(default_factory=list)
    # The users of the GPU stack's own scheduler, binder and device plugin, who write the
    # allocation annotations of pods and KAI's share ConfigMaps (`guard.allocationAnnotations`).
    gpu_stack_users: list[str] = Field(default_factory=lambda: list(DEFAULT_GPU_STACK_USERS))

    @field_validator("domain")
    @classmethod
    def _domain_is_dns(cls, domain: str) -> str:
        if not DOMAIN.match(domain) or len(domain) > 253:
            raise ValueError(f"{domain!r} is not a DNS subdomain such as gpuadm.io")
        return domain

    @field_validator("classes")
    @classmethod
    def _class_names(cls, classes: dict[str, ClassBase]) -> dict[str, ClassBase]:
        for name in classes:
            if not CLASS_NAME.match(name):
                raise ValueError(
                    f"class name {name!r} must be lowercase letters, digits and '-', at most "
                    "63 characters, starting and ending with a letter or digit"
                )
            if name.endswith(MEMORY_SUFFIX):
                raise ValueError(
                    f"class name {name!r} must not end in {MEMORY_SUFFIX!r}: "
                    f"<class>{MEMORY_SUFFIX} is the key that asks for memory"
                )
        return classes

    @field_validator("classes")
    @classmethod
    def _gpu_models(cls, classes: dict[str, ClassBase]) -> dict[str, ClassBase]:
        _check_gpu_types(classes)
        _gputype_table(classes)  # raises ModelConflict, a ValueError, where none is exact
        return classes

    @model_validator(mode="after")
    def _cross_checks(self) -> Policy:
        if self.default_class is not None and self.default_class not in self.classes:
            raise ValueError(
                f"defaultClass {self.default_class!r} is not a class "
                f"(classes: {', '.join(sorted(self.classes)) or 'none'})"
            )
        self._device_resources_are_their_own()
        return self

    def _device_resources_are_their_own(self) -> None:
        """Refuse a DeviceClass's own extended resource name (a dra class's
        `extendedResourceName`) that also names a class key or another class's resource, but
        that of a class on the same DeviceClass: a pod asking for it would be read two ways.
        `nvidia.com/gpu` is every class's whole GPUs already."""
        for name, gpu_class in self.classes.items():
            for resource in gpu_class.device_resources():
                if resource.startswith(DEVICE_CLASS_RESOURCE_PREFIX) or resource == STANDARD_GPU:
                    continue
                if resource.startswith(f"{self.domain}/"):
                    raise ValueError(
                        f"class {name}: extendedResourceName {resource} is under the policy's "
                        f"domain, whose names are class keys"
                    )
                for other, other_class in self.classes.items():
                    same_devices = other_class.device_classes() == gpu_class.device_classes()
                    if other != name and other_class.owns(resource) and not same_devices:
                        raise ValueError(
                            f"class {name}: extendedResourceName {resource} is a resource of "
                            f"class {other} too; a DeviceClass's name must be its own"
                        )

    @cached_property
    def _lookup(self) -> _Lookup:
        """Build, once, the tables the admission path reads on every request."""
        keys: dict[str, ClassKey] = {}
        for name in self.classes:
            keys[f"{self.domain}/{name}"] = ClassKey(name, memory=False)
            keys[f"{self.domain}/{name}{MEMORY_SUFFIX}"] = ClassKey(name, memory=True)
        names = set(_default_resource_names())
        prefixes = {"nvidia.com/mig-"}
        for gpu_class in self.classes.values():
            names.update(gpu_class.resource_names())
            prefixes.update(prefix for prefix in gpu_class.resource_prefixes() if prefix)
        # A pod may ask the scheduler itself for the devices of a DeviceClass (DRA extended
        # resources): those of a GPU DeviceClass are GPU resources like any stack's.
        names.update(DEVICE_CLASS_RESOURCE_PREFIX + name for name in self.gpu_device_class_names)
        return _Lookup(
            keys,
            frozenset(names),
            tuple(sorted(prefixes)),
            self.domain + "/",
            _gputype_table(self.classes),
        )

    @cached_property
    def namespaces_of_their_own(self) -> frozenset[str]:
        """Return the namespaces in which some class treats pods differently (KAI's queues)."""
        return frozenset(
            namespace
            for gpu_class in self.classes.values()
            for namespace in gpu_class.namespaces_of_their_own()
        )

    @cached_property
    def class_label_keys(self) -> tuple[str, ...]:
        """Return the keys of the labels the classes write on their pods, besides gpuadm's."""
        keys = {
            key
            for gpu_class in self.classes.values()
            for namespace in (None, *gpu_class.namespaces_of_their_own())
            for key in gpu_class.pod_labels(namespace)
        }
        return tuple(sorted(keys))

    @cached_property
    def gpu_device_class_names(self) -> frozenset[str]:
        """Return every DeviceClass whose devices are GPUs: NVIDIA's, listed, or a dra
        class's."""
        names = {*NVIDIA_DEVICE_CLASSES, *self.gpu_device_classes}
        for gpu_class in self.classes.values():
            names.update(gpu_class.device_classes())
        return frozenset(names)

    def class_key(self, name: str) -> ClassKey | None:
        """Map `D/<class>` or `D/<class>-memory` to its class, or None."""
        return self._lookup.keys.get(name)

    def resource_kind(self, name: str) -> ResourceKind:
        """Classify a resource name; remembered, since the same names recur in every pod."""
        kinds = self._lookup.kinds
        kind = kinds.get(name)
        if kind is not None:
            return kind
        if (class_key := self.class_key(name)) is not None:
            kind = ResourceKind(ResourceRole.CLASS, class_key)
        elif self.in_domain(name):
            kind = UNKNOWN_CLASS
        elif self.is_gpu_resource(name):
            kind = RAW
        else:
            kind = OTHER
        if len(kinds) < MAX_REMEMBERED_NAMES:
            kinds[name] = kind
        return kind

    def in_domain(self, key: str) -> bool:
        """Tell whether a key (resource, label, annotation) is under the policy's domain."""
        return key.startswith(self._lookup.domain_prefix)

    def is_gpu_resource(self, name: str) -> bool:
        """Tell whether a raw resource name belongs to any GPU stack gpuadm knows."""
        lookup = self._lookup
        return name in lookup.raw_names or name.startswith(lookup.raw_prefixes)

    def backend_annotations(self, class_name: str) -> Mapping[str, str]:
        """Return the device-choice annotations the class's pods get (e.g. use-gputype)."""
        return self._lookup.gputypes.get(class_name, {})

    @cached_property
    def class_annotation(self) -> str:
        """Return the key of the class annotation and label, `D/class`."""
        return f"{self.domain}/class"

    @cached_property
    def demand_annotation(self) -> str:
        """Return the key of the demand annotation, `D/demand`."""
        return f"{self.domain}/demand"

    @cached_property
    def quota_gate(self) -> str:
        """Return the scheduling gate that holds a pod in line (queue mode), `D/quota`."""
        return f"{self.domain}/{GATE_SUFFIX}"


def _gputype_table(classes: Mapping[str, ClassBase]) -> dict[str, dict[str, str]]:
    """Return the annotations each class writes on its pods, by class name.

    Each class is given the GPU models the policy's other classes list, to exclude them
    (HAMi's and Volcano's use-gputype and nouse-gputype).
    """
    listed = [ClassModel(name, model) for name, c in classes.items() for model in c.models or ()]
    table = {}
    for name, gpu_class in classes.items():
        others = [listing for listing in listed if listing.class_name != name]
        if annotations := gpu_class.pod_annotations(name, others):
            table[name] = dict(annotations)
    return table


def _check_gpu_types(classes: Mapping[str, ClassBase]) -> None:
    """Refuse GPU types of a class that would also pick another class's GPUs."""
    for name, gpu_class in classes.items():
        gpu_class.check_gpu_types(name, {n: c for n, c in classes.items() if n != name})


def policy_warnings(policy: Policy) -> list[str]:
    """Return what the admin should know of a valid policy: classes not held to a GPU model,
    models not named as the driver names them, classes nothing tells apart, and classes whose
    shares could meet on one device with different configurations."""
    return [
        warning
        for name, gpu_class in policy.classes.items()
        for warning in (
            *gpu_class.policy_warnings(name, policy.backend_annotations(name)),
            *model_name_warnings(name, gpu_class),
            *memory_warnings(name, gpu_class),
        )
    ] + [*overlap_warnings(policy.classes), *_share_configuration_warnings(policy)]


def _share_configuration_warnings(policy: Policy) -> list[str]:
    """Warn of two sharing classes on one DeviceClass, whose models may overlap, whose
    shares carry different driver configurations: NVIDIA's driver refuses a share on a
    device that holds one configured otherwise."""
    sharing = [
        (name, c, config)
        for name, c in sorted(policy.classes.items())
        if (config := c.share_configuration()) is not None
    ]
    warnings = []
    for index, (name, one, config) in enumerate(sharing):
        for other_name, other, other_config in sharing[index + 1 :]:
            overlap = (
                one.models is None or other.models is None or set(one.models) & set(other.models)
            )
            if config != other_config and one.device_classes() & other.device_classes() and overlap:
                warnings.append(
                    f"classes {name} and {other_name} share devices of the same DeviceClass "
                    "with different sharing (strategy or interval): NVIDIA's DRA driver refuses "
                    "a share on a device that holds one configured otherwise; give them the "
                    "same sharing, or models that do not overlap"
                )
    return warnings


# What the webhook configurations gpuadm ships send it (deploy/base, and the Helm chart's
# `gpuResources` by default): pods with these resources, or under the shipped domain.
ROUTED_PREFIXES = ("nvidia.com/mig-", DEVICE_CLASS_RESOURCE_PREFIX)
SHIPPED_DOMAIN = "gpuadm.io"
# The annotations a stack reads a share from (KAI's) whose updates the shipped validating
# webhook sends gpuadm (its `update-concerns-gpuadm` matchCondition), so that an update that
# raises a share is judged, not left to the pod watch to count after the fact.
ROUTED_REQUEST_ANNOTATIONS: frozenset[str] = frozenset(
    {"gpu-fraction", "gpu-memory", "gpu-fraction-num-devices", "gpu-fraction-container-name"}
)
# The names (as patterns) of the ConfigMaps through which a stack hands a share its GPUs
# (KAI's) whose creates and updates the shipped validating webhook sends gpuadm (its
# validate-configmaps.gpuadm.io webhook), and no other ConfigMap's.
ROUTED_DEVICES_CONFIG_MAPS: frozenset[str] = frozenset({"-shared-gpu-i?[0-9]+(-evar)?$"})


# Where each GPU stack installs by its documented default. Their device plugins, container
# toolkit and drivers reach GPUs outside any pod's resources, and their schedulers and
# binders write the annotations gpuadm keeps to itself: governed, the guard refuses them.
GPU_STACK_NAMESPACES = {
    "kube-system": "HAMi's chart, Volcano's vGPU device plugin, NVIDIA's static device plugin",
    "gpu-operator": "the NVIDIA GPU Operator",
    "nvidia-device-plugin": "the NVIDIA device plugin's Helm chart",
    "nvidia-dra-driver-gpu": "the NVIDIA DRA driver for GPUs",
    "hami-system": "HAMi in a namespace of its own",
    "volcano-system": "Volcano",
    "kai-scheduler": "KAI Scheduler",
    "kai-resource-reservation": "KAI Scheduler's pods that hold a shared GPU",
}
# NVIDIA's static device plugin in kube-system is left out: the GPU Operator and the plugin's
# chart are how clusters install it, and an example that exempted kube-system alone had the
# Operator's device plugin refused.
_DEVICE_PLUGIN = ("NVIDIA's device plugin", ("gpu-operator", "nvidia-device-plugin"))
# The stacks a backend's pods need running, each with the namespaces it installs into by
# default: one of them exempt is where the cluster runs it. Only these are warned of, so that
# no admin is pushed to exempt a namespace whose stack the cluster does not run.
_STACKS_OF_BACKEND: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "nvidia": (_DEVICE_PLUGIN,),
    "mig": (_DEVICE_PLUGIN,),
    "time-slicing": (_DEVICE_PLUGIN,),
    "hami": (("HAMi", ("hami-system", "kube-system")),),
    "volcano": (("Volcano's vGPU device plugin", ("volcano-system", "kube-system")),),
    "kai": (
        _DEVICE_PLUGIN,
        ("KAI Scheduler", ("kai-scheduler",)),
        ("KAI Scheduler's pods that hold a shared GPU", ("kai-resource-reservation",)),
    ),
    "dra": (("NVIDIA's DRA driver", ("nvidia-dra-driver-gpu",)),),
}


def exemption_warnings(policy: Policy) -> list[str]:
    """Warn of each GPU stack that the policy's classes need, none of whose namespaces is
    exempt: run there, its device plugins and drivers would be refused."""
    warned: list[tuple[str, tuple[str, str, tuple[str, ...]]]] = []
    for name, gpu_class in sorted(policy.classes.items()):
        for stack, namespaces in _STACKS_OF_BACKEND.get(gpu_class.backend, ()):
            if stack in {w for w, _ in warned} or set(namespaces) & set(policy.exempt_namespaces):
                continue
            warned.append((stack, (name, gpu_class.backend, namespaces)))
    return [
        f"exemptNamespaces: class {name} ({backend}) needs {stack}, and no namespace it "
        f"installs into by default is exempt ({', '.join(namespaces)}): where it runs, its "
        "pods reach GPUs outside any pod's resources and are refused; exempt that namespace"
        for stack, (name, backend, namespaces) in warned
    ]


def routing_warnings(policy: Policy) -> list[str]:
    """Return what of a valid policy the shipped webhooks never send to gpuadm: resources,
    updates of the annotations a stack reads a share from, writes of the ConfigMaps through
    which a stack hands a share its GPUs.

    A pod asking only for such resources is never reviewed: it passes without quota or
    rewrite. The Helm chart routes more through `gpuResources.extraNames` and
    `extraPrefixes`.
    """
    routed = _default_resource_names()
    warnings = []
    if policy.domain != SHIPPED_DOMAIN:
        warnings.append(
            f"domain {policy.domain}: the kustomize base routes only {SHIPPED_DOMAIN}/ "
            "resources to gpuadm (the Helm chart routes its policy.domain); edit the "
            "matchConditions of both webhook configurations"
        )
    for name, gpu_class in policy.classes.items():
        names = sorted(
            n
            for n in gpu_class.resource_names()
            if n not in routed and not n.startswith((*ROUTED_PREFIXES, f"{SHIPPED_DOMAIN}/"))
        )
        names += [
            prefix + "*"
            for prefix in gpu_class.resource_prefixes()
            if prefix and not prefix.startswith(ROUTED_PREFIXES)
        ]
        if names:
            warnings.append(
                f"class {name}: the shipped webhooks never send gpuadm a pod that asks only "
                f"for {', '.join(names)}, so such pods pass unchecked and uncounted; add them "
                "to the Helm chart's gpuResources.extraNames (or extraPrefixes), or to the "
                "matchConditions of both webhook configurations"
            )
        unrouted = [
            key for key in gpu_class.request_annotations if key not in ROUTED_REQUEST_ANNOTATIONS
        ]
        if unrouted:
            warnings.append(
                f"class {name}: the shipped webhooks do not send gpuadm the updates that change "
                f"the annotations {gpu_class.backend_name()} reads a share from "
                f"({', '.join(unrouted)}), so a pending pod's share could be changed after "
                "admission, past quota; add them to the validating webhook's "
                "update-concerns-gpuadm matchCondition"
            )
        stack = gpu_class.devices_config_maps
        if stack is not None and stack.names.pattern not in ROUTED_DEVICES_CONFIG_MAPS:
            warnings.append(
                f"class {name}: the shipped webhooks do not send gpuadm the writes of the "
                f"ConfigMaps through which {stack.writer} hands a share its GPUs (named "
                f"{stack.names.pattern}), so a tenant could write one that names every GPU "
                "of the node; add the pattern to the matchCondition of the validating "
                "webhook validate-configmaps.gpuadm.io"
            )
    return warnings
