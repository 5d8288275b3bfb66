"""GPU models: one name, every stack's spelling.

A class lists its GPU models by the name the driver reports (`nvidia-smi --query-gpu=name`):
`NVIDIA A100-SXM4-80GB`, `Tesla T4`. Each GPU stack spells that name its own way, and these
pure functions write each spelling from the one name. docs/backends.md cites the code of each
stack that these rules come from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Literal, NamedTuple

from policies.classes.catalogue import GPU_NAMES

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
# HAMi's per-pod choice among the GPUs that fit (`binpack` or `spread`). It gives no GPU
# outside the class, so a pod may bring one where its class writes none; like the others, it
# cannot change after creation, or a pending share could be spread over GPUs its class packs.
HAMI_GPU_POLICY = "hami.io/gpu-scheduler-policy"
PLACEMENT_ANNOTATIONS = (HAMI_GPU_POLICY,)

VgpuStack = Literal["hami", "volcano"]
# How messages name each stack.
STACK_NAMES: Mapping[VgpuStack, str] = {"hami": "HAMi", "volcano": "Volcano"}


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
    class_name: str,
    models: Sequence[str],
    *,
    stack: VgpuStack,
    others: Iterable[ClassModel],
    catalogue: Iterable[str] = GPU_NAMES,
) -> dict[str, str]:
    """Return the `use-gputype`/`nouse-gputype` annotations that select exactly `models`.

    `others` are the models of the policy's other classes, and `catalogue` the GPU names
    gpuadm knows besides (`policies.classes.catalogue`): the class's pods must get none of them.
    Both stacks compare an entry with a device's type by case-insensitive substring, so
    `NVIDIA A10` also matches `NVIDIA A100-PCIE-40GB`. HAMi keeps a device that some entry of
    `use-gputype` matches and no entry of `nouse-gputype` does, so every known name that the
    use-list also matches goes into `nouse-gputype`. Volcano reads `nouse-gputype` only when
    `use-gputype` is absent: where its use-list would match another known name, the class
    writes `nouse-gputype` alone, naming every known name but its own, unless that would let
    more known names through than the use-list does.

    A known name that cannot be excluded without excluding one of the class's own models
    (its spelling is inside theirs) is left out of `nouse-gputype`: `unexcluded` names the
    catalogue's, which the class's pods may get. For one of the policy's models that is an
    error: raises `ModelConflict`, naming both classes and models.
    """
    known = _known(models, others, catalogue)
    use = _unique(hami_device_type(model) for model in models)
    device_type = hami_device_type if stack == "hami" else volcano_device_type
    caught = [name for name in known if _matching_entry(use, device_type(name))]
    if not caught:
        return {USE_GPUTYPE: ",".join(use)}
    if stack == "hami":
        kept = {name: _own_excluded(name, models, device_type) for name in caught}
        _refuse_policy_clash(class_name, models, stack, use, caught, kept, known)
        nouse = [hami_device_type(name) for name in caught if kept[name] is None]
        if not nouse:
            return {USE_GPUTYPE: ",".join(use)}
        return {USE_GPUTYPE: ",".join(use), NOUSE_GPUTYPE: ",".join(_unique(nouse))}
    kept = {name: _own_excluded(name, models, device_type) for name in known}
    let_through = [name for name in known if kept[name] is not None]
    through_use = [name for name in caught if known[name] is not None]
    through_nouse = [name for name in let_through if known[name] is not None]
    if through_use and through_nouse:
        _refuse_policy_clash(class_name, models, stack, use, caught, kept, known)
    if through_use or (not through_nouse and len(let_through) < len(caught)):
        nouse = [hami_device_type(name) for name in known if kept[name] is None]
        return {NOUSE_GPUTYPE: ",".join(_unique(nouse))}
    return {USE_GPUTYPE: ",".join(use)}


def admits(annotations: Mapping[str, str], stack: VgpuStack, name: str) -> bool:
    """Tell whether the stack may give a pod with these annotations a GPU of this driver name.

    HAMi: some use-entry and no nouse-entry is inside the type; Volcano: the use-list alone
    when it is set, else no nouse-entry inside the type. Entries match by case-insensitive
    substring of the type the stack registers the GPU under.
    """
    device_type = (hami_device_type if stack == "hami" else volcano_device_type)(name)
    use = annotations.get(USE_GPUTYPE)
    nouse = annotations.get(NOUSE_GPUTYPE)
    if use is not None and not _matching_entry(use.split(","), device_type):
        return False
    if use is not None and stack == "volcano":
        return True
    return nouse is None or _matching_entry(nouse.split(","), device_type) is None


def unexcluded(
    models: Sequence[str],
    annotations: Mapping[str, str],
    *,
    stack: VgpuStack,
    catalogue: Iterable[str] = GPU_NAMES,
) -> list[tuple[str, str]]:
    """Return the catalogue's GPUs that a class's pods may get besides its own models.

    Each comes with the reason, for a warning: the use-entry that matches it, or the model of
    the class whose spelling holds it, so that no nouse-entry can exclude it.
    """
    device_type = hami_device_type if stack == "hami" else volcano_device_type
    use = annotations.get(USE_GPUTYPE, "").split(",")
    found = []
    for name in _unique(catalogue):
        if name in models or not admits(annotations, stack, name):
            continue
        inside = _own_excluded(name, models, device_type)
        entry = _matching_entry(use, device_type(name)) if USE_GPUTYPE in annotations else None
        reasons = [] if entry is None else [f"use-gputype entry {entry!r} matches it"]
        if inside is not None:
            reasons.append(f"excluding it would exclude {inside!r} too")
        else:
            reasons.append("Volcano ignores nouse-gputype beside use-gputype")
        found.append((name, " and ".join(reasons)))
    return found


def _known(
    models: Sequence[str], others: Iterable[ClassModel], catalogue: Iterable[str]
) -> dict[str, str | None]:
    """Return every GPU name the class must not get, with the class that lists it, if any."""
    own = set(models)
    known: dict[str, str | None] = {}
    for other in others:
        if other.model not in own:
            known.setdefault(other.model, other.class_name)
    for name in catalogue:
        if name not in own:
            known.setdefault(name, None)
    return known


def _own_excluded(
    name: str, models: Sequence[str], device_type: Callable[[str], str]
) -> str | None:
    """Return a model of the class that a nouse-entry excluding `name` would exclude too."""
    entry = hami_device_type(name).upper()
    return next((model for model in models if entry in device_type(model).upper()), None)


def _refuse_policy_clash(
    class_name: str,
    models: Sequence[str],
    stack: VgpuStack,
    use: Sequence[str],
    caught: Sequence[str],
    kept: Mapping[str, str | None],
    known: Mapping[str, str | None],
) -> None:
    """Raise `ModelConflict` where a model of another class of the policy cannot be excluded."""
    device_type = hami_device_type if stack == "hami" else volcano_device_type
    clash = next(
        (name for name in known if known[name] is not None and kept.get(name) is not None), None
    )
    if clash is None:
        return
    first = next(name for name in caught if known[name] is not None)
    overlap = (
        f"use-gputype entry {_matching_entry(use, device_type(first))!r} also matches "
        f"{first!r} of class {known[first]!r}"
    )
    if stack == "volcano":
        overlap += ", and Volcano ignores nouse-gputype whenever use-gputype is set"
    raise ModelConflict(
        f"class {class_name!r} ({stack}) cannot be held to exactly its models: {overlap}; "
        f"but nouse-gputype cannot exclude {clash!r} of class {known[clash]!r} "
        f"without excluding {kept[clash]!r} of class {class_name!r} too, since GPU types match "
        "by case-insensitive substring. Put those models in one class"
    )


def _matching_entry(entries: Iterable[str], device_type: str) -> str | None:
    """Return the first entry that the stack would match with the device type, if any."""
    upper = device_type.upper()
    return next((entry for entry in entries if entry.upper() in upper), None)


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))
