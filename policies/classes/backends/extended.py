"""The declarative backend: a GPU stack described by its resources, not by code.

Many GPU stacks publish a GPU as extended resources with a compute dimension, a memory
dimension, or both (Tencent qGPU, Alibaba cGPU, Volcano Engine mGPU, Elastic GPU). They
differ only in names, in what one GPU is worth in each dimension, and in units and steps.
`backend: extended` declares those; the named stacks are presets of it, each a subclass whose
defaults are the stack's own values (docs/backends.md gives the source of each).

Compute and memory amounts are what the container holds in all, not per GPU: `100q` cores
are q whole GPUs, as these stacks read them. A count resource, when a stack has one, is a
number of whole GPUs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import cached_property
from typing import Annotated, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from policies.classes.asks import Ask, Grant, MemoryShare, Whole
from policies.classes.class_base import Bytes, ClassBase, Model, OneOrMany
from policies.classes.models import ClassModel
from policies.errors import Denial
from policies.quantity import floor_div, format_bytes, memory_unit_name

Dimension = Literal["count", "compute", "memory"]
ShareDimension = Literal["compute", "memory"]
DIMENSIONS: tuple[Dimension, ...] = ("count", "compute", "memory")
SHARE_DIMENSIONS: tuple[ShareDimension, ...] = ("compute", "memory")

# An extended resource name is a qualified name with a domain: `<DNS subdomain>/<name>`.
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_EXTENDED_RESOURCE = re.compile(rf"^{_DNS_SUBDOMAIN}/{_NAME}$")
_ANNOTATION_KEY = re.compile(rf"^({_DNS_SUBDOMAIN}/)?{_NAME}$")


def _extended_resource(name: str) -> str:
    prefix, _, short = name.partition("/")
    # Kubernetes keeps names without a domain, and those under kubernetes.io, for its own
    # resources: the apiserver refuses them as extended resources.
    native = prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")
    if len(prefix) > 253 or len(short) > 63 or native or not _EXTENDED_RESOURCE.match(name):
        raise ValueError(
            f"{name!r} is not an extended resource name: write <domain>/<name>, with a "
            "lowercase DNS domain other than kubernetes.io, e.g. example.com/gpu-core"
        )
    return name


def _annotation_key(key: str) -> str:
    prefix, _, short = key.rpartition("/")
    if len(prefix) > 253 or len(short) > 63 or not _ANNOTATION_KEY.match(key):
        raise ValueError(
            f"{key!r} is not an annotation key: write [<domain>/]<name>, e.g. example.com/mode"
        )
    return key


def _positive(value: int) -> int:
    if value <= 0:
        raise ValueError(f"{value} must be a positive whole number, such as 1 or 5")
    return value


def _listed(value: object) -> object:
    # `whole: compute` reads better than `whole: [compute]` for the usual single dimension.
    return [value] if isinstance(value, str) else value


ExtendedResource = Annotated[str, AfterValidator(_extended_resource)]
AnnotationKey = Annotated[str, AfterValidator(_annotation_key)]
Units = Annotated[int, AfterValidator(_positive)]
WholeDimensions = Annotated[tuple[Dimension, ...], BeforeValidator(_listed), OneOrMany()]
ShareDimensions = Annotated[tuple[ShareDimension, ...], BeforeValidator(_listed), OneOrMany()]


class ExtendedNames(Model):
    """The extended resources of a stack, one per dimension it has."""

    count: ExtendedResource | None = None
    compute: ExtendedResource | None = None
    memory: ExtendedResource | None = None

    @model_validator(mode="after")
    def _some_dimension(self) -> ExtendedNames:
        if not self.declared():
            raise ValueError(
                "declares no resource: name at least one of count (whole GPUs), compute and "
                "memory, e.g. {compute: example.com/gpu-core, memory: example.com/gpu-memory}"
            )
        return self

    def declared(self) -> tuple[Dimension, ...]:
        """Return the dimensions that have a resource, in the order count, compute, memory."""
        return tuple(dimension for dimension in DIMENSIONS if self.name(dimension))

    def name(self, dimension: Dimension) -> str | None:
        """Return the resource of a dimension, or None where the stack has none."""
        name: str | None = getattr(self, dimension)
        return name


class ExtendedBase(ClassBase):
    """A stack declared by its dimensions: count, compute and memory, each optional.

    A whole GPU is worth 1 in count, `computePerGpu` in compute, and the class's `memory` in
    memory. Shares round down to the dimension's step, so that N shares of 1/N fit one GPU
    when the stack fits each dimension exactly, but never below its minimum, and never past
    one GPU's worth: a share that reaches a whole GPU in any dimension is a whole GPU.
    """

    # Checked here instead: only a stack with a memory dimension needs the GPU's memory.
    uses_memory: ClassVar[bool] = False

    resources: ExtendedNames
    compute_per_gpu: Units = 100
    compute_step: Units = 1
    compute_min: Units | None = None
    memory_unit: Bytes | None = None
    memory_step: Units = 1
    memory_min: Units | None = None
    whole: WholeDimensions | None = None
    share: ShareDimensions | None = None
    max_gpus: Units | None = None
    annotations: dict[AnnotationKey, str] = Field(default_factory=dict)

    # Each check runs twice: on a value the admin wrote, so that the error points at its key
    # and line; and on the whole declaration, where a preset's defaults meet the admin's values.
    @field_validator("compute_step")
    @classmethod
    def _step_given(cls, step: int, info: ValidationInfo) -> int:
        _refuse(_step_problem(step, info.data.get("compute_per_gpu")))
        return step

    @field_validator("compute_min")
    @classmethod
    def _compute_min_given(cls, least: int | None, info: ValidationInfo) -> int | None:
        data = info.data
        _refuse(_compute_min_problem(least, data.get("compute_step"), data.get("compute_per_gpu")))
        return least

    @field_validator("memory_min")
    @classmethod
    def _memory_min_given(cls, least: int | None, info: ValidationInfo) -> int | None:
        _refuse(_memory_min_problem(least, info.data.get("memory_step")))
        return least

    @field_validator("whole", "share")
    @classmethod
    def _dimensions_given(
        cls, dimensions: tuple[str, ...] | None, info: ValidationInfo
    ) -> tuple[str, ...] | None:
        _refuse(_dimensions_problem(info.field_name or "", dimensions, info.data.get("resources")))
        return dimensions

    @field_validator("share")
    @classmethod
    def _share_given(
        cls, share: tuple[ShareDimension, ...] | None, info: ValidationInfo
    ) -> tuple[ShareDimension, ...] | None:
        _refuse(_share_problem(share, info.data.get("resources"), info.data.get("shareable")))
        return share

    @model_validator(mode="after")
    def _declaration_consistent(self) -> ExtendedBase:
        for problem in (
            _step_problem(self.compute_step, self.compute_per_gpu),
            _compute_min_problem(self.compute_min, self.compute_step, self.compute_per_gpu),
            _memory_min_problem(self.memory_min, self.memory_step),
            _dimensions_problem("whole", self.whole, self.resources),
            _dimensions_problem("share", self.share, self.resources),
            _share_problem(self.share, self.resources, self.shareable),
            self._memory_problem(),
        ):
            _refuse(problem)
        return self

    def _memory_problem(self) -> str | None:
        declared = self.resources.memory
        if declared is None:
            return None
        if self.memory_unit is None:
            return (
                f"resources.memory ({declared}) is declared, so memoryUnit is needed: the GPU "
                "memory that one unit of it is, e.g. 1Mi, 1Gi or 1G"
            )
        if self.memory is None:
            return (
                f"backend {self.backend_name()} declares GPU memory ({declared}), so it needs "
                "`memory`, the memory of one GPU of the class, e.g. 24Gi"
            )
        if self.memory < self.memory_unit:
            return (
                f"memory {format_bytes(self.memory)} is less than one memoryUnit "
                f"({format_bytes(self.memory_unit)}): the stack could give no memory at all"
            )
        if self.memory_min is not None and self.memory_min > self.memory_per_gpu:
            return (
                f"memoryMin {self.memory_min} is more than one GPU holds "
                f"({self.memory_per_gpu} units of {format_bytes(self.memory_unit)})"
            )
        return None

    @cached_property
    def whole_dimensions(self) -> tuple[Dimension, ...]:
        """Return the dimensions written for whole GPUs: `whole`, else the first declared."""
        if self.whole is not None:
            return self.whole
        return self.resources.declared()[:1]

    @cached_property
    def share_dimensions(self) -> tuple[ShareDimension, ...]:
        """Return the dimensions a share carries: `share`, else compute and memory, if any."""
        return _share_dimensions(self.share, self.resources)

    @cached_property
    def memory_per_gpu(self) -> int:
        """Return the memory units one GPU holds: as many whole units as fit in `memory`."""
        assert self.memory_unit is not None, "only a class with a memory dimension asks"
        return math.floor(self._memory() / self.memory_unit)

    def resource_names(self) -> frozenset[str]:
        return frozenset(
            name for name in (self.resources.name(d) for d in DIMENSIONS) if name is not None
        )

    def pod_annotations(self, class_name: str, others: Sequence[ClassModel]) -> Mapping[str, str]:
        return self.annotations

    def grant(self, ask: Ask) -> Grant:
        if isinstance(ask, Whole):
            return self._whole(ask)
        fraction = self._share_fraction(ask)
        resources: dict[str, int] = {}
        for dimension in self.share_dimensions:
            name = self._name(dimension)
            if dimension == "compute":
                resources[name] = self._compute_units(fraction)
            else:
                wanted = ask.memory if isinstance(ask, MemoryShare) else fraction * self._memory()
                resources[name] = self._memory_units(wanted)
        charge = self.charge({name: Fraction(value) for name, value in resources.items()})
        if charge >= 1 and self.whole_dimensions:
            # All of a GPU in some dimension (a minimum, or all of its memory asked): the
            # stack's own form says so.
            return self._whole(Whole(1))
        return Grant(resources, charge)

    def charge(self, resources: Mapping[str, Fraction]) -> Fraction:
        parts = []
        for dimension in self.resources.declared():
            name = self._name(dimension)
            if name in resources:
                parts.append(resources[name] / self._per_gpu(dimension))
        if not parts:
            return Fraction(0)
        charge = max(parts)
        # A dimension a share must carry but the pod leaves out is not limited: the pod may
        # use all of a GPU in it, so it holds at least one GPU's worth.
        if charge < 1 and any(self._name(d) not in resources for d in self.share_dimensions):
            return Fraction(1)
        return charge

    def _whole(self, ask: Whole) -> Grant:
        backend = self.backend_name()
        if not self.whole_dimensions:
            raise Denial(
                f"asks for {ask.describe()}, but backend {backend} is declared without whole "
                "GPUs (`whole: []`): ask for a share (e.g. 0.5) or memory"
            )
        if self.max_gpus is not None and ask.count > self.max_gpus:
            raise Denial(
                f"asks for {ask.describe()}, but backend {backend} gives a container at most "
                f"{self.max_gpus} GPU{'s' if self.max_gpus != 1 else ''} (maxGpus)"
            )
        resources = {
            self._name(dimension): ask.count * self._per_gpu(dimension)
            for dimension in self.whole_dimensions
        }
        warnings: tuple[str, ...] = ()
        if ask.memory_cap is not None:
            warnings = ("a whole GPU comes with all of its memory: the memory cap is ignored",)
        return Grant(resources, Fraction(ask.count), warnings)

    def _compute_units(self, fraction: Fraction) -> int:
        step = self.compute_step
        least = self.compute_min or step
        steps = floor_div(fraction * self.compute_per_gpu, step)
        return min(self.compute_per_gpu, max(least, steps * step))

    def _memory_units(self, amount: Fraction) -> int:
        assert self.memory_unit is not None, "only a class with a memory dimension asks"
        step = self.memory_step
        least = self.memory_min or step
        units = max(least, floor_div(amount, self.memory_unit * step) * step)
        return min(self.memory_per_gpu, units)

    def memory_unit_of(self, name: str) -> str | None:
        if self.memory_unit is None or name != self.resources.memory:
            return None
        return memory_unit_name(self.memory_unit)

    def _per_gpu(self, dimension: Dimension) -> int:
        if dimension == "count":
            return 1
        if dimension == "compute":
            return self.compute_per_gpu
        return self.memory_per_gpu

    def _name(self, dimension: Dimension) -> str:
        name = self.resources.name(dimension)
        assert name is not None, f"{dimension} is not declared"
        return name


def _refuse(problem: str | None) -> None:
    if problem is not None:
        raise ValueError(problem)


def _step_problem(step: int, per_gpu: int | None) -> str | None:
    if per_gpu is None or per_gpu % step == 0:
        return None
    # The first few divisors are enough to show what would be accepted.
    found = [str(d) for d in range(1, min(per_gpu, 1000) + 1) if per_gpu % d == 0]
    more = ", ..." if len(found) > 12 or per_gpu > 1000 else ""
    return (
        f"computeStep {step} does not divide computePerGpu {per_gpu}: a whole GPU must be a "
        f"whole number of steps (steps that divide {per_gpu}: {', '.join(found[:12])}{more})"
    )


def _compute_min_problem(least: int | None, step: int | None, per_gpu: int | None) -> str | None:
    if least is None or step is None or per_gpu is None:
        return None
    if least % step == 0 and least <= per_gpu:
        return None
    return (
        f"computeMin {least} must be a multiple of computeStep {step} and at most "
        f"computePerGpu {per_gpu}"
    )


def _memory_min_problem(least: int | None, step: int | None) -> str | None:
    if least is None or step is None or least % step == 0:
        return None
    return f"memoryMin {least} must be a multiple of memoryStep {step}"


def _dimensions_problem(
    field: str, dimensions: tuple[str, ...] | None, names: ExtendedNames | None
) -> str | None:
    if dimensions is None or names is None:
        return None
    declared = names.declared()
    for dimension in dimensions:
        if dimension not in declared:
            return (
                f"{field} lists {dimension}, but resources names no {dimension} resource "
                f"(declared: {', '.join(declared)}); declare resources.{dimension} or remove "
                f"{dimension} from {field}"
            )
    if len(set(dimensions)) != len(dimensions):
        return f"{field} lists a dimension twice: {', '.join(dimensions)}"
    return None


def _share_problem(
    share: tuple[ShareDimension, ...] | None, names: ExtendedNames | None, shareable: object
) -> str | None:
    if not shareable or names is None or _share_dimensions(share, names):
        return None
    return (
        "a share must carry compute or memory, and this class gives it neither: list them "
        "under share (with their resources), or set `shareable: false`"
    )


def _share_dimensions(
    share: tuple[ShareDimension, ...] | None, names: ExtendedNames
) -> tuple[ShareDimension, ...]:
    if share is not None:
        return share
    return tuple(d for d in SHARE_DIMENSIONS if names.name(d) is not None)


class ExtendedClass(ExtendedBase):
    """A stack declared in the policy: its resources, units, steps, scheduler and annotations."""

    backend: Literal["extended"] = "extended"


class QgpuNames(ExtendedNames):
    """Tencent qGPU's resources."""

    compute: ExtendedResource | None = "tke.cloud.tencent.com/qgpu-core"
    memory: ExtendedResource | None = "tke.cloud.tencent.com/qgpu-memory"


class QgpuClass(ExtendedBase):
    """Tencent qGPU (TKE): cores in steps of 5 (100 a GPU), memory in steps of 1G.

    Whole GPUs are `qgpu-core: 100q`. Scheduled by the default scheduler with the
    qgpu-scheduler extender.
    """

    backend: Literal["qgpu"] = "qgpu"
    resources: QgpuNames = QgpuNames()
    compute_step: Units = 5
    # "1G" in TKE's documentation; decimal by default, since a GiB reading would round down.
    memory_unit: Bytes | None = Fraction(10**9)
    whole: WholeDimensions | None = ("compute",)
    share: ShareDimensions | None = ("compute", "memory")


class CgpuNames(ExtendedNames):
    """Alibaba cGPU's resources (ACK shared GPU scheduling)."""

    compute: ExtendedResource | None = "aliyun.com/gpu-core.percentage"
    memory: ExtendedResource | None = "aliyun.com/gpu-mem"


class CgpuClass(ExtendedBase):
    """Alibaba cGPU (ACK): memory in GiB, compute in percent in steps of 5, one GPU at most.

    A whole GPU is all of its memory and 100 percent: ACK refuses to mix memory-only pods and
    pods with compute on one node, so a whole GPU carries both dimensions as shares do.
    """

    backend: Literal["cgpu"] = "cgpu"
    resources: CgpuNames = CgpuNames()
    compute_step: Units = 5
    memory_unit: Bytes | None = Fraction(2**30)
    whole: WholeDimensions | None = ("memory", "compute")
    share: ShareDimensions | None = ("memory", "compute")
    max_gpus: Units | None = 1


class MgpuNames(ExtendedNames):
    """Volcano Engine mGPU's resources."""

    compute: ExtendedResource | None = "vke.volcengine.com/mgpu-core"
    memory: ExtendedResource | None = "vke.volcengine.com/mgpu-memory"


class MgpuClass(ExtendedBase):
    """Volcano Engine mGPU: 100 cores a GPU, memory in MiB (256 at least), the volcano scheduler.

    Whole GPUs are `mgpu-core: 100q`, which Volcano reads as full cards.
    """

    default_scheduler: ClassVar[str | None] = "volcano"
    backend: Literal["mgpu"] = "mgpu"
    resources: MgpuNames = MgpuNames()
    memory_unit: Bytes | None = Fraction(2**20)
    memory_min: Units | None = 256
    whole: WholeDimensions | None = ("compute",)
    share: ShareDimensions | None = ("compute", "memory")


class ElasticGpuNames(ExtendedNames):
    """Elastic GPU's resources."""

    compute: ExtendedResource | None = "elasticgpu.com/gpu-core"
    memory: ExtendedResource | None = "elasticgpu.com/gpu-memory"


class ElasticGpuClass(ExtendedBase):
    """Elastic GPU: 100 cores a GPU, memory in MiB; the default scheduler with its extender."""

    backend: Literal["elastic-gpu"] = "elastic-gpu"
    resources: ElasticGpuNames = ElasticGpuNames()
    memory_unit: Bytes | None = Fraction(2**20)
    whole: WholeDimensions | None = ("compute",)
    share: ShareDimensions | None = ("compute", "memory")


PRESETS: tuple[type[ExtendedBase], ...] = (QgpuClass, CgpuClass, MgpuClass, ElasticGpuClass)
