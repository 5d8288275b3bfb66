"""The JSON types of the pod fields gpuadm reads, checked before anything reads them.

The apiserver decodes a pod into its typed structs before any webhook sees it, so a pod it
sends always has these types. But anyone who can reach the webhook can post any JSON, and
`gpuadm review` reads any YAML: annotations written as a list, a quantity that is an object,
a node selector term that is null or a value nested a thousand levels deep must be refused
with a message that names the field and shows the value, never end in a failure of gpuadm.

Only what gpuadm reads, or copies into its patch, is checked here; the rest of the pod is the
apiserver's to validate. `shown` is how every message of the core shows a user's value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from typing import Any

from policies.errors import Denial

# How much of a value a message shows: enough to recognise it, never a whole large value.
SHOWN_MAX = 60
# The deepest value gpuadm copies into its patch is a pod affinity term's values, eight
# levels below `spec.affinity`; twice that leaves room and keeps the patch within what the
# JSON encoder writes (255 levels).
MAX_NESTING = 16
# A resource name is a qualified name: a DNS prefix of up to 253 characters, "/", and a name
# of up to 63. Longer keys are no resource, and refusing them keeps what the policy
# remembers of the names it has classified small.
MAX_RESOURCE_NAME = 253 + 1 + 63
QUANTITY_TYPES = "a string such as 500m, 2 or 10Gi, or a number"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_NODE_TERMS = f"spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms"


def check_pod(pod: Mapping[str, Any]) -> None:
    """Refuse a pod whose fields that gpuadm reads have the wrong type, naming field and value."""
    check_metadata(pod)
    spec = _object(pod.get("spec"), "spec")
    for kind in ("initContainers", "containers"):
        for index, container in enumerate(_list(spec.get(kind), f"spec.{kind}")):
            _check_container(container, kind, index)
    for field in ("schedulerName", "nodeName"):
        _string(spec.get(field), f"spec.{field}")
    _check_affinity(spec.get("affinity"))
    for index, toleration in enumerate(_list(spec.get("tolerations"), "spec.tolerations")):
        field = f"spec.tolerations[{index}]"
        _bounded(_item(toleration, field, "a toleration (an object)"), field)
    claims = _list(spec.get("resourceClaims"), "spec.resourceClaims")
    _check_claims(claims, "spec.resourceClaims", _POD_CLAIM_FIELDS)


# The string fields of a pod's claim entry and of a container's claim, which gpuadm reads.
_POD_CLAIM_FIELDS = ("name", "resourceClaimName", "resourceClaimTemplateName")
_CONTAINER_CLAIM_FIELDS = ("name", "request")


def _check_claims(claims: list[Any], field: str, members: tuple[str, ...]) -> None:
    for index, claim in enumerate(claims):
        where = f"{field}[{index}]"
        claim = _item(claim, where, "a claim (an object with a name)")
        for member in members:
            _string(claim.get(member), f"{where}.{member}")
        _bounded(claim, where)


def check_metadata(pod: Mapping[str, Any], *, whose: str = "") -> None:
    """Refuse a pod whose metadata is not an object of the fields gpuadm reads, typed.

    `whose` begins each message, to tell the old pod of an update from the new one.
    """
    metadata = _object(pod.get("metadata"), f"{whose}metadata")
    for field in ("name", "generateName", "namespace", "uid"):
        if not _is_text(metadata.get(field)):
            _string(metadata.get(field), f"{whose}metadata.{field}")
    for field in ("labels", "annotations"):
        values = _object(metadata.get(field), f"{whose}metadata.{field}", "an object of strings")
        # Every pod has labels and annotations; the messages are written only for a bad one.
        for key, value in values.items():
            if type(key) is not str or type(value) is not str:
                _key(key, f"{whose}metadata.{field}")
                _string(value, f"{whose}metadata.{field}[{shown(key)}]", allow_null=False)


def check_update_shape(pod: Mapping[str, Any], *, whose: str = "") -> None:
    """Refuse a pod of an UPDATE whose metadata, spec or scheduling gates are not what every
    stored pod has: the update check reads those, and only those, of both pods."""
    check_metadata(pod, whose=whose)
    spec = _object(pod.get("spec"), f"{whose}spec")
    _list(spec.get("schedulingGates"), f"{whose}spec.schedulingGates")
    _list(spec.get("ephemeralContainers"), f"{whose}spec.ephemeralContainers")


def _check_container(container: object, kind: str, index: int) -> None:
    if type(container) is not dict:
        container = _item(container, f"spec.{kind}[{index}]", "a container (an object with a name)")
    name = container.get("name")
    restart_policy = container.get("restartPolicy")
    resources = container.get("resources")
    if (
        _is_text(name)
        and _is_text(restart_policy)
        and (resources is None or _plain_resources(resources))
    ):
        return  # every container of every pod the apiserver sends: nothing to name
    field = f"spec.{kind}[{index}]"
    _string(name, f"{field}.name")
    what = "container" if kind == "containers" else "init container"
    where = f'{what} "{clipped(name)}"' if name else field
    _string(restart_policy, f"{where}: restartPolicy")
    resources = _object(resources, f"{where}: resources")
    claims = _list(resources.get("claims"), f"{where}: resources.claims")
    _check_claims(claims, f"{where}: resources.claims", _CONTAINER_CLAIM_FIELDS)
    for side in ("limits", "requests"):
        for key, value in _object(resources.get(side), f"{where}: resources.{side}").items():
            _key(key, f"{where}: resources.{side}")
            if len(key) > MAX_RESOURCE_NAME:
                raise Denial(
                    f"{where}: resources.{side}: {shown(key)} ({len(key)} characters) is not a "
                    f"resource name, which has at most {MAX_RESOURCE_NAME}"
                )
            if isinstance(value, bool) or not isinstance(value, str | int | float):
                raise Denial(
                    f"{where}: resources.{side}[{shown(key)}]: {shown(value)} is not a "
                    f"quantity ({QUANTITY_TYPES})"
                )
    _bounded(resources, f"{where}: resources")


def _is_text(value: object) -> bool:
    return value is None or type(value) is str


def _plain_resources(resources: object) -> bool:
    """Tell whether resources are as the apiserver sends them: limits and requests that map
    short names to quantities, and claims, a list of objects of strings, nothing deeper."""
    if type(resources) is not dict:
        return False
    for side, amounts in resources.items():
        if side in ("limits", "requests"):
            if amounts is None:
                continue
            if type(amounts) is not dict:
                return False
            for key, value in amounts.items():
                if type(key) is not str or len(key) > MAX_RESOURCE_NAME:
                    return False
                if type(value) not in (str, int, float):
                    return False
        elif side == "claims":
            if amounts is not None and not (
                type(amounts) is list
                and all(
                    type(claim) is dict and all(type(v) is str for v in claim.values())
                    for claim in amounts
                )
            ):
                return False
        elif _nests_deeper(amounts, MAX_NESTING - 1):
            return False
    return True


def _check_affinity(value: object) -> None:
    """Refuse an affinity that gpuadm cannot AND the class's node requirements into."""
    affinity = _object(value, "spec.affinity")
    node_affinity = _object(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    required = _object(node_affinity.get(REQUIRED), f"spec.affinity.nodeAffinity.{REQUIRED}")
    for index, term in enumerate(_list(required.get("nodeSelectorTerms"), _NODE_TERMS)):
        field = f"{_NODE_TERMS}[{index}]"
        term = _item(term, field, "a node selector term (an object with matchExpressions)")
        for part in ("matchExpressions", "matchFields"):
            for number, requirement in enumerate(_list(term.get(part), f"{field}.{part}")):
                what = "a node selector requirement (an object with key, operator and values)"
                _item(requirement, f"{field}.{part}[{number}]", what)
    _bounded(affinity, "spec.affinity")


def _object(value: object, field: str, what: str = "an object") -> Mapping[str, Any]:
    """Return an optional object's value, empty if absent or null; refuse any other type."""
    if type(value) is dict:
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise Denial(f"{field}: {shown(value)} is not {what}")
    return value


def _list(value: object, field: str) -> list[Any]:
    """Return an optional list's value, empty if absent or null; refuse any other type."""
    if type(value) is list:
        return value
    if value is None:
        return []
    if not isinstance(value, list):
        raise Denial(f"{field}: {shown(value)} is not a list")
    return value


def _string(value: object, field: str, *, allow_null: bool = True) -> None:
    if isinstance(value, str) or (value is None and allow_null):
        return
    raise Denial(f"{field}: {shown(value)} is not a string")


def _key(key: object, field: str) -> None:
    # JSON keys are always strings, but YAML (`gpuadm review`) reads `1:` or `yes:` as others.
    if not isinstance(key, str):
        raise Denial(f"{field}: the key {shown(key)} is not a string")


def _item(value: object, field: str, what: str) -> Mapping[str, Any]:
    """Return an item of a list that must be an object, null included: it has no default."""
    if not isinstance(value, Mapping):
        raise Denial(f"{field}: {shown(value)} is not {what}")
    return value


def _bounded(value: Mapping[str, Any], field: str) -> None:
    """Refuse an object nested deeper than any pod field: gpuadm copies it into its patch."""
    for key, member in value.items():
        if _nests_deeper(member, MAX_NESTING - 1):
            raise Denial(
                f"{field}.{clipped(str(key))}: {shown(member)} nests lists and objects more than "
                f"{MAX_NESTING} levels deep, deeper than any field of a pod"
            )


def _nests_deeper(value: object, levels: int) -> bool:
    """Tell whether lists and objects nest in `value` more than `levels` deep.

    It stops looking at that depth, so its cost and its recursion are bounded by `levels`.
    """
    children: Iterable[object]
    if type(value) is str or value is None:
        return False
    if isinstance(value, Mapping):
        children = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return False
    if levels == 0:
        return True
    return any(_nests_deeper(child, levels - 1) for child in children)


def shown(value: object, limit: int = SHOWN_MAX) -> str:
    """Return a value as a message shows it, cut to `limit` characters with a mark.

    Strings are quoted as Python writes them (`'1.5'`), null and booleans as JSON does. A
    value may be as large or as deep as a review allows, so it is written only as far as the
    message shows it: the cost is bounded by `limit`, whatever the value.
    """
    parts: list[str] = []
    _write(value, parts, limit + 1)
    return clipped("".join(parts), limit)


def clipped(text: str, limit: int = SHOWN_MAX) -> str:
    """Return `text`, or its first `limit` - 1 characters and "…" when it is longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _write(value: object, parts: list[str], budget: int) -> int:
    """Append the text of `value` to `parts` until `budget` characters; return what is left.

    Every list or object costs at least its opening bracket, so recursion ends within
    `budget` levels.
    """
    if budget <= 0:
        return budget
    if isinstance(value, Mapping):
        pairs = [(_scalar(key, budget), item) for key, item in islice(value.items(), budget)]
        return _write_entries(pairs, parts, budget, "{}")
    if isinstance(value, list | tuple):
        return _write_entries([(None, item) for item in value[:budget]], parts, budget, "[]")
    text = _scalar(value, budget)
    parts.append(text)
    return budget - len(text)


def _write_entries(
    entries: Sequence[tuple[str | None, object]], parts: list[str], budget: int, brackets: str
) -> int:
    """Write the entries of a list (no keys) or an object (keys) between their brackets."""
    parts.append(brackets[0])
    budget -= 1
    for index, (key, item) in enumerate(entries):
        if budget <= 0:
            return budget
        prefix = (", " if index else "") + (f"{key}: " if key is not None else "")
        parts.append(prefix)
        budget = _write(item, parts, budget - len(prefix))
    parts.append(brackets[1])
    return budget - 1


def _scalar(value: object, budget: int) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value[:budget])
    if isinstance(value, int) and value.bit_length() > 200:
        # Python writes no integer of more than 4300 digits; this one is too large to show.
        return f"an integer of {value.bit_length()} bits"
    return repr(value)
