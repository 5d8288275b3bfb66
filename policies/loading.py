"""Turn the text of `policy.yaml` or `quotas.yaml` into models, with errors that give the line.

The text is read as YAML within bounds (size, nesting, aliases), refusing keys that are not
text or are given twice, then validated; `config_problems` says each validation error in
the file's words, at its line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from policies.config_problems import describe, walk
from policies.policy import Policy
from policies.quota.quotas import QuotaConfig

M = TypeVar("M", bound=BaseModel)


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
        root = yaml.compose(_placed(text, first_line), Loader=_Loader)
    except yaml.YAMLError:
        return None
    return walk(root, [str(part) for part in path], None).line


NO_QUOTAS_HINT = "to have no quotas at all, write `namespaces: {}`"
# A config is a few kilobytes; a ConfigMap holds at most 1 MiB. Bounding the text, the
# nesting and the nodes keeps a hostile or broken document from costing more than that to
# read, and a document nested deeper than any config needs from reaching the parser's
# recursion limit.
MAX_CONFIG_CHARACTERS = 1024 * 1024
MAX_NESTING = 64
# Aliases let a short document stand for a huge one ("billion laughs"); a config shares a
# block or two this way at most.
MAX_ALIASES = 100
# Every key, value and block, each alias counted as the whole block it stands for: what
# the checks below and the validators will walk. A config of 1,000 namespaces has ~10,000.
MAX_NODES = 200_000

# libyaml's parser where PyYAML was built with it: ten times faster on a large document.
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load(
    model: type[M], text: str, source: str, *, empty_hint: str = "", empty_line: int = 1
) -> M:
    if len(text) > MAX_CONFIG_CHARACTERS:
        raise ConfigError(
            source,
            [f"{source}: {len(text)} characters, over the {MAX_CONFIG_CHARACTERS} a config holds"],
        )
    _check_shape(text, source)
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
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
        data = loader.construct_document(root)
        return model.model_validate(data)
    except ConfigError:
        raise
    except yaml.YAMLError as error:
        raise ConfigError(source, [_yaml_problem(error, source, text)]) from None
    except ValidationError as error:
        raise ConfigError(source, describe(error, root, source, model)) from None
    except (TypeError, ValueError, RecursionError) as error:
        # A shape no check above foresaw: still a refused config, never a crashed reader.
        raise ConfigError(source, [f"{source}: cannot be read as a config: {error}"]) from None
    finally:
        loader.dispose()


def _check_shape(text: str, source: str) -> None:
    """Refuse, from the event stream and before any node is built or walked, what is not
    YAML, nests deeper than a config, uses too many aliases, refers to a block from inside
    it (a cycle, which every later walk would follow forever), or stands for more nodes
    than a config has once its aliases are counted as the blocks they repeat."""
    depth = aliases = nodes = 0
    # Per block still open: the nodes it holds so far, and its anchor.
    open_blocks: list[list[int]] = []
    open_anchors: list[str | None] = []
    sizes: dict[str, int] = {}  # a closed anchored block's size, aliases counted whole
    try:
        for event in yaml.parse(text, Loader=_Loader):
            added = 0
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_NESTING:
                    raise ConfigError(
                        source,
                        [f"{source}:{_line(event)}: nested deeper than {MAX_NESTING} levels"],
                    )
                open_blocks.append([1])
                open_anchors.append(event.anchor)
                nodes += 1
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
                (size,) = open_blocks.pop()
                if (anchor := open_anchors.pop()) is not None:
                    sizes[anchor] = size
                added = size
            elif isinstance(event, yaml.ScalarEvent):
                if event.anchor is not None:
                    sizes[event.anchor] = 1
                added = 1
                nodes += 1
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise ConfigError(source, [f"{source}: more than {MAX_ALIASES} aliases (*)"])
                if event.anchor in open_anchors:
                    raise ConfigError(
                        source,
                        [
                            f"{source}:{_line(event)}: the alias *{event.anchor} stands inside "
                            f"the block &{event.anchor} it names, a loop no config can hold"
                        ],
                    )
                added = sizes.get(str(event.anchor), 1)
                nodes += added
            if added and open_blocks:
                open_blocks[-1][0] += added
            if nodes > MAX_NODES:
                raise ConfigError(
                    source,
                    [
                        f"{source}:{_line(event)}: more than {MAX_NODES} keys and values, "
                        "counting each alias as the block it repeats"
                    ],
                )
    except yaml.YAMLError as error:
        raise ConfigError(source, [_yaml_problem(error, source, text)]) from None


def _line(event: yaml.Event) -> int:
    return event.start_mark.line + 1 if event.start_mark else 1


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


# libyaml's errors say less than PyYAML's own ("found character that cannot start any
# token", where PyYAML names the tab): a text this short is parsed again to say it better.
_REPARSED_FOR_WORDS = 64 * 1024


def _yaml_problem(error: yaml.YAMLError, source: str, text: str = "") -> str:
    if _Loader is not yaml.SafeLoader and len(text) <= _REPARSED_FOR_WORDS:
        try:
            yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError as worded:
            error = worded
    mark = getattr(error, "problem_mark", None)
    where = f"{source}:{mark.line + 1}" if mark is not None else source
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


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
