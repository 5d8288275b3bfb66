"""A class's memory and MIG profiles checked against what the hardware of its models reports
(`policies.classes.hardware`): memory declared above the real figure makes shares that never
fit together, and a profile a model does not offer, or holds less than declared, takes pods
it cannot run."""

from __future__ import annotations

from fractions import Fraction

from policies.classes.backends.device_plugins import MigClass
from policies.classes.class_base import ClassBase
from policies.classes.hardware import HARDWARE, Hardware
from policies.quantity import format_memory

MiB = 2**20


def sized_in_shares(gpu_class: ClassBase) -> bool:
    """Tell whether a class's shares are sized from its `memory` (a MIG class's slices are
    fixed: its profiles are checked instead)."""
    return gpu_class.uses_memory and gpu_class.shareable and not isinstance(gpu_class, MigClass)


def halves_overflow(memory: Fraction, gpu_mib: int) -> bool:
    """Tell whether two halves of `memory` bytes, each rounded down to a MiB as the stacks
    round a share, are more than a GPU of `gpu_mib` MiB holds."""
    return 2 * int(memory / 2 / MiB) > gpu_mib


def memory_warnings(class_name: str, gpu_class: ClassBase) -> list[str]:
    """Warn of memory a class declares above what its models' hardware reports, and of MIG
    profiles its models do not offer or that hold less than declared."""
    known = [(model, HARDWARE[model]) for model in gpu_class.models or () if model in HARDWARE]
    warnings = []
    sized = [(model, h.memory_mib) for model, h in known if h.memory_mib is not None]
    if sized_in_shares(gpu_class) and gpu_class.memory is not None and sized:
        model, mib = min(sized, key=lambda found: found[1])
        if halves_overflow(gpu_class.memory, mib):
            warnings.append(_above_real(class_name, gpu_class.memory, model, mib))
    if isinstance(gpu_class, MigClass):
        for model, hardware in known:
            warnings += _profile_warnings(class_name, gpu_class, model, hardware)
    return warnings


def _above_real(class_name: str, memory: Fraction, model: str, mib: int) -> str:
    half = Fraction(int(memory / 2 / MiB)) * MiB  # as the stacks round a share: down, in MiB
    return (
        f"class {class_name}: memory {format_memory(memory)} is more than {model} has "
        f"({mib}Mi, as NVML reports it and the stacks count it): shares are sized from it, so "
        f"two halves ({format_memory(half)} each) never share one such GPU; write "
        f"`memory: {mib}Mi`"
    )


def _profile_warnings(
    class_name: str, gpu_class: MigClass, model: str, hardware: Hardware
) -> list[str]:
    if not hardware.mig:
        return []
    warnings = []
    for profile, declared in gpu_class.profiles.items():
        offered = hardware.profile(profile)
        if offered is None:
            names = ", ".join(p.name for p in hardware.mig)
            warnings.append(
                f"class {class_name}: {model} offers no MIG profile {profile} (its profiles: "
                f"{names}): no node of that model has such a slice"
            )
        elif offered.memory_mib is not None and declared > offered.memory_mib * MiB:
            warnings.append(
                f"class {class_name}: MIG profile {profile} holds "
                f"{format_memory(Fraction(offered.memory_mib * MiB))} on "
                f"{model} (as nvidia-smi mig -lgip reports it), less than the "
                f"{format_memory(declared)} declared: an ask between the two is given a slice "
                "too small for it; declare what the slice holds"
            )
    return warnings
