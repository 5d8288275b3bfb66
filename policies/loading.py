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
    """Parse and validate a quota config; an empty file means no quotas at all."""
    if not text.strip():
        return QuotaConfig()
    return _load(QuotaConfig, text, source)


def _load(model: type[M], text: str, source: str) -> M:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(source, [f"{where}: not valid YAML: {problem}"]) from None
    if not isinstance(data, dict):
        raise ConfigError(source, [f"{source}:1: expected a mapping at the top level"])
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(source, _describe(error, root, source)) from None


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
