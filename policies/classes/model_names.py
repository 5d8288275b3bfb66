"""A class's GPU models checked against the catalogue of names the driver reports, and classes
whose nodes nothing tells apart.

Models are written as the driver names them (`nvidia-smi --query-gpu=name`); gpuadm writes
each stack's spelling from that. A name the catalogue lacks is most often another spelling
of a known one: the node label's (`NVIDIA-A100-SXM4-80GB`, GPU Feature Discovery's, which
gpuadm would label `NVIDIA-NVIDIA-...` for HAMi), a short name (`H100`, which no node's label
is), or a typo (`NVIDIA A100 SXM4 80GB`). Each gets a warning that says which names it could
mean; a name that is new to the catalogue is allowed, and said to be unknown.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from policies.classes.catalogue import GPU_NAMES
from policies.classes.class_base import ClassBase
from policies.classes.models import gfd_product

# The names a warning offers at most, closest first.
MOST_OFFERED = 3


def model_name_warnings(class_name: str, gpu_class: ClassBase) -> list[str]:
    """Warn of each model of a class that is not a GPU name gpuadm knows, with the names it
    may have meant."""
    warnings = []
    for model in gpu_class.models or ():
        if model in GPU_NAMES:
            continue
        label = next((n for n in GPU_NAMES if gfd_product(n) == model), None)
        if label is not None:
            hint = (
                " (it is the node label's spelling, as in nvidia.com/gpu.product; the driver's "
                f"name is `{label}`, and gpuadm writes each stack's spelling from it)"
            )
        else:
            meant = _meant(model)
            hint = f" (did you mean {' or '.join(f'`{m}`' for m in meant)}?)" if meant else ""
        warnings.append(
            f"class {class_name}: model {model!r} is not a GPU name gpuadm knows{hint}; nodes "
            "of a misspelt model get none of the class's pods: write models as "
            "`nvidia-smi --query-gpu=name` prints them"
        )
    return warnings


def _meant(model: str) -> list[str]:
    """Return the known names a model may mean: those that hold it whole as a word (`H100`),
    else the closest spellings."""
    folded = model.casefold()
    holding = [n for n in GPU_NAMES if folded in n.casefold().replace("-", " ").split()]
    if holding:
        return holding[:MOST_OFFERED]
    return difflib.get_close_matches(model, GPU_NAMES, n=MOST_OFFERED, cutoff=0.8)


def overlap_warnings(classes: Mapping[str, ClassBase]) -> list[str]:
    """Warn of two classes of one backend whose models overlap and whose node selectors are
    the same: nothing tells their nodes apart, so each class's pods may run on the other's
    GPUs, and a namespace's quota of one holds no GPUs the other's does not."""
    named = sorted(classes.items())
    warnings = []
    for index, (name, one) in enumerate(named):
        for other_name, other in named[index + 1 :]:
            # DRA classes on one DeviceClass are told apart by their claims
            # (`policy._share_configuration_warnings`), not by their nodes.
            if one.backend_name() != other.backend_name() or one.claims_devices:
                continue
            if one.node_selector != other.node_selector:
                continue
            # Classes on resources of their own (MIG profiles, renamed time-slicing) never
            # take each other's GPUs, whatever their nodes.
            if one.resource_names().isdisjoint(other.resource_names()):
                continue
            models = _overlap(one.models, other.models)
            if models is None:
                continue
            warnings.append(
                f"class {name} and class {other_name} ({one.backend_name()}) both select "
                f"{', '.join(models)}, with the same nodeSelector: nothing tells their nodes "
                "apart, so pods of either run on the other's GPUs; give each its own models or "
                "nodeSelector"
            )
    return warnings


def _overlap(one: list[str] | None, other: list[str] | None) -> list[str] | None:
    """Return the models two classes both list, or None. A class that lists none is
    warned of on its own (`ClassBase.policy_warnings`): it may land on any model."""
    shared = sorted(set(one or ()) & set(other or ()))
    return shared or None
