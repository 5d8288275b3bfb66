"""Turn the text of `policy.yaml` or `quotas.yaml` into models, with errors that give the line."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from policies.backends import BACKENDS
from policies.policy import Policy
from policies.quotas import QuotaConfig
from policies.suggest import suggestion

M = TypeVar("M", bound=BaseModel)
_BACKEND_TAGS = {backend.backend_name() for backend in BACKENDS}
_BACKENDS_BY_TAG: dict[str, type[BaseModel]] = {b.backend_name(): b for b in BACKENDS}


class ConfigError(ValueError):
    """A config file is not valid; `problems` lists each error with its line."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(problems))
        self.source = source
        self.problems = list(problems)


def load_policy(text: str, *, source: str = "policy.yaml", first_line: int = 1) -> Policy:
    """Parse and validate a policy.

    `first_line` is the line of the file on which `text` starts, when it is a block of a
    larger file (a ConfigMap, a Helm values file): every problem names the file's line.
    """
    return _load(Policy, _placed(text, first_line), source, empty_line=first_line)


def load_quotas(text: str, *, source: str = "quotas.yaml", first_line: int = 1) -> QuotaConfig:
    """Parse and validate a quota config.

    An empty document is an error, never "no quotas": a file emptied by mistake, or caught
    half-written, must not switch every limit off. No quotas at all is `namespaces: {}`.
    """
    return _load(
        QuotaConfig,
        _placed(text, first_line),
        source,
        empty_hint=NO_QUOTAS_HINT,
        empty_line=first_line,
    )


def _placed(text: str, first_line: int) -> str:
    # Blank lines in front put every node on the line it has in the whole file.
    return "\n" * max(0, first_line - 1) + text


def line_of(text: str, path: Sequence[str], *, first_line: int = 1) -> int | None:
    """Return the line of the key at `path` (e.g. namespaces, team-a, a200) in a config's
    text, or of the deepest key of it that is there; None if the text is not YAML."""
    try:
        root = yaml.compose(_placed(text, first_line), Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    return _walk(root, [str(part) for part in path], None).line


NO_QUOTAS_HINT = "to have no quotas at all, write `namespaces: {}`"
# A config is a few kilobytes; a ConfigMap holds at most 1 MiB. Bounding the text and the
# nesting keeps a hostile or broken document from costing more than that to read, and a
# document nested deeper than any config needs from reaching the parser's recursion limit.
MAX_CONFIG_CHARACTERS = 1024 * 1024
MAX_NESTING = 64
# Aliases let a short document stand for a huge one ("billion laughs"); a config shares a
# block or two this way at most.
MAX_ALIASES = 100


def _load(
    model: type[M], text: str, source: str, *, empty_hint: str = "", empty_line: int = 1
) -> M:
    if len(text) > MAX_CONFIG_CHARACTERS:
        raise ConfigError(
            source,
            [f"{source}: {len(text)} characters, over the {MAX_CONFIG_CHARACTERS} a config holds"],
        )
    root = _compose(text, source)
    if root is None or _is_null(root):
        hint = f"; {empty_hint}" if empty_hint else ""
        raise ConfigError(source, [f"{source}:{empty_line}: the document is empty{hint}"])
    if not isinstance(root, yaml.MappingNode):
        line = root.start_mark.line + 1
        raise ConfigError(source, [f"{source}:{line}: expected a mapping at the top level"])
    if keys := _keys_not_text(root, source):
        raise ConfigError(source, keys)
    if twice := _keys_twice(root, source):
        raise ConfigError(source, twice)
    try:
        data = yaml.safe_load(text)
        return model.model_validate(data)
    except yaml.YAMLError as error:
        raise ConfigError(source, [_yaml_problem(error, source)]) from None
    except ValidationError as error:
        raise ConfigError(source, _describe(error, root, source, model)) from None
    except (TypeError, ValueError, RecursionError) as error:
        # A shape no check above foresaw: still a refused config, never a crashed reader.
        raise ConfigError(source, [f"{source}: cannot be read as a config: {error}"]) from None


def _compose(text: str, source: str) -> yaml.Node | None:
    """Parse `text` to YAML nodes, refusing what is not YAML or nests deeper than a config."""
    depth = aliases = 0
    try:
        # Nesting is counted on the event stream, before any recursive step can run.
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_NESTING:
                    line = event.start_mark.line + 1 if event.start_mark else 1
                    raise ConfigError(
                        source, [f"{source}:{line}: nested deeper than {MAX_NESTING} levels"]
                    )
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise ConfigError(source, [f"{source}: more than {MAX_ALIASES} aliases (*)"])
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        raise ConfigError(source, [_yaml_problem(error, source)]) from None


def _keys_not_text(root: yaml.Node, source: str) -> list[str]:
    """Name each mapping key that YAML reads as something else than text (`1:`, `true:`)."""
    problems: list[tuple[int, str]] = []
    nodes = [root]
    while nodes:
        node = nodes.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if not (isinstance(key, yaml.ScalarNode) and key.tag == _TEXT):
                    line = key.start_mark.line + 1
                    shown = key.value if isinstance(key, yaml.ScalarNode) else "(a collection)"
                    problems.append(
                        (line, f"{source}:{line}: the key {shown} is not text to YAML; quote it")
                    )
                nodes.append(value)
        elif isinstance(node, yaml.SequenceNode):
            nodes.extend(node.value)
    return [problem for _, problem in sorted(problems)]


_TEXT = "tag:yaml.org,2002:str"


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _yaml_problem(error: yaml.YAMLError, source: str) -> str:
    mark = getattr(error, "problem_mark", None)
    where = f"{source}:{mark.line + 1}" if mark is not None else source
    problem = getattr(error, "problem", None) or str(error)
    return f"{where}: not valid YAML: {problem}"


def _keys_twice(root: yaml.Node, source: str) -> list[str]:
    """Name each key given twice in one mapping: YAML keeps the last, silently."""
    problems: list[tuple[int, str]] = []
    nodes: list[tuple[yaml.Node, list[str]]] = [(root, [])]
    while nodes:
        node, path = nodes.pop()
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else ""
                line = key.start_mark.line + 1
                if name in seen:
                    field = ".".join([*path, name])
                    problems.append(
                        (
                            line,
                            f"{source}:{line}: {field}: given twice (first on line "
                            f"{seen[name]}), and YAML keeps only the last; remove one",
                        )
                    )
                else:
                    seen[name] = line
                nodes.append((value, [*path, name]))
        elif isinstance(node, yaml.SequenceNode):
            nodes.extend((item, [*path, str(i)]) for i, item in enumerate(node.value))
    return [problem for _, problem in sorted(problems)]


class _Found:
    """Where a pydantic error location leads in the YAML tree, and the model there."""

    def __init__(self) -> None:
        self.line: int | None = None
        self.node: yaml.Node | None = None
        self.path: list[str] = []
        self.model: Any = None


def _walk(root: yaml.Node | None, location: list[str], model: Any) -> _Found:
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


def _keys_of(model: Any) -> list[str]:
    """Return the keys a model's mapping may hold, as the file spells them."""
    model = _unwrap(model)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [info.alias or name for name, info in model.model_fields.items()]
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


def _describe(
    error: ValidationError, root: yaml.Node | None, source: str, model: type[BaseModel]
) -> list[str]:
    problems: list[tuple[int, str]] = []
    for detail in error.errors(include_url=False):
        line, text = _problem(detail, root, model)
        problems.append((line, f"{source}:{line}: {text}"))
    return [problem for _, problem in sorted(problems, key=lambda p: p[0])]


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
        parent = _walk(root, location[:-1], model)
        here = _walk(root, location, model)
        name = location[-1]
        keys = _keys_of(parent.model)
        field = ".".join(here.path)
        hint = suggestion(name, keys) or (
            f"; the keys of {_what(parent.model)} are: {', '.join(keys)}" if keys else ""
        )
        return here.line or 1, f"{field}: `{name}` is not a key of {_what(parent.model)}{hint}"
    found = _walk(root, location, model)
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
        parent = _walk(root, location[:-1], model)
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
        deeper = _walk(root, [*location, *(str(p) for p in at)], model)
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
