"""Fuzzing the config reader with YAML graphs: anchors and aliases (shared blocks, loops,
blocks that repeat blocks), deep nesting and huge scalars, as a hostile or careless edit of
a ConfigMap makes them. Each text is read as `serve` reads it, within the read budget: it
must be a config or a `ConfigError` naming its line, and never overrun, crash or spin.
Cases come from a fixed seed, so every run tries the same ones.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import ConfigError, load_policy, load_quotas
from webhook.config.read_budget import ReadOverran, read_within_blocking

LEAVES = st.sampled_from(["1", "0.5", "a100", "t4", "enforce", "queue", "'*'", "null", "x"])


@st.composite
def graphs(draw: st.DrawFn) -> str:
    """A YAML text in flow style whose nodes may carry anchors, and aliases that name
    blocks already closed (sharing, repetition) or still open (a loop)."""
    closed: list[str] = []
    opened: list[str] = []
    budget = [draw(st.integers(min_value=1, max_value=60))]

    def node(depth: int) -> str:
        budget[0] -= 1
        choices = ["leaf", "alias", "huge", "deep", "repeat"]
        if depth < 6 and budget[0] > 0:
            choices += ["map", "list", "map", "list"]
        kind = draw(st.sampled_from(choices))
        if kind == "alias" and (closed or opened):
            return "*" + draw(st.sampled_from(closed + opened))
        if kind == "repeat" and closed:
            # A block of ten aliases of the latest block: a chain of these doubles ten-fold.
            anchor = f"n{len(closed) + len(opened)}"
            closed.append(anchor)
            return f"&{anchor} [" + ", ".join([f"*{closed[-2]}"] * 10) + "]"
        if kind == "huge":
            return "x" * draw(st.sampled_from([10_000, 300_000]))
        if kind == "deep":
            levels = draw(st.integers(min_value=1, max_value=120))
            return "[" * levels + "1" + "]" * levels
        if kind not in ("map", "list"):
            return draw(LEAVES)
        named: str | None = f"n{len(closed) + len(opened)}" if draw(st.booleans()) else None
        if named:
            opened.append(named)
        count = draw(st.integers(min_value=0, max_value=4))
        if kind == "map":
            keys = draw(
                st.lists(
                    st.sampled_from(["team-a", "a100", "t4", "k", "'*'"]),
                    min_size=count,
                    max_size=count,
                    unique=True,
                )
            )
            body = "{" + ", ".join(f"{key}: {node(depth + 1)}" for key in keys) + "}"
        else:
            body = "[" + ", ".join(node(depth + 1) for _ in range(count)) + "]"
        if named:
            opened.remove(named)
            closed.append(named)
        return f"&{named} {body}" if named else body

    field = draw(st.sampled_from(["namespaces", "default", "classes", "guard", "x"]))
    return f"{field}: {node(0)}\nmode: enforce\n"


@pytest.mark.parametrize("load", [load_quotas, load_policy], ids=["quotas", "policy"])
@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(text=graphs())
def test_any_yaml_graph_is_read_or_refused_with_its_line_within_the_budget(
    load: Callable[..., object], text: str
) -> None:
    read = functools.partial(load, text, source="c.yaml")
    problems: list[str] = []
    try:
        read_within_blocking(read, source="c.yaml")
    except ReadOverran as error:
        pytest.fail(f"the read overran its budget: {error}")
    except ConfigError as error:
        problems = error.problems or ["(a refusal with no reason)"]
    assert all(problem.startswith("c.yaml") for problem in problems), problems
