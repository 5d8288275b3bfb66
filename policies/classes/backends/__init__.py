"""GPU classes: one pydantic model per backend, each knowing what its backend understands.

A class is chosen by its `backend` key (a discriminated union, `GpuClass`). The backends of
device plugins written in code are in `device_plugins`, the stacks declared in the policy
(`extended` and its presets) in `extended`, Dynamic Resource Allocation in `dra`, and NVIDIA's KAI
Scheduler, which reads shares from pod annotations, in `kai`. What
every class has, and what the rest of the core may ask of any of them, is in
`policies.classes.class_base`: a new backend is one class here, and its tests.
"""

from typing import Annotated

from pydantic import Discriminator

from policies.classes.backends.device_plugins import (
    GpuManagerClass,
    GpushareClass,
    HamiClass,
    MigClass,
    NvidiaClass,
    TimeSlicingClass,
    VirtualGpuClass,
    VolcanoClass,
)
from policies.classes.backends.dra import DraClass
from policies.classes.backends.extended import (
    CgpuClass,
    ElasticGpuClass,
    ExtendedBase,
    ExtendedClass,
    MgpuClass,
    QgpuClass,
)
from policies.classes.backends.kai import KaiClass
from policies.classes.class_base import ClassBase

GpuClass = Annotated[
    NvidiaClass
    | HamiClass
    | GpuManagerClass
    | GpushareClass
    | MigClass
    | TimeSlicingClass
    | VolcanoClass
    | QgpuClass
    | CgpuClass
    | MgpuClass
    | ElasticGpuClass
    | ExtendedClass
    | DraClass
    | KaiClass,
    Discriminator("backend"),
]

BACKENDS: tuple[type[ClassBase], ...] = (
    NvidiaClass,
    HamiClass,
    GpuManagerClass,
    GpushareClass,
    MigClass,
    TimeSlicingClass,
    VolcanoClass,
    QgpuClass,
    CgpuClass,
    MgpuClass,
    ElasticGpuClass,
    ExtendedClass,
    DraClass,
    KaiClass,
)

__all__ = [
    "BACKENDS",
    "CgpuClass",
    "ClassBase",
    "DraClass",
    "ElasticGpuClass",
    "ExtendedBase",
    "ExtendedClass",
    "GpuClass",
    "GpuManagerClass",
    "GpushareClass",
    "HamiClass",
    "KaiClass",
    "MgpuClass",
    "MigClass",
    "NvidiaClass",
    "QgpuClass",
    "TimeSlicingClass",
    "VirtualGpuClass",
    "VolcanoClass",
]
