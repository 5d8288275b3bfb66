"""GPU models: one name, every stack's spelling.

A class lists its GPU models by the name the driver reports (`nvidia-smi --query-gpu=name`):
`NVIDIA A100-SXM4-80GB`, `Tesla T4`. Each GPU stack spells that name its own way, and these
pure functions write each spelling from the one name. docs/backends.md cites the code of each
stack that these rules come from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Literal, NamedTuple

GFD_PRODUCT_LABEL = "nvidia.com/gpu.product"
USE_GPUTYPE = "nvidia.com/use-gputype"
NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
# The pod annotations with which a pod tells HAMi or Volcano which devices it may get: GPU
# models, single GPUs by UUID, the sharing mode. Only gpuadm writes them, since a pod that
# chose its own devices would escape its class.
DEVICE_CHOICE_ANNOTATIONS = (
    USE_GPUTYPE,
    NOUSE_GPUTYPE,
    "nvidia.com/use-gpuuuid",
    "nvidia.com/nouse-gpuuuid",
    "nvidia.com/vgpu-mode",  # HAMi: hami-core, mig or mps
    "volcano.sh/vgpu-mode",  # Volcano: hami-core or mig
)

VgpuStack = Literal["hami", "volcano"]


class ClassModel(NamedTuple):
    """A GPU model as one class of the policy lists it."""

    class_name: str
    model: str


class ModelConflict(ValueError):
    """No annotation of the stack selects exactly the class's models among the policy's."""


def gfd_product(name: str, *, shared: bool = False) -> str:
    """Return the `nvidia.com/gpu.product` label GPU Feature Discovery gives a driver name.

    GFD replaces each space with `-`, and appends `-SHARED` when the GPU is time-sliced under
    the resource `nvidia.com/gpu` (not renamed): `NVIDIA A100-SXM4-80GB` becomes
    `NVIDIA-A100-SXM4-80GB`, `Tesla T4` becomes `Tesla-T4`.
    """
    product = name.replace(" ", "-")
    return f"{product}-SHARED" if shared else product


def hami_device_type(name: str) -> str:
    """Return the type HAMi registers a GPU under: `NVIDIA-` before a name without `NVIDIA`.

    `NVIDIA A10` stays `NVIDIA A10`; `Tesla T4` becomes `NVIDIA-Tesla T4`. This is also the
    spelling gpuadm writes into `use-gputype` and `nouse-gputype` for both stacks.
    """
    return name if name.startswith("NVIDIA") else f"NVIDIA-{name}"


def volcano_device_type(name: str) -> str:
    """Return the type Volcano's vGPU device plugin registers a GPU under: `NVIDIA-` + name.

    It prefixes every name, `NVIDIA A10` too (`NVIDIA-NVIDIA A10`); HAMi's spelling of a model
    is always a substring of it, which is all the stack's matching needs.
    """
    return f"NVIDIA-{name}"


def dra_selector(models: Sequence[str], *, driver: str = "gpu.nvidia.com") -> str:
    """Return the CEL selector of a DRA device whose `productName` is one of the models.

    NVIDIA's DRA driver publishes the driver's name as the device attribute `productName`,
    so the models are compared as they are, exactly.
    """
    names = ", ".join(json.dumps(model) for model in models)
    return f"device.attributes[{json.dumps(driver)}].productName in [{names}]"


def gputype_annotations(
    class_name: str, models: Sequence[str], *, stack: VgpuStack, others: Iterable[ClassModel]
) -> dict[str, str]:
    """Return the `use-gputype`/`nouse-gputype` annotations that select exactly `models`.

    `others` are the models of the policy's other classes, which the class's pods must not
    get. Both stacks compare an entry with a device's type by case-insensitive substring, so
    `NVIDIA A10` also matches `NVIDIA A100-SXM4-80GB`. HAMi keeps a device that some entry of
    `use-gputype` matches and no entry of `nouse-gputype` does, so the other models that the
    use-list also matches go into `nouse-gputype`. Volcano reads `nouse-gputype` only when
    `use-gputype` is absent: where its use-list would match another model, the class writes
    `nouse-gputype` alone, naming every other model of the policy.

    Raises `ModelConflict`, naming both classes and models, where no such pair of lists is
    exact: a model that must be excluded is itself a substring of one of the class's own.
    """
    own = set(models)
    use = _unique(hami_device_type(model) for model in models)
    device_type = hami_device_type if stack == "hami" else volcano_device_type
    foreign = [other for other in others if other.model not in own]
    caught = [other for other in foreign if _matching_entry(use, device_type(other.model))]
    if not caught:
        return {USE_GPUTYPE: ",".join(use)}
    first = caught[0]
    overlap = (
        f"use-gputype entry {_matching_entry(use, device_type(first.model))!r} also matches "
        f"{first.model!r} of class {first.class_name!r}"
    )
    if stack == "hami":
        excluded = caught
    else:
        excluded = foreign
        overlap += ", and Volcano ignores nouse-gputype whenever use-gputype is set"
    clash = _self_exclusion(models, excluded, device_type)
    if clash is not None:
        other, model = clash
        raise ModelConflict(
            f"class {class_name!r} ({stack}) cannot be held to exactly its models: {overlap}; "
            f"but nouse-gputype cannot exclude {other.model!r} of class {other.class_name!r} "
            f"without excluding {model!r} of class {class_name!r} too, since GPU types match "
            "by case-insensitive substring. Put those models in one class"
        )
    nouse = ",".join(_unique(hami_device_type(other.model) for other in excluded))
    if stack == "hami":
        return {USE_GPUTYPE: ",".join(use), NOUSE_GPUTYPE: nouse}
    return {NOUSE_GPUTYPE: nouse}


def _self_exclusion(
    models: Sequence[str], excluded: Sequence[ClassModel], device_type: Callable[[str], str]
) -> tuple[ClassModel, str] | None:
    """Return a model to exclude and a model of the class that excluding it would exclude too."""
    for other in excluded:
        entry = hami_device_type(other.model).upper()
        for model in models:
            if entry in device_type(model).upper():
                return other, model
    return None


def _matching_entry(entries: Iterable[str], device_type: str) -> str | None:
    """Return the first entry that the stack would match with the device type, if any."""
    upper = device_type.upper()
    return next((entry for entry in entries if entry.upper() in upper), None)


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))
