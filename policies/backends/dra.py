"""Dynamic Resource Allocation: a class whose GPUs come through ResourceClaims.

A `dra` class is given to a container as a claim for whole devices of the class's
DeviceClass, selected by CEL on the driver's `productName` attribute (and any selectors the
admin adds), from a ResourceClaimTemplate that gpuadm keeps (`policies.dra_templates`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from policies.asks import Ask, Grant, Whole
from policies.class_base import ClassBase
from policies.dra_templates import REQUEST_NAME, ClaimTemplate
from policies.errors import Denial
from policies.models import dra_selector

# A DNS label, as a DeviceClass name and a driver name are made of.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# A claim's allocation holds at most this many devices (resource.k8s.io/v1
# AllocationResultsMaxSize): the scheduler cannot allocate a claim for more.
MAX_DEVICES = 32


class DraClass(ClassBase):
    """Whole GPUs of a DeviceClass, allocated by the scheduler through a ResourceClaim."""

    uses_memory: ClassVar[bool] = False
    holds_for_pod_lifetime: ClassVar[bool] = True
    claims_devices: ClassVar[bool] = True
    backend: Literal["dra"] = "dra"
    device_class_name: str = "gpu.nvidia.com"
    # The DRA driver whose attributes the selectors read (`device.attributes[driver]`).
    driver: str = "gpu.nvidia.com"
    # More CEL selectors, ANDed with the one on `models`: e.g. on memory capacity.
    selectors: list[str] = Field(default_factory=list)

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

    def resource_names(self) -> frozenset[str]:
        return frozenset()

    def gfd_products(self) -> list[str]:
        # The claim's selector picks the model; the pod needs no node affinity for it.
        return []

    def grant(self, ask: Ask) -> Grant:
        if not isinstance(ask, Whole):
            raise Denial(
                f"asks for {ask.describe()}, but backend dra gives whole GPUs only: a DRA "
                "driver shares a device between the containers of one claim, not between "
                "pods; ask for 1 or more"
            )
        if ask.count > MAX_DEVICES:
            raise Denial(f"asks for {ask.describe()}; a claim holds at most {MAX_DEVICES} devices")
        warnings: tuple[str, ...] = ()
        if ask.memory_cap is not None:
            warnings = ("backend dra cannot cap GPU memory: the memory request is ignored",)
        return Grant({}, Fraction(ask.count), warnings, devices=ask.count)

    def charge(self, resources: Mapping[str, Fraction]) -> Fraction:
        return Fraction(0)

    def claim_spec(self, count: int) -> dict[str, Any]:
        """Return the ResourceClaimSpec of a claim for `count` devices of the class."""
        expressions = [dra_selector(self.models, driver=self.driver)] if self.models else []
        expressions += self.selectors
        exactly: dict[str, Any] = {
            "deviceClassName": self.device_class_name,
            "allocationMode": "ExactCount",
            "count": count,
        }
        if expressions:
            exactly["selectors"] = [{"cel": {"expression": e}} for e in expressions]
        return {"devices": {"requests": [{"name": REQUEST_NAME, "exactly": exactly}]}}

    def device_classes(self) -> frozenset[str]:
        return frozenset({self.device_class_name})

    def claim_template(self, class_name: str, count: int) -> ClaimTemplate:
        return ClaimTemplate.named_for(class_name, count, self.claim_spec(count))
