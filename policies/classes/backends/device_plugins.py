"""The backends of device plugins: NVIDIA's, HAMi, Volcano's vGPU, gpu-manager, gpushare,
MIG and time-slicing, each a class written in code.

Each turns an ask (whole GPUs, a share, an amount of memory) into the integer extended
resources of its stack, and charges raw resources of its stack back into GPUs of the class,
for quota.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import cached_property
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, GetJsonSchemaHandler, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError

from policies.classes.asks import Ask, Grant, MemoryShare, Whole
from policies.classes.class_base import Bytes, ClassBase, GpuName, Model, ResourceName
from policies.classes.hardware import HARDWARE
from policies.classes.models import (
    GFD_PRODUCT_LABEL,
    HAMI_GPU_POLICY,
    STACK_NAMES,
    USE_GPUTYPE,
    ClassModel,
    VgpuStack,
    gputype_annotations,
    unexcluded,
)
from policies.errors import Denial
from policies.quantity import (
    MiB,
    ceil_div,
    floor_div,
    format_amount,
    format_bytes,
    format_memory,
)


def _count(resources: Mapping[str, Fraction], name: str, default: Fraction) -> Fraction:
    return resources.get(name, default)


class NvidiaClass(ClassBase):
    """NVIDIA's device plugin: whole GPUs only."""

    uses_memory: ClassVar[bool] = False
    backend: Literal["nvidia"] = "nvidia"
    resource: ResourceName = "nvidia.com/gpu"

    def resource_names(self) -> frozenset[str]:
        return frozenset({self.resource})

    def grant(self, ask: Ask) -> Grant:
        if not isinstance(ask, Whole):
            raise Denial(
                f"asks for {ask.describe()}, but backend nvidia gives whole GPUs only: "
                "ask for 1 or more"
            )
        warnings: tuple[str, ...] = ()
        if ask.memory_cap is not None:
            warnings = ("backend nvidia cannot cap GPU memory: the memory request is ignored",)
        return Grant({self.resource: ask.count}, Fraction(ask.count), warnings)

    def charge(self, resources: Mapping[str, Fraction]) -> Fraction:
        return _count(resources, self.resource, Fraction(0))


class VgpuNames(Model):
    """Resource names of a HAMi-style virtual GPU stack."""

    count: ResourceName
    memory: ResourceName
    cores: ResourceName
    memory_percentage: ResourceName | None = None


class VirtualGpuClass(ClassBase):
    """HAMi and Volcano's vGPU: a count of GPUs, each with memory (MiB) and cores (%).

    The GPU model is chosen by the pod annotations `nvidia.com/use-gputype` and
    `nouse-gputype`: derived from `models` (see `policies.classes.models.gputype_annotations`), or
    `gpuTypes` written as they are.
    """

    stack: ClassVar[VgpuStack]
    resources: VgpuNames
    gpu_types: list[GpuName] | None = None

    @model_validator(mode="after")
    def _models_or_types(self) -> VirtualGpuClass:
        if self.models is not None and self.gpu_types is not None:
            raise ValueError(
                "set `models` (gpuadm derives use-gputype and nouse-gputype from them) or "
                "`gpuTypes` (written to use-gputype as they are), not both"
            )
        return self

    def resource_names(self) -> frozenset[str]:
        names = self.resources
        return frozenset(
            name
            for name in (names.count, names.memory, names.cores, names.memory_percentage)
            if name is not None
        )

    def pod_annotations(self, class_name: str, others: Sequence[ClassModel]) -> Mapping[str, str]:
        if self.gpu_types:
            return {USE_GPUTYPE: ",".join(self.gpu_types)}
        if self.models:
            return gputype_annotations(class_name, self.models, stack=self.stack, others=others)
        return {}

    def gputype_entries(self) -> list[str]:
        if self.gpu_types:
            return list(self.gpu_types)
        return super().gputype_entries()

    @property
    def gputypes_as_written(self) -> bool:
        return bool(self.gpu_types)

    def check_gpu_types(self, class_name: str, others: Mapping[str, ClassBase]) -> None:
        """Refuse `gpuTypes` that would also pick another class's GPUs, or let it pick theirs.

        HAMi and Volcano match `nvidia.com/use-gputype` by case-insensitive substring, so a
        class typed `A10` would also land on A100s. `gpuTypes` are written as they are, so
        gpuadm can only refuse such a pair; `models` it can make exact (`policies.classes.models`).
        """
        stack = STACK_NAMES[self.stack]
        for entry in self.gputype_entries():
            for other_name, other_class in others.items():
                if not (self.gputypes_as_written or other_class.gputypes_as_written):
                    continue
                for other in other_class.gputype_entries():
                    if entry.upper() in other.upper():
                        raise ValueError(
                            f"class {class_name!r}: {stack} GPU type {entry!r} is a substring of "
                            f"{other!r} of class {other_name!r}, and {stack} matches by "
                            f"substring, so {class_name!r} pods could land on {other_name!r} "
                            "GPUs; use the full name"
                        )

    def policy_warnings(self, class_name: str, annotations: Mapping[str, str]) -> list[str]:
        """Warn of a class not held to a GPU model.

        A class with neither `models` nor `gpuTypes` is accepted, but its pods may get any
        GPU model the stack schedules; a Volcano class that must fall back to
        `nouse-gputype` alone may also get a model that no class of the policy lists.
        """
        backend = self.backend_name()
        if not self.models and not self.gpu_types:
            note = ""
            if GFD_PRODUCT_LABEL in self.node_selector:
                note = (
                    f" (its nodeSelector on {GFD_PRODUCT_LABEL} keeps them to those nodes, but "
                    f"{backend} does not read node labels when it picks a GPU)"
                )
            return [
                f"class {class_name} ({backend}) lists neither `models` nor `gpuTypes`: its pods "
                f"may land on any GPU model{note}; list the GPU models of the class under `models`"
            ]
        if self.models:
            return self._model_warnings(class_name, annotations)
        return []

    def _model_warnings(self, class_name: str, annotations: Mapping[str, str]) -> list[str]:
        """Warn where the class's annotations are exact only among the GPU models gpuadm knows."""
        backend = self.backend_name()
        models = self.models or []
        warnings = []
        if USE_GPUTYPE not in annotations:
            warnings.append(
                f"class {class_name} ({backend}): Volcano ignores nouse-gputype whenever "
                "use-gputype is set, and use-gputype would also match other GPU models, so the "
                "class's pods get nouse-gputype alone, naming every other GPU model gpuadm knows "
                "(the policy's and its catalogue's): they may also land on a GPU model that "
                "gpuadm does not know"
            )
        leaks = unexcluded(models, annotations, stack=self.stack)
        if leaks:
            named = "; ".join(f"{gpu!r} ({why})" for gpu, why in leaks)
            warnings.append(
                f"class {class_name} ({backend}): its pods may also land on GPU models it does "
                f"not list, since {STACK_NAMES[self.stack]} matches GPU types by "
                f"case-insensitive substring: {named}. List them in the class if they belong to it"
            )
        return warnings

    def grant(self, ask: Ask) -> Grant:
        names = self.resources
        if isinstance(ask, Whole):
            resources = {names.count: ask.count}
            if ask.memory_cap is not None:
                if self.memory is not None and ask.memory_cap > self.memory:
                    raise Denial(
                        f"caps GPU memory at {format_memory(ask.memory_cap)}, more than the "
                        f"{format_memory(self.memory)} of one GPU of the class"
                    )
                resources[names.memory] = ceil_div(ask.memory_cap, MiB)
                # A pod that names its memory shares the GPU with others unless it takes all of
                # its cores: 100 cores take a GPU alone, as a whole GPU is charged.
                resources[names.cores] = 100
            return Grant(resources, Fraction(ask.count))
        fraction = self._share_fraction(ask)
        memory_bytes = ask.memory if isinstance(ask, MemoryShare) else fraction * self._memory()
        # Both stacks fit cores of 100 and MiB exactly: rounded down, N shares of 1/N fit.
        resources = {
            names.count: 1,
            names.cores: max(1, floor_div(fraction * 100, 1)),
            names.memory: max(1, floor_div(memory_bytes, MiB)),
        }
        return Grant(resources, self.charge({k: Fraction(v) for k, v in resources.items()}))

    def memory_unit_of(self, name: str) -> str | None:
        return "MiB" if name == self.resources.memory else None

    def charge(self, resources: Mapping[str, Fraction]) -> Fraction:
        names = self.resources
        per_gpu_keys = {names.memory, names.cores, names.memory_percentage} - {None}
        count_default = Fraction(1) if per_gpu_keys & resources.keys() else Fraction(0)
        count = _count(resources, names.count, count_default)
        # A dimension the pod leaves unlimited is a whole GPU's worth in that dimension.
        cores = resources[names.cores] / 100 if names.cores in resources else Fraction(1)
        if names.memory in resources:
            memory = resources[names.memory] * MiB / self.memory if self.memory else Fraction(1)
        elif names.memory_percentage is not None and names.memory_percentage in resources:
            memory = resources[names.memory_percentage] / 100
        else:
            memory = Fraction(1)
        return count * max(cores, memory)


class HamiClass(VirtualGpuClass):
    """HAMi: vGPUs scheduled by hami-scheduler, GPU model chosen by `nvidia.com/use-gputype`."""

    stack: ClassVar[VgpuStack] = "hami"
    limiter: ClassVar[str | None] = STACK_NAMES["hami"]
    default_scheduler: ClassVar[str | None] = "hami-scheduler"
    backend: Literal["hami"] = "hami"
    resources: VgpuNames = VgpuNames(
        count="nvidia.com/gpu",
        memory="nvidia.com/gpumem",
        cores="nvidia.com/gpucores",
        memory_percentage="nvidia.com/gpumem-percentage",
    )
    # Which of the fitting GPUs hami-scheduler gives a pod: `binpack` fills a shared GPU
    # before it starts another, so shares leave whole GPUs free; `scheduler` writes nothing,
    # and the scheduler's own --gpu-scheduler-policy (spread unless set) decides.
    gpu_scheduler_policy: Literal["binpack", "spread", "scheduler"] = "binpack"

    def placement_annotations(self) -> Mapping[str, str]:
        if self.gpu_scheduler_policy == "scheduler":
            return {}
        return {HAMI_GPU_POLICY: self.gpu_scheduler_policy}


class VolcanoClass(VirtualGpuClass):
    """Volcano's vGPU: the same model as HAMi under volcano.sh names and the volcano scheduler."""

    stack: ClassVar[VgpuStack] = "volcano"
    limiter: ClassVar[str | None] = STACK_NAMES["volcano"]
    default_scheduler: ClassVar[str | None] = "volcano"
    backend: Literal["volcano"] = "volcano"
    resources: VgpuNames = VgpuNames(
        count="volcano.sh/vgpu-number",
        memory="volcano.sh/vgpu-memory",
        cores="volcano.sh/vgpu-cores",
    )


class GpuManagerNames(Model):
    """Resource names of tkestack gpu-manager."""

    cores: ResourceName = "tencent.com/vcuda-core"
    memory: ResourceName = "tencent.com/vcuda-memory"


class GpuManagerClass(ClassBase):
    """tkestack gpu-manager: 100 cores per GPU, memory in 256Mi blocks, both for a share."""

    backend: Literal["gpu-manager"] = "gpu-manager"
    resources: GpuManagerNames = GpuManagerNames()
    memory_block: Bytes = Fraction(256 * MiB)

    def resource_names(self) -> frozenset[str]:
        return frozenset({self.resources.cores, self.resources.memory})

    def grant(self, ask: Ask) -> Grant:
        names = self.resources
        if isinstance(ask, Whole):
            warnings: tuple[str, ...] = ()
            if ask.memory_cap is not None:
                warnings = (
                    "gpu-manager gives a whole GPU all of its memory: the memory cap is ignored",
                )
            return Grant({names.cores: 100 * ask.count}, Fraction(ask.count), warnings)
        fraction = self._share_fraction(ask)
        # Its extender fits cores of 100 and blocks exactly: rounded down, N shares of 1/N fit.
        cores = max(1, floor_div(fraction * 100, 1))
        if cores >= 100:
            # gpu-manager takes 1-99 cores for a share; 100 is the whole card (only all of
            # the GPU's memory asks for it).
            return Grant({names.cores: 100}, Fraction(1))
        memory_bytes = ask.memory if isinstance(ask, MemoryShare) else fraction * self._memory()
        blocks = max(1, floor_div(memory_bytes, self.memory_block))
        resources = {names.cores: cores, names.memory: blocks}
        return Grant(resources, self.charge({k: Fraction(v) for k, v in resources.items()}))

    def memory_unit_of(self, name: str) -> str | None:
        if name != self.resources.memory:
            return None
        return f"blocks of {format_memory(self.memory_block)}"

    def charge(self, resources: Mapping[str, Fraction]) -> Fraction:
        names = self.resources
        cores = resources.get(names.cores, Fraction(0)) / 100
        if names.memory in resources and self.memory:
            memory = resources[names.memory] * self.memory_block / self.memory
        else:
            memory = Fraction(0)
        return max(cores, memory)


class GpushareClass(ClassBase):
    """Alibaba gpushare: GPU memory only, in GiB (or MiB), one GPU per container at most."""

    backend: Literal["gpushare"] = "gpushare"
    resource: ResourceName = "aliyun.com/gpu-mem"
    memory_unit: Literal["GiB", "MiB"] = "GiB"

    @model_validator(mode="after")
    def _memory_always(self) -> GpushareClass:
        if self.memory is None:
            raise ValueError("backend gpushare needs `memory` (the memory of one GPU, e.g. 16Gi)")
        if self.memory < self._unit():
            raise ValueError(
                f"memory {format_memory(self.memory)} is less than one {self.memory_unit}, the "
                "unit gpushare counts GPU memory in; give the memory of one GPU, e.g. 16Gi"
            )
        return self

    def resource_names(self) -> frozenset[str]:
        return frozenset({self.resource})

    def check_containers(
        self, class_name: str, containers: Sequence[tuple[str, Ask | None]]
    ) -> None:
        if len(containers) > 1:
            raise Denial(
                f"class {class_name} (gpushare) gives a GPU to one container per pod, but "
                f"{', '.join(name for name, _ in containers)} all ask for one; gpushare cannot "
                "share a GPU between containers of a pod"
            )

    def _unit(self) -> int:
        return 2**30 if self.memory_unit == "GiB" else MiB

    def _units_per_gpu(self) -> int:
        """Return the units one GPU holds as gpushare counts it: whole units only."""
        return floor_div(self._memory(), self._unit())

    def grant(self, ask: Ask) -> Grant:
        if isinstance(ask, Whole):
            if ask.count != 1:
                raise Denial(
                    f"asks for {ask.describe()}, but gpushare gives a container at most one GPU"
                )
            return Grant({self.resource: self._units_per_gpu()}, Fraction(1))
        fraction = self._share_fraction(ask)
        memory_bytes = ask.memory if isinstance(ask, MemoryShare) else fraction * self._memory()
        # Its extender fits whole units exactly: rounded down, N shares of 1/N fit.
        units = max(1, floor_div(memory_bytes, self._unit()))
        return Grant({self.resource: units}, self.charge({self.resource: Fraction(units)}))

    def charge(self, resources: Mapping[str, Fraction]) -> Fraction:
        return resources.get(self.resource, Fraction(0)) / self._units_per_gpu()

    def memory_unit_of(self, name: str) -> str | None:
        return self.memory_unit if name == self.resource else None


_MIG_PROFILE = re.compile(r"^(?P<slices>[0-9]+)g\.")


# A MIG profile as NVIDIA's device plugin names its resource: slices and memory (3g.40gb),
# a compute-instance share of it (1c.3g.40gb), a media-extensions variant (1g.10gb+me).
MIG_PROFILE = re.compile(r"^([0-9]+c\.)?[0-9]+g\.[0-9]+gb(\+me)?$")
# No MIG profile holds less than this; a smaller value is a number missing its unit.
SMALLEST_PROFILE = 2**30


def _profile_name(profile: str) -> str:
    """Refuse a profile name no device plugin offers as a resource."""
    if not MIG_PROFILE.match(profile):
        fixed = re.sub(r"^([0-9]+g)\.?([0-9]+gb)$", r"\1.\2", profile.lower())
        hint = f" (did you mean {fixed}?)" if MIG_PROFILE.match(fixed) else ""
        raise ValueError(f"{profile!r} is not a MIG profile name such as 1g.10gb or 3g.40gb{hint}")
    return profile


def _profile_memory(memory: Fraction) -> Fraction:
    """Refuse memory no MIG profile has: a number written without its unit."""
    if memory < SMALLEST_PROFILE:
        raise ValueError(
            f"{format_bytes(memory)} is less memory than any MIG profile has; give a unit "
            f"(did you mean {format_amount(memory)}Gi?)"
        )
    return memory


ProfileName = Annotated[str, AfterValidator(_profile_name)]
ProfileMemory = Annotated[Bytes, AfterValidator(_profile_memory)]


class _NamesOrMapping:
    """In the JSON schema: MIG profiles as a list of names, beside the mapping of name to
    memory, as the before-validator of `MigClass` takes the file."""

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        names = {"type": "array", "items": {"type": "string", "maxLength": 64}, "minItems": 1}
        return {"anyOf": [names, handler(core_schema)]}


def _profiles_of_models(profiles: list[object], models: object) -> dict[str, str]:
    """Return the memory of each profile named in `profiles` as the hardware of `models`
    reports it, the least of them (`hardware.HARDWARE`); raise ValueError naming what gpuadm
    does not know."""
    if not isinstance(models, list) or not models:
        raise ValueError(
            "profiles given by name take their memory from the class's `models`: list them, "
            "or give each profile its memory, as {1g.10gb: 10Gi}"
        )
    found: dict[str, str] = {}
    for profile in profiles:
        least = None
        for model in models:
            known = HARDWARE.get(str(model))
            offered = known.profile(str(profile)) if known else None
            if offered is None or offered.memory_mib is None:
                raise ValueError(
                    f"gpuadm does not know what profile {profile} holds on {model} "
                    f"(`gpuadm models` lists what it knows): give each profile its memory, as "
                    f"{{{profile}: ...Gi}}"
                )
            least = offered.memory_mib if least is None else min(least, offered.memory_mib)
        found[str(profile)] = f"{least}Mi"
    return found


class MigClass(ClassBase):
    """MIG, mixed strategy: fixed profiles, each its own extended resource."""

    backend: Literal["mig"] = "mig"
    resource_prefix: str = "nvidia.com/mig-"
    profiles: Annotated[dict[ProfileName, ProfileMemory], _NamesOrMapping()]
    whole_profile: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _profiles_by_name(cls, data: object) -> object:
        """Profiles listed by name hold what the hardware of the class's models reports, so
        that an ask gets the smallest slice that really holds it (17Gi on an H200:
        1g.35gb, since its 1g.18gb holds 16Gi)."""
        if isinstance(data, Mapping) and isinstance(data.get("profiles"), list):
            return {**data, "profiles": _profiles_of_models(data["profiles"], data.get("models"))}
        return data

    @model_validator(mode="after")
    def _profiles_valid(self) -> MigClass:
        if self.memory is None:
            raise ValueError("backend mig needs `memory` (the memory of the whole GPU, e.g. 80Gi)")
        if not self.profiles:
            raise ValueError("backend mig needs at least one profile, e.g. {1g.10gb: 10Gi}")
        for profile, memory in self.profiles.items():
            if memory > self.memory:
                raise PydanticCustomError(
                    "mig_profile",
                    f"{format_bytes(memory)} is more than the memory of the class's whole GPU "
                    f"({format_bytes(self.memory)})",
                    {"at": ["profiles", profile]},
                )
        if self.whole_profile is not None and self.whole_profile not in self.profiles:
            raise ValueError(
                f"wholeProfile {self.whole_profile!r} is not one of the profiles "
                f"({', '.join(self.profiles)})"
            )
        return self

    def resource_names(self) -> frozenset[str]:
        return frozenset(self.resource_prefix + profile for profile in self.profiles)

    def resource_prefixes(self) -> tuple[str, ...]:
        return (self.resource_prefix,)

    def owns(self, resource: str) -> bool:
        return resource.startswith(self.resource_prefix)

    def profile_share(self, profile: str) -> Fraction:
        """Return the fraction of a GPU a profile gives: the larger of compute and memory."""
        return self._profile_shares[profile]

    @cached_property
    def _profile_shares(self) -> dict[str, Fraction]:
        total = max((self._slices(name) or 0) for name in self.profiles)
        shares = {}
        for profile, memory in self.profiles.items():
            slices = self._slices(profile)
            compute = Fraction(slices, total) if slices and total else Fraction(0)
            shares[profile] = min(Fraction(1), max(memory / self._memory(), compute))
        return shares

    @staticmethod
    def _slices(profile: str) -> int | None:
        match = _MIG_PROFILE.match(profile)
        return int(match["slices"]) if match else None

    def grant(self, ask: Ask) -> Grant:
        if isinstance(ask, Whole):
            if self.whole_profile is None:
                raise Denial(
                    f"asks for {ask.describe()}, but this MIG class gives slices only: ask for "
                    "a share (e.g. 0.5) or memory, or configure `wholeProfile`"
                )
            charge = ask.count * self.profile_share(self.whole_profile)
            return Grant({self.resource_prefix + self.whole_profile: ask.count}, charge)
        if isinstance(ask, MemoryShare):
            fits = [p for p, memory in self.profiles.items() if memory >= ask.memory]
        else:
            fits = [p for p in self.profiles if self.profile_share(p) >= ask.fraction]
        if not fits:
            raise Denial(f"asks for {ask.describe()}, which no MIG profile of the class holds")
        best = min(fits, key=lambda p: (self.profile_share(p), self.profiles[p], p))
        return Grant({self.resource_prefix + best: 1}, self.profile_share(best))

    def charge(self, resources: Mapping[str, Fraction]) -> Fraction:
        total = Fraction(0)
        for name, count in resources.items():
            profile = name.removeprefix(self.resource_prefix)
            if profile not in self.profiles:
                raise Denial(
                    f"uses {name}, which is not a MIG profile of the class "
                    f"(configured: {', '.join(self.profiles)})"
                )
            total += count * self.profile_share(profile)
        return total


class TimeSlicingClass(ClassBase):
    """The device plugin's time-slicing: a replica is a turn on a whole GPU, not a fraction."""

    uses_memory: ClassVar[bool] = False
    backend: Literal["time-slicing"] = "time-slicing"
    resource: ResourceName = "nvidia.com/gpu.shared"

    def resource_names(self) -> frozenset[str]:
        return frozenset({self.resource})

    def _gfd_shared(self) -> bool:
        # GPU Feature Discovery marks the product of a time-sliced GPU whose resource was not
        # renamed (`renameByDefault: false`), so that nodes can tell the two apart.
        return self.resource == "nvidia.com/gpu"

    def grant(self, ask: Ask) -> Grant:
        warnings = [
            "time-slicing shares a GPU by turns with no memory isolation: another pod on the "
            "same GPU can exhaust its memory; charged as one GPU"
        ]
        if isinstance(ask, Whole):
            if ask.count != 1:
                raise Denial(
                    f"asks for {ask.describe()}, but a time-sliced replica is one GPU at most "
                    "(the device plugin fails requests greater than one)"
                )
            if ask.memory_cap is not None:
                warnings.append("time-slicing cannot cap GPU memory: the memory cap is ignored")
        return Grant({self.resource: 1}, Fraction(1), tuple(warnings))

    def charge(self, resources: Mapping[str, Fraction]) -> Fraction:
        return resources.get(self.resource, Fraction(0))
