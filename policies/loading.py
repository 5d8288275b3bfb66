"""Turn the text of `policy.yaml` or `quotas.yaml` into models, with errors that give the line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from policies.classes import BACKENDS
from policies.policy import Policy
from policies.quotas import QuotaConfig

M = TypeVar("M", bound=BaseModel)
_BACKEND_TAGS = {backend.backend_name() for backend in BACKENDS}


class ConfigError(ValueError):
    """A config file is not valid; `problems` lists each error with its line."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(problems))
        self.source = source
        self.problems = list(problems)


def load_policy(text: str, *, source: str = "policy.yaml") -> Policy:
    """Parse and validate a policy."""
    return _load(Policy, text, source)


def load_quotas(text: str, *, source: str = "quotas.yaml") -> QuotaConfig:
    """Parse and validate a quota config.

    An empty document is an error, never "no quotas": a file emptied by mistake, or caught
    half-written, must not switch every limit off. No quotas at all is `namespaces: {}`.
    """
    return _load(QuotaConfig, text, source, empty_hint=NO_QUOTAS_HINT)


NO_QUOTAS_HINT = "to have no quotas at all, write `namespaces: {}`"
# A config is a few kilobytes; a ConfigMap holds at most 1 MiB. Bounding the text and the
# nesting keeps a hostile or broken document from costing more than that to read, and a
# document nested deeper than any config needs from reaching the parser's recursion limit.
MAX_CONFIG_CHARACTERS = 1024 * 1024
MAX_NESTING = 64
# Aliases let a short document stand for a huge one ("billion laughs"); a config shares a
# block or two this way at most.
MAX_ALIASES = 100


def _load(model: type[M], text: str, source: str, *, empty_hint: str = "") -> M:
    if len(text) > MAX_CONFIG_CHARACTERS:
        raise ConfigError(
            source,
            [f"{source}: {len(text)} characters, over the {MAX_CONFIG_CHARACTERS} a config holds"],
        )
    root = _compose(text, source)
    if root is None or _is_null(root):
        hint = f"; {empty_hint}" if empty_hint else ""
        raise ConfigError(source, [f"{source}:1: the document is empty{hint}"])
    if not isinstance(root, yaml.MappingNode):
        line = root.start_mark.line + 1
        raise ConfigError(source, [f"{source}:{line}: expected a mapping at the top level"])
    if keys := _keys_not_text(root, source):
        raise ConfigError(source, keys)
    try:
        data = yaml.safe_load(text)
        return model.model_validate(data)
    except yaml.YAMLError as error:
        raise ConfigError(source, [_yaml_problem(error, source)]) from None
    except ValidationError as error:
        raise ConfigError(source, _describe(error, root, source)) from None
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


def _describe(error: ValidationError, root: yaml.Node | None, source: str) -> list[str]:
    problems = []
    for detail in error.errors(include_url=False):
        location = [str(part) for part in detail["loc"]]
        node, path = _find(root, location)
        line = node.start_mark.line + 1 if node is not None else 1
        message = detail["msg"].removeprefix("Value error, ")
        field = ".".join(path) or "(top level)"
        value = detail.get("input")
        shown = "" if isinstance(value, (dict, list)) or value is None else f" (got {value!r})"
        problems.append(f"{source}:{line}: {field}: {message}{shown}")
    return problems


def _find(root: yaml.Node | None, location: list[str]) -> tuple[yaml.Node | None, list[str]]:
    """Walk the YAML tree along a pydantic error location; return the deepest node found."""
    node: Any = root
    path: list[str] = []
    for part in location:
        child = _child(node, part)
        if child is None:
            if part in _BACKEND_TAGS or part in {"limits"}:
                continue  # a union tag or a field gpuadm adds: not in the file
            path.append(part)
            continue
        node = child
        path.append(part)
    return node, path


def _child(node: Any, part: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if str(key.value) == part:
                return value  # type: ignore[no-any-return]
    if isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
        return node.value[int(part)]  # type: ignore[no-any-return]
    return None
