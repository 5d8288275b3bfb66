"""What one container asks of a GPU class, before any backend has turned it into resources."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from policies.pods.dra_templates import Held
from policies.quantity import format_amount, format_memory


@dataclass(frozen=True, slots=True)
class Whole:
    """`count` whole GPUs, optionally with a per-GPU memory cap in bytes."""

    count: int
    memory_cap: Fraction | None = None

    def describe(self) -> str:
        """Say what was asked, as the user would write it."""
        cap = f" capped at {format_memory(self.memory_cap)} each" if self.memory_cap else ""
        return f"{self.count} GPU{'s' if self.count != 1 else ''}{cap}"


@dataclass(frozen=True, slots=True)
class Share:
    """A fraction 0 < f < 1 of one GPU."""

    fraction: Fraction

    def describe(self) -> str:
        """Say what was asked, as the user would write it."""
        return f"a share of {format_amount(self.fraction)}"


@dataclass(frozen=True, slots=True)
class MemoryShare:
    """A share of one GPU sized by memory, in bytes."""

    memory: Fraction

    def describe(self) -> str:
        """Say what was asked, as the user would write it."""
        return f"{format_memory(self.memory)} of GPU memory"


Ask = Whole | Share | MemoryShare


@dataclass(frozen=True, slots=True)
class Grant:
    """What a backend gives for an ask: integer resources, and the share of a GPU it costs.

    `charge` is the largest fraction of one GPU granted in any dimension (cores, memory
    blocks, MIG profile) times the number of GPUs: quota protects what the hardware gives.
    """

    resources: dict[str, int]
    charge: Fraction
    warnings: tuple[str, ...] = ()
    # For a class whose GPUs come through a ResourceClaim (`dra`): what the claim holds.
    claim: Held | None = None
    # For a class whose stack reads a share from pod annotations (`kai`): those annotations.
    annotations: dict[str, str] = field(default_factory=dict)
