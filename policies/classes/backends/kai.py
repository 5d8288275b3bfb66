"""NVIDIA's KAI Scheduler: whole GPUs through the device plugin's `nvidia.com/gpu`, shares of
one GPU through pod annotations that KAI's scheduler and binder read.

What KAI reads, and how it counts, is from its own code (kai-scheduler/KAI-Scheduler, v0.17.0;
docs/backends.md names each file):

- `gpu-fraction`: a share of one GPU, a decimal strictly between 0 and 1 that both Go's
  `strconv.ParseFloat` and Kubernetes' quantity parser accept (`0.5`; `500m` is refused).
  KAI counts a portion in hundredths (`gpuPortionsAsDecimalsRoundingFactor`, rounding to the
  nearest), and fits `int64(portion * the GPU's memory)` MiB of it. So gpuadm writes a share
  rounded down to a hundredth, which KAI keeps as it is: N shares of 1/N then add up to at
  most one GPU, in hundredths and in MiB. It charges what it wrote.
- `gpu-memory`: an amount of GPU memory in MiB, a positive integer. KAI takes a GPU's memory
  from the node's `nvidia.com/gpu.memory` label, in MiB rounded down to a multiple of 100, and
  counts such a pod as that memory's portion of the GPU rounded up to a hundredth
  (`getGpuMemoryFractionalOnNode`). So gpuadm writes a whole number of hundredths of that
  memory (the class's `memory` in place of the label), rounded down, which KAI counts as
  exactly those hundredths, and charges them. A `gpu-memory` a pod brings is read as the
  hundredths KAI counts it as.
- `gpu-fraction-container-name`: the container the share is for; without it, the first app
  container. KAI refuses a pod that asks for a share and for `nvidia.com/gpu` in any container.
- `gpu-fraction-num-devices`: the same share of several GPUs. gpuadm asks have no such form, so
  it never writes it, and refuses a pod that brings it.
- the queue: the pod label `kai.scheduler/queue` (KAI's `--queue-label-key`), unless the pod's
  top owner has one; the scheduler: `kai-scheduler`.
- the device wiring: KAI's binder writes the GPUs it reserved for a share into ConfigMaps in
  the pod's namespace, which the share's container reads its `NVIDIA_VISIBLE_DEVICES` from
  (`pkg/binder/common/gpusharingconfigmap/config_map.go`): only `gpuStackUsers` write them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, model_validator

from policies.classes.asks import Ask, Grant, MemoryShare, Share, Whole
from policies.classes.class_base import (
    LABEL_VALUE,
    ClassBase,
    DevicesConfigMaps,
    Model,
    NamespaceName,
    ResourceName,
)
from policies.errors import Denial
from policies.pods.pod_shape import shown
from policies.pods.pod_view import ContainerView, PodView
from policies.quantity import (
    MiB,
    QuantityError,
    ceil_div,
    floor_div,
    format_amount,
    format_bytes,
    format_memory,
    parse_quantity,
)

GPU_FRACTION = "gpu-fraction"
GPU_MEMORY = "gpu-memory"
FRACTION_CONTAINER = "gpu-fraction-container-name"
FRACTION_DEVICES = "gpu-fraction-num-devices"
DEFAULT_QUEUE_LABEL = "kai.scheduler/queue"
# KAI's admission webhook names, in this annotation, the ConfigMaps through which its binder
# hands the share's container its GPU (`<name>-<index>`, `<name>-i<index>` for an init
# container), and points the container's NVIDIA_VISIBLE_DEVICES at one of them.
SHARED_GPU_CONFIGMAP = "runai/shared-gpu-configmap"
# The names of those ConfigMaps (`config_map.go`): the annotation holds a prefix that KAI's
# webhook makes `<pod or owner name>-<7 random characters>-shared-gpu` (it keeps one the pod
# brings), and the binder upserts `<prefix>-<index>` for an app container, `<prefix>-i<index>`
# for an init container, each with `-evar` after it for the one read through `envFrom`. The
# same text is the shipped validating webhook's CEL (RE2), which routes their writes.
SHARE_CONFIG_MAP_PATTERN = "-shared-gpu-i?[0-9]+(-evar)?$"
SHARE_CONFIG_MAPS = DevicesConfigMaps(re.compile(SHARE_CONFIG_MAP_PATTERN), "KAI's binder")
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
# KAI counts portions of a GPU in hundredths, and a GPU's memory in whole hundreds of MiB.
PORTION_STEP = 100
MEMORY_STEP_MIB = 100
# What strconv.ParseFloat and resource.ParseQuantity both read: no suffix, no sign.
_DECIMAL = re.compile(r"^(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$")
_COUNT = re.compile(r"^[0-9]+$")
# A label key: an optional DNS subdomain and `/`, then a name of at most 63 characters.
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _label_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if not _LABEL_NAME.match(name) or (
        prefix and not (_LABEL_PREFIX.match(prefix) and len(prefix) <= 253)
    ):
        raise ValueError(
            f"{key!r} is not a label key such as kai.scheduler/queue: an optional DNS prefix "
            "and '/', then at most 63 letters, digits, '-', '_' or '.'"
        )
    return key


def _queue_name(queue: str) -> str:
    if not queue or len(queue) > 63 or not LABEL_VALUE.match(queue):
        raise ValueError(
            f"{queue!r} cannot be a label value, so no pod can name it as its queue: at most "
            "63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    return queue


LabelKey = Annotated[str, AfterValidator(_label_key)]
QueueName = Annotated[str, AfterValidator(_queue_name)]


class KaiNamespace(Model):
    """What a KAI class does differently in one namespace: its queue, its scheduler."""

    queue: QueueName | None = None
    scheduler_name: str | None = None

    @model_validator(mode="after")
    def _sets_something(self) -> KaiNamespace:
        if self.queue is None and self.scheduler_name is None:
            raise ValueError("sets neither `queue` nor `schedulerName`; set one, or remove it")
        return self


class KaiClass(ClassBase):
    """KAI Scheduler: whole GPUs as `nvidia.com/gpu`, a share as KAI's pod annotations."""

    default_scheduler: ClassVar[str | None] = "kai-scheduler"
    request_annotations: ClassVar[tuple[str, ...]] = (
        GPU_FRACTION,
        GPU_MEMORY,
        FRACTION_DEVICES,
        FRACTION_CONTAINER,
    )
    devices_config_maps: ClassVar[DevicesConfigMaps | None] = SHARE_CONFIG_MAPS
    backend: Literal["kai"] = "kai"
    resource: ResourceName = "nvidia.com/gpu"
    # The pod label KAI reads the queue from: `kai.scheduler/queue` unless KAI runs with
    # another `--queue-label-key`. (None here: a default with '/' would read as a resource.)
    queue_label: LabelKey | None = None
    queue: QueueName | None = None
    namespaces: dict[NamespaceName, KaiNamespace] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _memory_kai_can_count(self) -> KaiClass:
        if self.memory is not None and self.memory < MEMORY_STEP_MIB * MiB:
            raise ValueError(
                f"memory {format_bytes(self.memory)} is less than 100Mi, the step KAI counts a "
                "GPU's memory in; give the memory of one GPU, e.g. 80Gi"
            )
        return self

    @property
    def queue_label_key(self) -> str:
        """Return the pod label KAI reads the queue from."""
        return self.queue_label or DEFAULT_QUEUE_LABEL

    def resource_names(self) -> frozenset[str]:
        return frozenset({self.resource})

    def scheduler_in(self, namespace: str | None) -> str | None:
        entry = self.namespaces.get(namespace) if namespace is not None else None
        if entry is not None and entry.scheduler_name is not None:
            return entry.scheduler_name
        return self.scheduler

    def pod_labels(self, namespace: str | None) -> Mapping[str, str]:
        entry = self.namespaces.get(namespace) if namespace is not None else None
        queue = entry.queue if entry is not None and entry.queue is not None else self.queue
        return {self.queue_label_key: queue} if queue is not None else {}

    def namespaces_of_their_own(self) -> frozenset[str]:
        return frozenset(self.namespaces)

    def check_containers(
        self, class_name: str, containers: Sequence[tuple[str, Ask | None]]
    ) -> None:
        if len(containers) > 1 and any(
            ask is not None and not isinstance(ask, Whole) for _, ask in containers
        ):
            raise Denial(
                f"class {class_name} (kai): KAI gives a share of a GPU to one container of a pod, "
                f"and then to no other, but {', '.join(name for name, _ in containers)} all ask "
                "for GPUs; ask for the share in one container, or for whole GPUs in each"
            )

    def grant(self, ask: Ask) -> Grant:
        if isinstance(ask, Whole):
            warnings: tuple[str, ...] = ()
            if ask.memory_cap is not None:
                warnings = ("KAI gives a whole GPU all of its memory: the memory cap is ignored",)
            return Grant({self.resource: ask.count}, Fraction(ask.count), warnings)
        if isinstance(ask, Share):
            hundredths = max(1, floor_div(ask.fraction * PORTION_STEP, 1))
            portion = Fraction(hundredths, PORTION_STEP)
            if portion >= 1:
                return self._whole_gpu()
            return Grant({}, portion, annotations={GPU_FRACTION: format_amount(portion)})
        memory = self._memory()
        if ask.memory > memory:
            raise Denial(
                f"asks for {format_memory(ask.memory)} of GPU memory but one GPU of the class "
                f"has {format_memory(memory)}"
            )
        device_mib = self._device_mib()
        hundredths = max(1, floor_div(ask.memory * PORTION_STEP, device_mib * MiB))
        if hundredths >= PORTION_STEP:
            return self._whole_gpu()
        return Grant(
            {},
            Fraction(hundredths, PORTION_STEP),
            annotations={GPU_MEMORY: str(self._hundredths_mib(hundredths))},
        )

    def memory_unit_of(self, name: str) -> str | None:
        return "MiB" if name == GPU_MEMORY else None

    def _whole_gpu(self) -> Grant:
        # KAI refuses a share of 1 or more (`gpu-fraction` must be below 1.0), and a memory
        # request it counts as a whole GPU fits no GPU it shares: the pod gets a GPU of its own.
        return Grant({self.resource: 1}, Fraction(1))

    def _hundredths_mib(self, hundredths: int) -> int:
        """Return the MiB KAI counts as exactly `hundredths` of the GPU: a MiB under them.

        The GPU's memory is a multiple of 100 MiB, so a hundredth of it is whole MiB. KAI
        counts a share's MiB over it in float64, rounded up to a hundredth, and so counts
        some exact hundredths (7, 14, 28, 55 and 56 of them) as one more: a MiB under, it
        counts them as they are. On a GPU of 100 MiB a hundredth is a MiB, and none is spared.
        """
        step = self._device_mib() // PORTION_STEP
        return hundredths * step - (1 if step > 1 else 0)

    def _counted_memory(self, mib: int) -> Fraction:
        """Return a `gpu-memory` of `mib` as KAI counts it: its hundredths of the GPU, rounded
        up (`getGpuMemoryFractionalOnNode`), in bytes. A pod stored with a `gpu-memory` that
        is not a whole number of hundredths (written by an earlier gpuadm, or brought in
        KAI's own form) is charged, and rewritten, as KAI counts it, never less."""
        if self.memory is None or mib >= self._device_mib():
            return Fraction(mib * MiB)
        device_mib = self._device_mib()
        hundredths = ceil_div(Fraction(mib * PORTION_STEP, device_mib), 1)
        return Fraction(hundredths * device_mib // PORTION_STEP * MiB)

    def _device_mib(self) -> int:
        """Return the memory of one GPU as KAI counts it: MiB, down to a multiple of 100."""
        mib = int(self._memory() // MiB)
        return mib - mib % MEMORY_STEP_MIB

    def charge(self, resources: Mapping[str, Fraction]) -> Fraction:
        return resources.get(self.resource, Fraction(0))

    def read_request(self, pod: PodView) -> tuple[Ask, ContainerView]:
        annotations = pod.annotations
        if FRACTION_DEVICES in annotations:
            raise Denial(
                f"annotation {FRACTION_DEVICES} asks KAI for a share of several GPUs, which "
                "gpuadm does not give; ask for a share of one GPU, or for whole GPUs"
            )
        fraction, memory = annotations.get(GPU_FRACTION), annotations.get(GPU_MEMORY)
        if fraction is not None and memory is not None:
            raise Denial(
                f"annotations {GPU_FRACTION} and {GPU_MEMORY} both ask KAI for a share of a GPU, "
                "and KAI refuses a pod with both; keep one"
            )
        if fraction is not None:
            ask: Ask = Share(_fraction(fraction))
        elif memory is not None:
            ask = MemoryShare(self._counted_memory(_memory_mib(memory)))
        else:
            raise Denial(
                f"annotation {FRACTION_CONTAINER} names the container of a KAI GPU share, but "
                f"the pod asks for no share ({GPU_FRACTION} or {GPU_MEMORY}); remove it"
            )
        named = annotations.get(FRACTION_CONTAINER)
        container = _share_container(pod, named)
        if container is None:
            raise Denial(
                f"annotation {FRACTION_CONTAINER}: {shown(named)} names no container of the pod; "
                "name the container that uses the GPU share"
            )
        return ask, container

    def request_container_annotations(self, container: str) -> Mapping[str, str]:
        return {FRACTION_CONTAINER: container}

    def stack_devices_env(
        self, pod: PodView, annotations: Mapping[str, Any]
    ) -> tuple[ContainerView, Mapping[str, Any]] | None:
        prefix = annotations.get(SHARED_GPU_CONFIGMAP)
        if not isinstance(prefix, str) or not (
            GPU_FRACTION in annotations or GPU_MEMORY in annotations
        ):
            return None
        named = annotations.get(FRACTION_CONTAINER)
        container = _share_container(pod, named if isinstance(named, str) else None)
        if container is None:
            return None
        index = (
            f"i{container.position}" if container.kind == "initContainers" else container.position
        )
        name = f"{prefix}-{index}"
        if not SHARE_CONFIG_MAPS.names.search(name):
            # KAI keeps a prefix the pod brings: one outside KAI's form would name a
            # ConfigMap the tenant may write, and the entry would give any GPU it names.
            return None
        reference = {"name": name, "key": VISIBLE_DEVICES}
        return container, {"name": VISIBLE_DEVICES, "valueFrom": {"configMapKeyRef": reference}}


def _share_container(pod: PodView, named: object) -> ContainerView | None:
    """Return the container KAI gives a share to: the one named, init containers searched
    first, else the first app container (`GetFractionContainerRef`)."""
    for container in pod.containers:
        if named is None and container.kind == "containers":
            return container
        if named is not None and container.name == named:
            return container
    return None


def _fraction(value: object) -> Fraction:
    """Read a `gpu-fraction` as KAI does: a plain decimal strictly between 0 and 1."""
    amount = None
    if isinstance(value, str) and _DECIMAL.match(value):
        try:
            amount = parse_quantity(value)  # bounded in length and exponent
        except QuantityError:
            amount = None
    if amount is None or not 0 < amount < 1:
        raise Denial(
            f"annotation {GPU_FRACTION}: {shown(value)} is not a share KAI reads: write a decimal "
            "between 0 and 1, such as 0.5"
        )
    return amount


def _memory_mib(value: object) -> int:
    """Read a `gpu-memory` as KAI does: a positive whole number of MiB."""
    if not (isinstance(value, str) and len(value) <= 19 and _COUNT.match(value) and int(value) > 0):
        raise Denial(
            f"annotation {GPU_MEMORY}: {shown(value)} is not an amount KAI reads: write a whole "
            "number of MiB greater than 0, such as 10240"
        )
    return int(value)
