"""What every GPU class has, whatever its backend, and the config types the classes share.

Every backend in `policies.classes.backends` is a `ClassBase`; the union of them all is
`policies.classes.backends.GpuClass`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ModelWrapValidatorHandler,
    PlainSerializer,
    PrivateAttr,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from policies.classes.asks import Ask, Grant, MemoryShare, Share, Whole
from policies.classes.hardware import HARDWARE
from policies.classes.models import GFD_PRODUCT_LABEL, ClassModel, gfd_product, hami_device_type
from policies.errors import Denial
from policies.pods.dra_templates import ClaimTemplate, Held
from policies.pods.pod_view import ContainerView, PodView
from policies.quantity import (
    MAX_QUANTITY_CHARS,
    QUANTITY_PATTERN,
    QuantityError,
    format_amount,
    format_bytes,
    format_memory,
    parse_quantity,
)


class OneOrMany:
    """In the JSON schema (the chart's values.schema.json): one item alone as well as a list
    of them, as a before-validator that lists a lone item reads the file."""

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        listed = handler(core_schema)
        return {"anyOf": [listed["items"], listed]}


class AmountOrObject:
    """In the JSON schema: an amount alone (number or quantity text) as well as the object,
    as a before-validator that reads `memory: 80Gi` as `{value: 80Gi}` takes the file."""

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"anyOf": [{"type": "number"}, {"type": "string"}, handler(core_schema)]}


def _bytes(value: object) -> Fraction:
    try:
        amount = parse_quantity(value)
    except QuantityError as error:
        raise ValueError(str(error)) from None
    if amount <= 0:
        raise ValueError(f"{value!r} must be a positive amount of memory such as 16Gi")
    return amount


def quantity_schema(minimum: int | None = None) -> WithJsonSchema:
    """In the JSON schema: a quantity as the file may give it, a number or its text."""
    number: dict[str, Any] = {"type": "number"}
    if minimum is not None:
        number["minimum"] = minimum
    text = {"type": "string", "pattern": QUANTITY_PATTERN, "maxLength": MAX_QUANTITY_CHARS}
    return WithJsonSchema({"anyOf": [number, text]})


Bytes = Annotated[
    Fraction,
    BeforeValidator(_bytes),
    PlainSerializer(format_bytes),
    quantity_schema(minimum=0),
]
# Far less than any GPU has (the smallest have GiBs), and more than a GPU's memory written
# as a number without its unit, in GiB or MiB: `memory: 80` is 80 bytes, which charged half
# a GPU's 40Gi as 536 million GPUs.
SMALLEST_GPU_MEMORY = 2**20


def _gpu_memory(memory: Fraction) -> Fraction:
    """Refuse memory no GPU has: a number written without its unit."""
    if memory < SMALLEST_GPU_MEMORY:
        unit = "Gi" if memory < 1024 else "Mi"
        raise ValueError(
            f"{format_amount(memory)} bytes is less memory than any GPU has; give a unit "
            f"(did you mean {format_amount(memory)}{unit}?)"
        )
    return memory


GpuMemory = Annotated[Bytes, AfterValidator(_gpu_memory)]


def _least_memory(models: object) -> tuple[str, int] | None:
    """Return (model, MiB) of the model with the least memory among `models`, if each is a
    name whose memory gpuadm knows (`hardware.HARDWARE`); else None."""
    if not isinstance(models, list) or not models:
        return None
    found = []
    for model in models:
        known = HARDWARE.get(model) if isinstance(model, str) else None
        if known is None or known.memory_mib is None:
            return None
        found.append((known.memory_mib, model))
    mib, model = min(found)
    return model, mib


ResourceName = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[-A-Za-z0-9_.]+$")]
# A Kubernetes label value: the GPU Feature Discovery spelling of a model must be one.
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _gpu_name(name: str) -> str:
    # The stacks read comma-separated lists of these names, and match them as substrings.
    if not name or name != name.strip() or "," in name:
        raise ValueError(
            f"{name!r} is not a GPU name: write it as the driver reports it, e.g. "
            "`NVIDIA A100-SXM4-80GB`, without commas or surrounding spaces"
        )
    return name


GpuName = Annotated[str, AfterValidator(_gpu_name)]
# A namespace name (DNS-1123 label): a key of another form matches no namespace.
NAMESPACE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def namespace_name(name: str) -> str:
    """Refuse a key no namespace can have: gpuadm would never apply its entry."""
    if not NAMESPACE_NAME.match(name):
        fixed = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
        hint = f" (did you mean {fixed!r}?)" if fixed and NAMESPACE_NAME.match(fixed) else ""
        raise ValueError(
            f"{name!r} is not a namespace name, so no namespace matches it: a namespace is "
            f"lowercase letters, digits and '-', at most 63 characters{hint}"
        )
    return name


NamespaceName = Annotated[
    str,
    AfterValidator(namespace_name),
    WithJsonSchema({"type": "string", "pattern": NAMESPACE_NAME.pattern}),
]


class Model(BaseModel):
    """Strict, immutable, camelCase on the wire: a typo in the config is an error, not a no-op."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class Toleration(Model):
    """A toleration added to every pod of the class (the fields of a core/v1 Toleration)."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None

    def as_pod_field(self) -> dict[str, Any]:
        """Return the toleration as it appears in a pod spec."""
        return self.model_dump(by_alias=True, exclude_none=True)


class DevicesConfigMaps(NamedTuple):
    """The ConfigMaps through which a GPU stack hands a share's container its GPUs (KAI's
    binder writes `NVIDIA_VISIBLE_DEVICES` into them, in the pod's namespace)."""

    # The names the stack gives them, as a pattern that both Python's `re` and the
    # apiserver's CEL (RE2) read alike: the shipped webhook routes their writes by it.
    names: re.Pattern[str]
    # Who writes them, as messages name it.
    writer: str


class ClassBase(Model):
    """What every class has, whatever its backend."""

    uses_memory: ClassVar[bool] = True
    default_scheduler: ClassVar[str | None] = None
    # True where the pod holds each container's GPUs for its whole life (DRA claims are
    # allocated at scheduling, init containers' too): the pod is charged their sum, not the
    # effective request of Kubernetes' init-container rule.
    holds_for_pod_lifetime: ClassVar[bool] = False
    # True where the class's GPUs come through a ResourceClaim of gpuadm's template
    # (`claim_template`), not through extended resources.
    claims_devices: ClassVar[bool] = False
    # The GPU stack whose in-container limiter (HAMi-core) holds the class's pods to their
    # resources, as messages name it, or None: in such pods the guard refuses the variables
    # that switch the limiter off (`guard.isolationSwitches`).
    limiter: ClassVar[str | None] = None
    # The pod annotations with which the class's stack reads a GPU request from the pod
    # rather than from its containers' resources (KAI's `gpu-fraction`): gpuadm writes them,
    # reads them back as the pod's demand (`read_request`), and lets no one else change them.
    request_annotations: ClassVar[tuple[str, ...]] = ()
    # The ConfigMaps through which the class's stack hands a share's container its GPUs, or
    # None: in a namespace gpuadm governs only `gpuStackUsers` write them
    # (`guard.allocationAnnotations`), and the guard lets a container read its GPUs only from
    # one of these (`stack_devices_env`).
    devices_config_maps: ClassVar[DevicesConfigMaps | None] = None

    memory: GpuMemory | None = None
    models: list[GpuName] | None = None
    node_selector: dict[str, list[str]] = Field(default_factory=dict)
    scheduler_name: str | None = None
    tolerations: list[Toleration] = Field(default_factory=list)
    shareable: bool = True
    # The model whose hardware gave `memory`, when the policy gives none (`memory_source`).
    _memory_of: str | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _memory_of_models(cls, data: Any, handler: ModelWrapValidatorHandler[ClassBase]) -> Any:
        """Without `memory`, a class whose stack sizes shares by memory takes the least its
        models' hardware reports, when gpuadm knows it for each of them."""
        found = None
        if cls.uses_memory and isinstance(data, Mapping) and data.get("memory") is None:
            found = _least_memory(data.get("models"))
        made = handler({**data, "memory": f"{found[1]}Mi"} if found else data)
        if found is not None and isinstance(made, ClassBase):
            made._memory_of = found[0]
        return made

    @property
    def memory_source(self) -> str | None:
        """Return the model whose hardware gave the class its memory, or None when the
        policy gives it."""
        return self._memory_of

    @model_validator(mode="after")
    def _memory_when_needed(self) -> ClassBase:
        if self.uses_memory and self.shareable and self.memory is None:
            raise ValueError(
                f"backend {self.backend_name()} needs `memory` (the memory of one GPU, e.g. "
                "16Gi) to size shares; set it, or set `shareable: false` (it may be left out "
                "only when gpuadm knows the memory of each of the class's models, as "
                "`gpuadm models` lists them)"
            )
        for key, values in self.node_selector.items():
            if not values:
                raise ValueError(f"nodeSelector {key!r} lists no values")
        return self

    @model_validator(mode="after")
    def _models_valid(self) -> ClassBase:
        if self.models is None:
            return self
        if not self.models:
            raise ValueError("`models` lists no GPU model; list them, or remove the key")
        if len(set(self.models)) != len(self.models):
            raise ValueError(f"`models` lists a model twice: {', '.join(self.models)}")
        for model, product in zip(self.models, self.gfd_products(), strict=False):
            if len(product) > 63 or not LABEL_VALUE.match(product):
                raise ValueError(
                    f"model {model!r} would be labelled {GFD_PRODUCT_LABEL}={product}, which "
                    "is not a valid label value, so no node carries it; name the nodes with "
                    f"`nodeSelector: {{{GFD_PRODUCT_LABEL}: [...]}}` instead"
                )
        return self

    @classmethod
    def backend_name(cls) -> str:
        """Return the name of the backend as written in the policy."""
        field = cls.model_fields["backend"]
        return str(field.default)

    @property
    def scheduler(self) -> str | None:
        """Return the scheduler the class's pods must use, or None for 'whatever they name'."""
        return self.scheduler_name or self.default_scheduler

    def scheduler_in(self, namespace: str | None) -> str | None:
        """Return the scheduler the class's pods must use in `namespace` (None: any)."""
        return self.scheduler

    def pod_labels(self, namespace: str | None) -> Mapping[str, str]:
        """Return the labels every pod of the class gets in `namespace`, besides gpuadm's."""
        return {}

    def namespaces_of_their_own(self) -> frozenset[str]:
        """Return the namespaces whose pods the class treats differently from the rest."""
        return frozenset()

    def read_request(self, pod: PodView) -> tuple[Ask, ContainerView]:
        """Read the GPU request the pod's `request_annotations` make, and the container it is
        for; raise `Denial`. Called only for a class that has request annotations, on a pod
        that carries one."""
        raise NotImplementedError

    def request_container_annotations(self, container: str) -> Mapping[str, str]:
        """Return the annotations that tell the stack which container, named `container`,
        the request of a grant's `annotations` is for."""
        return {}

    def stack_devices_env(
        self, pod: PodView, annotations: Mapping[str, Any]
    ) -> tuple[ContainerView, Mapping[str, Any]] | None:
        """Return the container and the `NVIDIA_VISIBLE_DEVICES` env entry through which the
        class's stack itself hands a pod its GPU, or None: the guard lets that one entry be.

        `annotations` are the pod's as gpuadm leaves them (with the share it writes).
        """
        return None

    def owns(self, resource: str) -> bool:
        """Tell whether a raw resource name belongs to this class's backend."""
        return resource in self.resource_names()

    def resource_names(self) -> frozenset[str]:
        """Return every extended resource this backend uses."""
        raise NotImplementedError

    def resource_prefixes(self) -> tuple[str, ...]:
        """Return the prefixes of resource names the backend makes up (MIG profiles)."""
        return ()

    def pod_annotations(self, class_name: str, others: Sequence[ClassModel]) -> Mapping[str, str]:
        """Return the annotations every pod of the class gets, such as the GPU models the
        stack may give it; `others` are the GPU models the policy's other classes list."""
        return {}

    def placement_annotations(self) -> Mapping[str, str]:
        """Return the annotations that tell the stack's scheduler which of the class's GPUs
        to prefer (HAMi's binpack or spread); they give no GPU outside the class."""
        return {}

    def gputype_entries(self) -> list[str]:
        """Return the names the class's GPUs are known by to HAMi and Volcano."""
        return [hami_device_type(model) for model in self.models or ()]

    @property
    def gputypes_as_written(self) -> bool:
        """Tell whether the class writes GPU types into `use-gputype` as the admin typed them."""
        return False

    def check_gpu_types(self, class_name: str, others: Mapping[str, ClassBase]) -> None:
        """Refuse GPU types of the class that would also pick another class's GPUs (or let
        it pick theirs); raise ValueError. Only a class whose pods carry `use-gputype` can."""

    def policy_warnings(self, class_name: str, annotations: Mapping[str, str]) -> list[str]:
        """Return what the admin should know of the class, given the annotations its pods get."""
        return []

    def device_resources(self) -> tuple[str, ...]:
        """Return the resources with which a pod asks the scheduler itself for whole devices
        of the class (DRA extended resources): none but for a dra class."""
        return ()

    def share_configuration(self) -> str | None:
        """Return the driver configuration the class's shares of one device carry, as text
        that compares equal for equal configurations ("" for none), or None for a class that
        does not share devices by claims."""
        return None

    def device_classes(self) -> frozenset[str]:
        """Return the DeviceClasses the class claims its GPUs from (`claims_devices`)."""
        return frozenset()

    def held_charge(self, held: Held) -> Fraction:
        """Return what a stored claim of the class that holds `held` is charged, whatever
        today's policy would give: never less than it holds."""
        return Fraction(held.devices)

    def describe_claim(self, held: Held) -> str:
        """Say what a claim of the class that holds `held` asks, as a message would."""
        return f"a claim for {held.describe()}"

    def claim_template(self, class_name: str, held: Held) -> ClaimTemplate | None:
        """Return the ResourceClaimTemplate gpuadm keeps for claims of the class that hold
        `held`, or None for a class whose GPUs are not claimed (or that gives no such share)."""
        return None

    def check_containers(
        self, class_name: str, containers: Sequence[tuple[str, Ask | None]]
    ) -> None:
        """Refuse a pod whose `containers`, each asking for GPUs of the class (named as
        messages name them, with what each asks, None for raw resources), are more than the
        backend can give to; raise `Denial`."""

    def grant(self, ask: Ask) -> Grant:
        """Turn an ask into this backend's resources.

        A share is rounded down to the units the stack counts (never to nothing), so that N
        shares of 1/N fit one GPU as the stack's scheduler fits them; its charge is what the
        stack grants, so a limit of one GPU admits exactly the shares that fit on one.
        """
        raise NotImplementedError

    def memory_unit_of(self, name: str) -> str | None:
        """Return the unit in which the stack counts GPU memory in resource (or request
        annotation) `name`, as messages name it (`MiB`), or None where `name` is no memory."""
        return None

    def charge(self, resources: Mapping[str, Fraction]) -> Fraction:
        """Return how many GPUs of the class the given raw resources of one container hold."""
        raise NotImplementedError

    def gfd_products(self) -> list[str]:
        """Return the `nvidia.com/gpu.product` values GPU Feature Discovery gives `models`.

        Empty when `nodeSelector` names that label itself: the admin's values are kept as
        they are.
        """
        if not self.models or GFD_PRODUCT_LABEL in self.node_selector:
            return []
        return [gfd_product(model, shared=self._gfd_shared()) for model in self.models]

    def _gfd_shared(self) -> bool:
        return False

    @cached_property
    def node_expressions(self) -> list[dict[str, Any]]:
        """Return `nodeSelector` and `models` as nodeSelectorRequirements, one per label."""
        selector = dict(self.node_selector)
        if products := self.gfd_products():
            selector[GFD_PRODUCT_LABEL] = products
        return [
            {"key": key, "operator": "In", "values": list(values)}
            for key, values in sorted(selector.items())
        ]

    @cached_property
    def toleration_fields(self) -> list[dict[str, Any]]:
        """Return the class's tolerations as they appear in a pod spec."""
        return [toleration.as_pod_field() for toleration in self.tolerations]

    def share_of(self, ask: Ask) -> Fraction:
        """Return the number of GPUs the user asked for, before any rounding."""
        if isinstance(ask, Whole):
            return Fraction(ask.count)
        if isinstance(ask, Share):
            return ask.fraction
        return ask.memory / self._memory()

    def _memory(self) -> Fraction:
        if self.memory is None:
            raise Denial("asks for a share, but the class has no `memory` to size it with")
        return self.memory

    def _share_fraction(self, ask: Share | MemoryShare) -> Fraction:
        if isinstance(ask, Share):
            return ask.fraction
        memory = self._memory()
        if ask.memory > memory:
            raise Denial(
                f"asks for {format_memory(ask.memory)} of GPU memory but one GPU of the class "
                f"has {format_memory(memory)}"
            )
        return ask.memory / memory


def describe_resources(cls: ClassBase, resources: Mapping[str, int]) -> str:
    """Write resources as `name: value` pairs for a message, memory with its unit."""
    return ", ".join(_described(cls, name, value) for name, value in sorted(resources.items()))


def _described(cls: ClassBase, name: str, value: object) -> str:
    unit = cls.memory_unit_of(name)
    return f"{name}: {value} {unit}" if unit else f"{name}: {value}"


def rounding_warning(cls: ClassBase, class_name: str, ask: Ask, grant: Grant) -> str | None:
    """Return a warning when a share's grant is more or less than the ask, else None."""
    asked = cls.share_of(ask)
    if grant.charge == asked or (isinstance(ask, Whole) and grant.charge < asked):
        return None
    granted = [describe_resources(cls, grant.resources)] if grant.resources else []
    granted += [
        f"annotation {_described(cls, key, value)}" for key, value in grant.annotations.items()
    ]
    if grant.claim is not None:
        granted.append(cls.describe_claim(grant.claim))
    charged = format_amount(grant.charge)
    if grant.charge > asked:
        return (
            f"{ask.describe()} of {class_name} rounded up to {charged} GPU "
            f"({', '.join(granted)}); quota is charged {charged}"
        )
    return (
        f"{ask.describe()} of {class_name} rounded down to {charged} GPU "
        f"({', '.join(granted)}), so that shares adding up to one GPU fit on one; quota is "
        f"charged {charged}"
    )
