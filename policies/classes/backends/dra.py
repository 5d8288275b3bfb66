"""Dynamic Resource Allocation: a class whose GPUs come through ResourceClaims.

A `dra` class is given to a container as a claim for whole devices of the class's
DeviceClass, selected by CEL on the driver's `productName` attribute (and any selectors the
admin adds), from a ResourceClaimTemplate that gpuadm keeps (`policies.pods.dra_templates`).

With `sharing`, a share of one device is a claim for part of its capacity (Kubernetes'
consumable capacity, KEP-5075: alpha `DRAConsumableCapacity` in 1.34). A driver publishes a
device that several claims may hold (`allowMultipleAllocations`) with capacities such as
`memory`; a claim asks for an amount of each (`capacity.requests`), and the scheduler places
claims on one device while their amounts fit. gpuadm sizes a share in hundredths of a device,
rounded down, asks that part of every capacity the class lists, rounded down to the
capacity's step (so that N shares of 1/N fit on one device) but never below one step, and
charges the share's hundredths or the largest part it asked of any capacity, whichever is
more: quota never holds less than the claim does. Whole devices of a sharing class ask all
of every capacity, so no share sits beside them.

What the drivers do, from their own code (docs/backends.md names each file):

- NVIDIA's DRA driver shares a device between claims only with `--consumable-shares`
  (feature gate `ConsumableShares`, its main branch): capacity `memory` in bytes, step 1Mi,
  and, with a number of shares, the capacity `shares`. Time-slicing between those claims is
  its opaque `GpuConfig` (gate `TimeSlicingSettings`), identical for every claim on a
  device. MPS it refuses beside consumable shares, and its released versions share a device
  (by MPS or time-slicing) only among the consumers of one claim: so no class here shares
  by MPS.
- HAMi's DRA driver (`hami-core-gpu.project-hami.io`) publishes `cores` (100, step 1) and
  `memory` (bytes, step 1Mi) on every device, and HAMi-core holds each claim to them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from policies.classes.asks import Ask, Grant, MemoryShare, Share, Whole
from policies.classes.class_base import (
    AmountOrObject,
    ClassBase,
    Model,
    ResourceName,
    quantity_schema,
)
from policies.classes.models import dra_selector
from policies.errors import Denial
from policies.pods.dra_templates import (
    DEVICE_CLASS_RESOURCE_PREFIX,
    PORTIONS,
    REQUEST_NAME,
    ClaimTemplate,
    Held,
)
from policies.quantity import (
    MiB,
    QuantityError,
    canonical_quantity,
    floor_div,
    format_bytes,
    parse_quantity,
)

# A DNS label, as a DeviceClass name and a driver name are made of.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A device capacity's name (resource.k8s.io QualifiedName): a C identifier of at most 32
# characters, with an optional DNS-subdomain prefix and '/'.
_CAPACITY_NAME = re.compile(r"^(?:[a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z_][A-Za-z0-9_]{0,31}$")
# A claim's allocation holds at most this many devices (resource.k8s.io/v1
# AllocationResultsMaxSize): the scheduler cannot allocate a claim for more.
MAX_DEVICES = 32
# NVIDIA's driver: its name, and the opaque configuration a claim carries
# (api/nvidia.com/resource/v1beta1).
NVIDIA_DRIVER = "gpu.nvidia.com"
NVIDIA_CONFIG_VERSION = "resource.nvidia.com/v1beta1"


def _amount(value: object) -> Fraction:
    try:
        amount = parse_quantity(value)
    except QuantityError as error:
        raise ValueError(str(error)) from None
    if amount <= 0 or amount.denominator != 1:
        raise ValueError(f"{value!r} must be a positive whole amount such as 80Gi or 100")
    return amount


Amount = Annotated[Fraction, BeforeValidator(_amount), quantity_schema(minimum=0)]


class Capacity(Model):
    """One capacity a device of the class publishes: all of it, and the step a share's
    request of it is rounded down to."""

    value: Amount
    # None: 1Mi for `memory` (what NVIDIA's and HAMi's drivers step memory by), else 1.
    step: Amount | None = None


def _capacity(value: object) -> object:
    # `memory: 80Gi` is short for `memory: {value: 80Gi}`.
    return {"value": value} if isinstance(value, str | int | float) else value


class Sharing(Model):
    """How a `dra` class shares one device between pods: by consumable capacity, with
    NVIDIA's time-slicing or without."""

    strategy: Literal["capacity", "time-slicing", "mps"]
    # What one device of the class publishes, by capacity name: a share asks its part of
    # each. A capacity the device has and this leaves out, each share takes at the driver's
    # default (often all of it).
    capacity: dict[str, Annotated[Capacity, BeforeValidator(_capacity), AmountOrObject()]]
    # time-slicing: NVIDIA's time slice (`timeSlicingConfig.interval`).
    interval: Literal["Default", "Short", "Medium", "Long"] | None = None

    @field_validator("strategy")
    @classmethod
    def _no_mps(cls, strategy: str) -> str:
        if strategy == "mps":
            raise ValueError(
                "mps cannot share a device between pods: NVIDIA's DRA driver runs one MPS "
                "server per claim and refuses MPS beside consumable shares, so only the "
                "containers of one claim share by MPS; use capacity or time-slicing"
            )
        return strategy

    @field_validator("capacity")
    @classmethod
    def _capacities(cls, capacity: dict[str, Capacity]) -> dict[str, Capacity]:
        if not capacity:
            raise ValueError(
                "lists no capacity; give what one device publishes, e.g. {memory: 80Gi}"
            )
        for name, entry in capacity.items():
            if not _CAPACITY_NAME.match(name):
                raise ValueError(
                    f"{name!r} is not a device capacity name such as memory or cores (a C "
                    "identifier of at most 32 characters, optionally after a DNS prefix and /)"
                )
            step = _step(name, entry)
            if entry.value < step:
                raise ValueError(
                    f"{name}: {format_bytes(entry.value)} is less than one step of "
                    f"{format_bytes(step)}"
                )
        return capacity

    @model_validator(mode="after")
    def _interval_for_time_slicing(self) -> Sharing:
        if self.interval is not None and self.strategy != "time-slicing":
            raise ValueError(f"interval is for strategy time-slicing, not {self.strategy}")
        return self

    def requests(self, portion: int) -> dict[str, Fraction]:
        """Return what a share of `portion` hundredths asks of each capacity (all of it for
        `PORTIONS`, a whole device): rounded down to the capacity's step, at least one."""
        asked = {}
        for name, entry in self.capacity.items():
            step = _step(name, entry)
            steps = max(1, int(entry.value * portion / PORTIONS // step))
            asked[name] = steps * step
        return asked

    def charge(self, portion: int) -> Fraction:
        """Return what a share of `portion` hundredths is charged: the share, or the largest
        part of any capacity it asks if that is more."""
        asked = self.requests(portion)
        parts = (asked[name] / entry.value for name, entry in self.capacity.items())
        return max(Fraction(portion, PORTIONS), *parts)

    def describe(self, portion: int) -> str:
        """Say what a share's claim asks of one device, as a message would."""
        asked = self.requests(portion)
        return ", ".join(
            f"{name} {canonical_quantity(asked[name])} of {canonical_quantity(entry.value)}"
            for name, entry in self.capacity.items()
        )

    def opaque_config(self, driver: str) -> list[dict[str, Any]]:
        """Return the `devices.config` a share's claim carries for the driver, if any."""
        if self.strategy != "time-slicing":
            return []
        parameters = {
            "apiVersion": NVIDIA_CONFIG_VERSION,
            "kind": "GpuConfig",
            "sharing": {
                "strategy": "TimeSlicing",
                "timeSlicingConfig": {"interval": self.interval or "Default"},
            },
        }
        return [
            {"requests": [REQUEST_NAME], "opaque": {"driver": driver, "parameters": parameters}}
        ]


def _step(name: str, entry: Capacity) -> Fraction:
    if entry.step is not None:
        return entry.step
    return Fraction(MiB) if name.rpartition("/")[2] == "memory" else Fraction(1)


class DraClass(ClassBase):
    """GPUs of a DeviceClass, allocated by the scheduler through a ResourceClaim: whole
    devices, or with `sharing` a share of one."""

    uses_memory: ClassVar[bool] = False
    holds_for_pod_lifetime: ClassVar[bool] = True
    claims_devices: ClassVar[bool] = True
    backend: Literal["dra"] = "dra"
    device_class_name: str = "gpu.nvidia.com"
    # The DRA driver whose attributes the selectors read (`device.attributes[driver]`).
    driver: str = "gpu.nvidia.com"
    # More CEL selectors, ANDed with the one on `models`: e.g. on memory capacity.
    selectors: list[str] = Field(default_factory=list)
    # The DeviceClass's own `extendedResourceName`, if it sets one (NVIDIA's chart sets
    # `nvidia.com/gpu`): a pod that asks for it gets whole devices of the class.
    extended_resource_name: ResourceName | None = None
    sharing: Sharing | None = None

    @field_validator("device_class_name", "driver")
    @classmethod
    def _dns_name(cls, value: str) -> str:
        if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
            raise ValueError(f"{value!r} is not a DNS subdomain such as gpu.nvidia.com")
        return value

    @field_validator("selectors")
    @classmethod
    def _selectors(cls, selectors: list[str]) -> list[str]:
        for selector in selectors:
            if not selector.strip():
                raise ValueError("a selector is an empty CEL expression")
        return selectors

    @field_validator("extended_resource_name")
    @classmethod
    def _own_resource_name(cls, name: str | None) -> str | None:
        if name is not None and name.startswith(DEVICE_CLASS_RESOURCE_PREFIX):
            raise ValueError(
                f"{name!r} is the name every DeviceClass has without one of its own; set "
                "extendedResourceName only to the name the DeviceClass's spec gives"
            )
        return name

    @model_validator(mode="after")
    def _sharing_fits(self) -> DraClass:
        if self.sharing is None:
            return self
        if not self.shareable:
            raise ValueError("sets sharing and shareable: false; remove one")
        if self.sharing.strategy == "time-slicing" and self.driver != NVIDIA_DRIVER:
            raise ValueError(
                f"strategy time-slicing writes NVIDIA's GpuConfig, which driver {self.driver} "
                f"does not read; use strategy capacity, or driver {NVIDIA_DRIVER}"
            )
        return self

    def resource_names(self) -> frozenset[str]:
        return frozenset(self.device_resources())

    def device_resources(self) -> tuple[str, ...]:
        """Return the resources with which a pod asks the scheduler itself for whole devices
        of the class's DeviceClass (DRA extended resources)."""
        implicit = DEVICE_CLASS_RESOURCE_PREFIX + self.device_class_name
        if self.extended_resource_name is None:
            return (implicit,)
        return (implicit, self.extended_resource_name)

    def gfd_products(self) -> list[str]:
        # The claim's selector picks the model; the pod needs no node affinity for it.
        return []

    def _memory(self) -> Fraction:
        capacity = self.sharing.capacity.get("memory") if self.sharing else None
        if capacity is None:
            raise Denial(
                "asks for GPU memory, but the class's sharing.capacity lists no memory to "
                "size a share with"
            )
        return capacity.value

    def grant(self, ask: Ask) -> Grant:
        if isinstance(ask, Share | MemoryShare):
            return self._share(ask)
        if ask.count > MAX_DEVICES:
            raise Denial(f"asks for {ask.describe()}; a claim holds at most {MAX_DEVICES} devices")
        warnings: tuple[str, ...] = ()
        if ask.memory_cap is not None:
            warnings = ("backend dra cannot cap GPU memory: the memory request is ignored",)
        return Grant({}, Fraction(ask.count), warnings, claim=Held(ask.count))

    def _share(self, ask: Share | MemoryShare) -> Grant:
        if self.sharing is None:
            raise Denial(
                f"asks for {ask.describe()}, but the class gives whole GPUs only: it sets no "
                "`sharing`, and a DRA driver shares a device between pods only by consumable "
                "capacity; ask for 1 or more"
            )
        # Rounded down (never to nothing): N shares of 1/N ask at most all of each capacity.
        portion = max(1, floor_div(self._share_fraction(ask) * PORTIONS, 1))
        if portion >= PORTIONS:
            return self.grant(Whole(1))
        return Grant({}, self.sharing.charge(portion), claim=Held.share(portion))

    def held_charge(self, held: Held) -> Fraction:
        # A share of a class that shares no longer holds at most its one device: charged so
        # until it ends, never less than it holds.
        if held.portion:
            return self.sharing.charge(held.portion) if self.sharing else Fraction(1)
        return Fraction(held.devices)

    def describe_claim(self, held: Held) -> str:
        if held.portion and self.sharing is not None:
            return f"a claim for {self.sharing.describe(held.portion)}"
        return super().describe_claim(held)

    def charge(self, resources: Mapping[str, Fraction]) -> Fraction:
        # Only `device_resources` are raw resources of the class, read as whole devices.
        return Fraction(0)

    def claim_spec(self, held: Held) -> dict[str, Any]:
        """Return the ResourceClaimSpec of a claim that holds `held` of the class."""
        expressions = [dra_selector(self.models, driver=self.driver)] if self.models else []
        expressions += self.selectors
        exactly: dict[str, Any] = {
            "deviceClassName": self.device_class_name,
            "allocationMode": "ExactCount",
            "count": held.devices,
        }
        if expressions:
            exactly["selectors"] = [{"cel": {"expression": e}} for e in expressions]
        devices: dict[str, Any] = {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}
        if self.sharing is not None:
            # A whole device asks all of every capacity: a driver's default for a capacity
            # left out may be less (NVIDIA's with a number of shares: one share, no memory).
            asked = self.sharing.requests(held.portion or PORTIONS)
            exactly["capacity"] = {
                "requests": {name: canonical_quantity(amount) for name, amount in asked.items()}
            }
            if held.portion and (config := self.sharing.opaque_config(self.driver)):
                devices["config"] = config
        return {"devices": devices}

    def device_classes(self) -> frozenset[str]:
        return frozenset({self.device_class_name})

    def share_configuration(self) -> str | None:
        if self.sharing is None:
            return None
        return json.dumps(self.sharing.opaque_config(self.driver), sort_keys=True)

    def claim_template(self, class_name: str, held: Held) -> ClaimTemplate | None:
        if held.portion and self.sharing is None:
            return None  # a share written while the class shared; it shares no longer
        return ClaimTemplate.named_for(class_name, held, self.claim_spec(held))
