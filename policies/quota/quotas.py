"""The quota config: per-namespace limits per GPU class, in GPUs of that class."""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from functools import cached_property
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from policies.classes.class_base import Model, NamespaceName, quantity_schema
from policies.policy import CLASS_NAME, Policy
from policies.quantity import QuantityError, format_amount, parse_quantity
from policies.quota.budget import Budget, parse_budget
from policies.quota.cohorts import Cohort, Entry, Reclaim, build, problems
from policies.suggest import suggestion

ALL_CLASSES = "*"
# enforce: refuse what does not fit; warn: admit it with a warning; queue: hold it behind a
# scheduling gate until it fits (policies/quota/queue.py).
Mode = Literal["enforce", "warn", "queue"]
# How a queue namespace's line treats a gang not yet whole: besteffort lets smaller work pass
# it, strict lets nothing pass it (policies/quota/queue.py).
Queueing = Literal["besteffort", "strict"]
# Keys of a namespace's entry that are not limits.
ENTRY_KEYS = ("defaultClass", "mode", "queueing", "budget", "cohort", "borrow", "lend", "reclaim")
# The keys of an entry that say how it shares idle quota with its cohort.
COHORT_KEYS = ("cohort", "borrow", "lend", "reclaim")
# The keys of an entry that hold a mapping of class to amount, checked as limits' keys are.
CLASS_MAPS = ("budget", "borrow", "lend")
# The key of a namespace's entry, and of `default`, that holds its GPU-hour budgets.
BUDGET_KEY = "budget"


# A GPU count has no unit: a suffix that makes a size (Gi) or a multitude (k, M) of it is a
# memory size written where a count belongs (`t4: 1.5Gi` would be 1.6 billion GPUs).
_SIZE_SUFFIX = re.compile(r"^\s*([+-]?[0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)\s*$")


def _limit(value: object) -> Fraction:
    if isinstance(value, str) and (sized := _SIZE_SUFFIX.match(value)):
        raise ValueError(
            f"{value!r} is a size, not a number of GPUs: a limit counts GPUs of the class "
            f"(did you mean {sized.group(1)}?)"
        )
    try:
        amount = parse_quantity(value)
    except QuantityError as error:
        raise ValueError(str(error)) from None
    if amount < 0:
        raise ValueError(f"{value!r} is negative: a limit is 0 (none at all) or more")
    return amount


Limit = Annotated[
    Fraction, BeforeValidator(_limit), PlainSerializer(format_amount), quantity_schema(minimum=0)
]


# A cohort's name becomes part of its record's name and label (`Cohort.key`): a DNS label,
# short enough for a label's 63 characters with the record's prefix.
COHORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,48}[a-z0-9])?$")


def _cohort_name(value: str) -> str:
    if not COHORT_NAME.match(value):
        raise ValueError(
            f"{value[:80]!r} is not a cohort name: lowercase letters, digits and '-', "
            "starting and ending with a letter or digit, at most 50 characters"
        )
    return value


CohortName = Annotated[
    str,
    AfterValidator(_cohort_name),
    WithJsonSchema({"type": "string", "pattern": COHORT_NAME.pattern}),
]


def _budget(value: object) -> Budget:
    if isinstance(value, Budget):
        return value
    return parse_budget(value)


BudgetSpec = Annotated[
    Budget,
    BeforeValidator(_budget),
    PlainSerializer(str),
    # In the file, a budget is its text: GPU-hours in a window.
    WithJsonSchema({"type": "string", "description": "GPU-hours in a window, e.g. 500h/7d"}),
]


def limits_on(class_name: str, limits: Mapping[str, object]) -> list[str]:
    """Return the limits a class's pods count against: its own, and `*` (none: unlimited)."""
    return [key for key in (class_name, ALL_CLASSES) if key in limits]


def budgets_on(class_name: str, budgets: Mapping[str, Budget]) -> list[str]:
    """Return the GPU-hour budgets a class's pods spend: its own, and `*` (none: no budget)."""
    return [key for key in (class_name, ALL_CLASSES) if key in budgets]


def _check_limit_keys(limits: Mapping[str, object], *, under: tuple[str, ...] = ()) -> None:
    for key in limits:
        if key != ALL_CLASSES and not (isinstance(key, str) and CLASS_NAME.match(key)):
            raise PydanticCustomError(
                "limit_key",
                f"{key!r} is neither a class name (lowercase letters, digits and '-') nor "
                f"{ALL_CLASSES!r}",
                {"at": [*under, str(key)]},
            )


class Terms(NamedTuple):
    """What governs one namespace: its limits, its mode and its default class."""

    limits: Mapping[str, Fraction]
    mode: Mode
    default_class: str | None
    # GPU-hour budgets per class (and `*`): `policies.quota.gpu_hours`.
    budgets: Mapping[str, Budget] = {}
    queueing: Queueing = "besteffort"


def _entry_in_file(schema: dict[str, Any]) -> None:
    """The JSON schema of an entry as the file holds it: its limits beside its keys."""
    schema["additionalProperties"] = schema["properties"].pop("limits")["additionalProperties"]


def _config_in_file(schema: dict[str, Any]) -> None:
    """The JSON schema of the file: `default` holds the limits and, under `budget`, the
    budgets of namespaces without an entry."""
    budgets = schema["properties"].pop("defaultBudget")
    schema["properties"]["default"]["properties"] = {BUDGET_KEY: budgets}
    # A key no namespace can have matches none of the namespaces' pattern: refused.
    schema["properties"]["namespaces"]["additionalProperties"] = False


class NamespaceQuota(Model):
    """One namespace's entry: its default class, its mode, and a limit per class (and `*`)."""

    model_config = ConfigDict(json_schema_extra=_entry_in_file)

    default_class: str | None = None
    mode: Mode | None = None
    queueing: Queueing | None = None
    budget: dict[str, BudgetSpec] = Field(default_factory=dict)
    # The cohort it shares idle quota with, and how (policies/quota/cohorts.py).
    cohort: CohortName | None = None
    borrow: dict[str, Limit] = Field(default_factory=dict)
    lend: dict[str, Limit] = Field(default_factory=dict)
    reclaim: Reclaim | None = None
    limits: dict[str, Limit] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _split_limits(cls, data: Any) -> Any:
        # In the file, limits sit beside `defaultClass`, as a ResourceQuota's `hard` would.
        if not isinstance(data, Mapping) or "limits" in data:
            return data
        limits = {k: v for k, v in data.items() if k not in ENTRY_KEYS}
        _check_limit_keys(limits)
        for key in CLASS_MAPS:
            if isinstance(data.get(key), Mapping):
                _check_limit_keys(data[key], under=(key,))
        return {**{k: data[k] for k in ENTRY_KEYS if k in data}, "limits": limits}


class QuotaConfig(Model):
    """The whole `quotas.yaml`."""

    model_config = ConfigDict(json_schema_extra=_config_in_file)

    mode: Mode = "enforce"
    queueing: Queueing = "besteffort"
    default: dict[str, Limit] = Field(default_factory=dict)
    # `default.budget` in the file: the budgets of namespaces without an entry.
    default_budget: dict[str, BudgetSpec] = Field(default_factory=dict)
    namespaces: dict[NamespaceName, NamespaceQuota] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _default_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and ({"defaultBudget", "default_budget"} & set(data)):
            # The model's own name for `default.budget`, which the file never holds: taken
            # as a key, it was accepted, then replaced by `default.budget`.
            raise PydanticCustomError(
                "budget",
                "the budgets of namespaces without an entry go under `default`, as "
                "`default: {budget: {a100: 500h/7d}}`: this key is not one of a quota config",
                {"at": [next(k for k in ("defaultBudget", "default_budget") if k in data)]},
            )
        if not (isinstance(data, Mapping) and isinstance(data.get("default"), Mapping)):
            return data
        default = dict(data["default"])
        for key in COHORT_KEYS:
            if key in default:
                raise PydanticCustomError(
                    "cohort",
                    "a cohort's members are namespaces named under `namespaces`, so that "
                    f"every replica knows the same members: `{key}` does not go under "
                    "`default`",
                    {"at": ["default", key]},
                )
        if BUDGET_KEY not in default:
            _check_limit_keys(default, under=("default",))
            return data
        budget = default.pop(BUDGET_KEY)
        _check_limit_keys(default, under=("default",))
        if not isinstance(budget, Mapping):
            raise PydanticCustomError(
                "budget",
                f"{budget!r} is not a mapping of class to budget, e.g. {{a100: 500h/7d}}",
                {"at": ["default", BUDGET_KEY]},
            )
        _check_limit_keys(budget, under=("default", BUDGET_KEY))
        for key, value in budget.items():
            try:
                parse_budget(value)
            except ValueError as error:
                raise PydanticCustomError(
                    "budget", str(error), {"at": ["default", BUDGET_KEY, str(key)]}
                ) from None
        return {**data, "default": default, "defaultBudget": budget}

    @model_serializer(mode="wrap")
    def _as_in_file(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Dump as the file holds it: the budgets of namespaces without an entry under
        `default`, so that what is dumped reads back."""
        data = handler(self)
        if isinstance(data, dict):
            budget = data.pop("defaultBudget", None) or data.pop("default_budget", None)
            if budget:
                data["default"] = {**data.get("default", {}), BUDGET_KEY: budget}
        return data

    @model_validator(mode="after")
    def _cohorts_hold(self) -> QuotaConfig:
        for path, problem in problems(self._cohort_entries()):
            raise PydanticCustomError("cohort", problem, {"at": list(path)})
        return self

    def _cohort_entries(self) -> dict[str, Entry]:
        return {
            namespace: Entry(entry.cohort, entry.limits, entry.borrow, entry.lend, entry.reclaim)
            for namespace, entry in self.namespaces.items()
        }

    @cached_property
    def cohorts(self) -> dict[str, Cohort]:
        """The cohorts of the file, by name."""
        return build(self._cohort_entries())

    @cached_property
    def _cohort_of(self) -> dict[str, Cohort]:
        return {ns: cohort for cohort in self.cohorts.values() for ns in cohort.members}

    def cohort_of(self, namespace: str) -> Cohort | None:
        """Return the cohort a namespace is a member of, if any."""
        return self._cohort_of.get(namespace)

    def record_key(self, namespace: str) -> str:
        """Return the name of the record that holds a namespace's reservations: its
        cohort's, shared by all of its members, or its own."""
        cohort = self._cohort_of.get(namespace)
        return cohort.key if cohort is not None else namespace

    def terms(self, namespace: str) -> Terms:
        """Return what governs a namespace: its own entry, the rest from the file's."""
        return self._terms.get(namespace, self._default_terms)

    def limits_for(self, namespace: str) -> Mapping[str, Fraction]:
        """Return a namespace's limits: its own entry, or `default` when it has none."""
        return self.terms(namespace).limits

    def widest_limits_for(self, namespace: str) -> Mapping[str, Fraction]:
        """Return the limits a pod could ever fit in a namespace: its own, or for a cohort's
        member as wide as borrowing lets them be (`Cohort.widest`)."""
        widest = self._widest.get(namespace)
        return self.limits_for(namespace) if widest is None else widest

    @cached_property
    def _widest(self) -> dict[str, Mapping[str, Fraction]]:
        """Work out, once per config, each cohort member's widest limits: every gated or
        enforced admission of a member asks."""
        return {
            ns: cohort.widest(ns, self.limits_for(ns))
            for cohort in self.cohorts.values()
            for ns in cohort.members
        }

    def mode_for(self, namespace: str) -> Mode:
        """Return the namespace's mode: its own, or the file's."""
        return self.terms(namespace).mode

    def default_class_for(self, namespace: str) -> str | None:
        """Return the namespace's default class, if its entry names one."""
        return self.terms(namespace).default_class

    def budgets_for(self, namespace: str) -> Mapping[str, Budget]:
        """Return a namespace's GPU-hour budgets: its own entry's, or `default`'s."""
        return self.terms(namespace).budgets

    def has_budgets(self) -> bool:
        """Tell whether any namespace has a GPU-hour budget."""
        return bool(self.default_budget) or any(e.budget for e in self.namespaces.values())

    def longest_window(self) -> int:
        """Return the longest budget window in seconds (0: no budgets)."""
        return self._longest_window

    @cached_property
    def _longest_window(self) -> int:
        """Work out, once per config, the longest window: every judgement of a budget and
        every scrape asks, and the answer walks every namespace."""
        budgets = [*self.default_budget.values()]
        for entry in self.namespaces.values():
            budgets.extend(entry.budget.values())
        return max((b.window for b in budgets), default=0)

    @cached_property
    def _default_terms(self) -> Terms:
        return Terms(self.default, self.mode, None, self.default_budget, self.queueing)

    @cached_property
    def _terms(self) -> dict[str, Terms]:
        """Work out, once, the terms of every namespace with an entry of its own."""
        return {
            namespace: Terms(
                entry.limits,
                entry.mode if entry.mode is not None else self.mode,
                entry.default_class,
                entry.budget,
                entry.queueing if entry.queueing is not None else self.queueing,
            )
            for namespace, entry in self.namespaces.items()
        }

    def unknown_classes(self, policy: Policy) -> list[str]:
        """List every class this config names that the policy does not define."""
        return [
            f"{'.'.join(path)}: {problem}" for path, problem in self.unknown_class_paths(policy)
        ]

    def unknown_class_paths(self, policy: Policy) -> list[tuple[tuple[str, ...], str]]:
        """List (path of the key, problem) for every class this config names that the
        policy does not define, with the closest class it has."""
        problems: list[tuple[tuple[str, ...], str]] = []
        known = set(policy.classes)

        def unknown(name: str) -> str:
            return f"no class {name!r} in the policy{suggestion(name, known)}"

        for key in self.default:
            if key != ALL_CLASSES and key not in known:
                problems.append((("default", key), unknown(key)))
        for key in self.default_budget:
            if key != ALL_CLASSES and key not in known:
                problems.append((("default", BUDGET_KEY, key), unknown(key)))
        for namespace, entry in self.namespaces.items():
            for key in entry.limits:
                if key != ALL_CLASSES and key not in known:
                    problems.append((("namespaces", namespace, key), unknown(key)))
            maps = ((BUDGET_KEY, entry.budget), ("borrow", entry.borrow), ("lend", entry.lend))
            for kind, keys in maps:
                for key in keys:
                    if key != ALL_CLASSES and key not in known:
                        problems.append((("namespaces", namespace, kind, key), unknown(key)))
            if entry.default_class is not None and entry.default_class not in known:
                problems.append(
                    (("namespaces", namespace, "defaultClass"), unknown(entry.default_class))
                )
        return problems
