"""A config's validation errors in its own words: each pydantic error placed on the line of
the key it is about, found by walking the YAML tree and the models together, and said as
the file spells it (`classes.a100.memory`, the keys a mapping may hold, a backend's name)."""

from __future__ import annotations

import re
import types
import typing
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from policies.classes.backends import BACKENDS
from policies.policy import Policy
from policies.quota.quotas import QuotaConfig
from policies.suggest import suggestion

_BACKEND_TAGS = {backend.backend_name() for backend in BACKENDS}
_BACKENDS_BY_TAG: dict[str, type[BaseModel]] = {b.backend_name(): b for b in BACKENDS}


class _Found:
    """Where a pydantic error location leads in the YAML tree, and the model there."""

    def __init__(self) -> None:
        self.line: int | None = None
        self.node: yaml.Node | None = None
        self.path: list[str] = []
        self.model: Any = None


def walk(root: yaml.Node | None, location: list[str], model: Any) -> _Found:
    """Follow a pydantic error location through the YAML tree and the models alike."""
    found = _Found()
    found.node, found.model = root, model
    if root is not None:
        found.line = root.start_mark.line + 1
    for part in location:
        if part == "[key]":
            continue  # the error is about the key itself, where the walk already is
        step = _type_step(found.model, part)
        key, child = _child(found.node, part)
        if child is None and (part in _BACKEND_TAGS or part == "limits"):
            found.model = step  # a union tag, or the field gpuadm adds: not in the file
            continue
        found.model = step
        found.path.append(part)
        if child is None:
            continue
        found.node = child
        found.line = (key or child).start_mark.line + 1
    return found


def _child(node: Any, part: str) -> tuple[yaml.Node | None, yaml.Node | None]:
    """Return (key, value) of a mapping's entry, or (None, item) of a sequence's."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if str(key.value) == part:
                return key, value
    if isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
        return None, node.value[int(part)]
    return None, None


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated and `| None` from a type, to what a value of it is."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _type_step(model: Any, part: str) -> Any:
    """Return the type one step down a location: a model's field, a dict's value, a list's
    item, or a backend of the class union."""
    model = _unwrap(model)
    if isinstance(model, type) and issubclass(model, BaseModel):
        for name, info in model.model_fields.items():
            if part in (name, info.alias):
                return info.annotation
        return None
    origin = typing.get_origin(model)
    if origin is dict:
        return typing.get_args(model)[1]
    if origin is list:
        return typing.get_args(model)[0]
    if part in _BACKENDS_BY_TAG:
        return _BACKENDS_BY_TAG[part]
    return None


# Fields a model fills from another key of the file, which the file never holds itself.
_NOT_IN_FILE = {"defaultBudget"}


def _keys_of(model: Any) -> list[str]:
    """Return the keys a model's mapping may hold, as the file spells them."""
    model = _unwrap(model)
    if isinstance(model, type) and issubclass(model, BaseModel):
        keys = [info.alias or name for name, info in model.model_fields.items()]
        return [key for key in keys if key not in _NOT_IN_FILE]
    return []


_BACKTICKED = re.compile(r"`([A-Za-z][A-Za-z0-9]*)`")
_WHAT = {Policy: "a policy", QuotaConfig: "a quota config"}


def _what(model: Any) -> str:
    model = _unwrap(model)
    if model in _WHAT:
        return _WHAT[model]
    tag = next((t for t, b in _BACKENDS_BY_TAG.items() if b is model), None)
    if tag is not None:
        return f"{'an' if tag[0] in 'aeiou' else 'a'} {tag} class"
    name = getattr(model, "__name__", "")
    return f"{name[0].lower()}{name[1:]}" if name else "this mapping"


# The problems said one by one, at most. Each is found by a walk of its mapping's keys, so
# saying 40,000 of them took minutes; an admin reads the first few, fixes, and checks again.
MAX_DESCRIBED = 50


def describe(
    error: ValidationError, root: yaml.Node | None, source: str, model: type[BaseModel]
) -> list[str]:
    """Say the first `MAX_DESCRIBED` validation errors at their lines, and how many more."""
    details = error.errors(include_url=False)
    problems: list[tuple[int, str]] = []
    for detail in details[:MAX_DESCRIBED]:
        line, text = _problem(detail, root, model)
        problems.append((line, f"{source}:{line}: {text}"))
    said = [problem for _, problem in sorted(problems, key=lambda p: p[0])]
    if len(details) > MAX_DESCRIBED:
        said.append(f"{source}: and {len(details) - MAX_DESCRIBED} more problems")
    return said


def _problem(
    detail: ErrorDetails, root: yaml.Node | None, model: type[BaseModel]
) -> tuple[int, str]:
    """Say one pydantic error in plain words, at the line of the key it is about."""
    location = [str(part) for part in detail["loc"]]
    kind = detail["type"]
    context: dict[str, Any] = dict(detail.get("ctx") or {})
    message = detail["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    value = detail.get("input")
    if kind == "extra_forbidden":
        parent = walk(root, location[:-1], model)
        here = walk(root, location, model)
        name = location[-1]
        keys = _keys_of(parent.model)
        field = ".".join(here.path)
        hint = suggestion(name, keys) or (
            f"; the keys of {_what(parent.model)} are: {', '.join(keys)}" if keys else ""
        )
        return here.line or 1, f"{field}: `{name}` is not a key of {_what(parent.model)}{hint}"
    found = walk(root, location, model)
    line = found.line or 1
    field = ".".join(found.path) or "(top level)"
    if kind == "union_tag_invalid":
        tag, tags = str(context.get("tag")), sorted(_BACKEND_TAGS)
        key, _ = _child(found.node, "backend")
        line = key.start_mark.line + 1 if key is not None else line
        return line, (
            f"{field}.backend: there is no backend {tag!r}{suggestion(tag, tags)} "
            f"(the backends: {', '.join(tags)})"
        )
    if kind == "union_tag_not_found":
        return line, (
            f"{field}: no `backend`: say which GPU stack serves the class, one of "
            f"{', '.join(sorted(_BACKEND_TAGS))}"
        )
    if kind == "missing":
        parent = walk(root, location[:-1], model)
        where = parent.line or 1
        return where, f"{field}: missing: {_what(parent.model)} needs `{location[-1]}`"
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str(context.get("expected", "")))
        return line, (
            f"{field}: {value!r} is not one of {', '.join(choices)}"
            f"{suggestion(str(value), choices)}"
        )
    at = context.get("at")
    if isinstance(at, (list, tuple)):
        deeper = walk(root, [*location, *(str(p) for p in at)], model)
        return deeper.line or line, f"{'.'.join(deeper.path)}: {message}"
    if kind == "value_error" and isinstance(found.node, yaml.MappingNode):
        # A check of the whole entry that names one of its keys: point at that key.
        for word in _BACKTICKED.findall(message):
            key, _ = _child(found.node, word)
            if key is not None:
                return key.start_mark.line + 1, f"{field}.{word}: {message}"
    shown = "" if isinstance(value, (dict, list)) or value is None else f" (got {value!r})"
    if kind in {"value_error", "assertion_error"} and f"{value!r}" in message:
        shown = ""
    return line, f"{field}: {message}{shown}"
