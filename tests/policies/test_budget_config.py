"""GPU-hour budgets in `quotas.yaml`: per namespace and under `default`, the classes they
name, and errors that give the file's line, the key and the value."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from policies import ConfigError, Policy, load_quotas
from policies.quota.budget import DAY, HOUR, Budget
from policies.quota.quotas import Terms

ENTRY = """\
mode: warn
default: {t4: 1}
namespaces:
  team-a:
    defaultClass: a100
    a100: 4
    budget: {a100: 500h/7d, "*": 900h/30d}
  team-b:
    a100: 2
"""


def test_a_namespace_entry_with_a_budget() -> None:
    quotas = load_quotas(ENTRY)
    budgets = {"a100": Budget(F(500 * HOUR), 7 * DAY), "*": Budget(F(900 * HOUR), 30 * DAY)}
    assert quotas.budgets_for("team-a") == budgets
    assert [str(b) for b in quotas.budgets_for("team-a").values()] == ["500h/7d", "900h/30d"]
    # The budget is not a limit, and the entry's other keys are as before.
    assert quotas.terms("team-a") == Terms({"a100": F(4)}, "warn", "a100", budgets)
    # An entry without a budget, and a namespace without an entry, have none.
    assert quotas.budgets_for("team-b") == {}
    assert quotas.budgets_for("elsewhere") == {}
    assert quotas.limits_for("elsewhere") == {"t4": 1}
    assert quotas.has_budgets()
    assert quotas.longest_window() == 30 * DAY


DEFAULT = """\
default:
  t4: 1
  budget:
    a100: 10h/1d
    "*": 90m / 2w
namespaces:
  team-a: {a100: 4}
  team-b: {budget: {h100: 100s/1h}}
"""


def test_default_budget_governs_namespaces_without_an_entry() -> None:
    quotas = load_quotas(DEFAULT)
    default = {"a100": Budget(F(10 * HOUR), DAY), "*": Budget(F(90 * 60), 14 * DAY)}
    assert quotas.default_budget == default
    assert quotas.budgets_for("elsewhere") == default
    assert str(quotas.budgets_for("elsewhere")["*"]) == "90m/2w"
    # `budget` is taken out of `default`: its limits are only the classes.
    assert quotas.default == {"t4": 1}
    assert quotas.limits_for("elsewhere") == {"t4": 1}
    # A namespace's own entry is all of its terms, as with limits: the default's budgets
    # do not apply to it.
    assert quotas.budgets_for("team-a") == {}
    assert quotas.limits_for("team-a") == {"a100": 4}
    assert quotas.budgets_for("team-b") == {"h100": Budget(F(100), HOUR)}
    assert quotas.has_budgets()
    assert quotas.longest_window() == 14 * DAY


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("namespaces: {}\n", id="no-namespaces"),
        pytest.param("default: {t4: 1}\nnamespaces:\n  team-a: {a100: 4}\n", id="limits-only"),
        pytest.param("default: {budget: {}}\nnamespaces:\n  team-a: {budget: {}}\n", id="empty"),
    ],
)
def test_a_config_without_budgets(text: str) -> None:
    quotas = load_quotas(text)
    assert not quotas.has_budgets()
    assert quotas.longest_window() == 0
    assert quotas.budgets_for("team-a") == {}
    assert quotas.budgets_for("elsewhere") == {}


def test_a_config_with_budgets_reads_back_as_dumped() -> None:
    quotas = load_quotas(DEFAULT)
    again = type(quotas).model_validate(quotas.model_dump(by_alias=True))
    assert again == quotas
    assert again.budgets_for("elsewhere") == quotas.budgets_for("elsewhere")
    assert str(again.budgets_for("elsewhere")["*"]) == "90m/2w"


def test_a_budget_naming_a_class_the_policy_lacks_is_reported(policy: Policy) -> None:
    quotas = load_quotas(
        "default:\n"
        "  budget: {b200: 1h/1d, a100: 1h/1d}\n"
        "namespaces:\n"
        "  team-a:\n"
        "    a100: 1\n"
        '    budget: {a1000: 1h/1d, "*": 2h/1d, t4: 1h/1d}\n'
    )
    assert quotas.unknown_class_paths(policy) == [
        (("default", "budget", "b200"), "no class 'b200' in the policy"),
        (
            ("namespaces", "team-a", "budget", "a1000"),
            "no class 'a1000' in the policy; did you mean `a100`?",
        ),
    ]
    assert quotas.unknown_classes(policy) == [
        "default.budget.b200: no class 'b200' in the policy",
        "namespaces.team-a.budget.a1000: no class 'a1000' in the policy; did you mean `a100`?",
    ]


_NOT_A_BUDGET = (
    "is not a GPU-hour budget: write GPU-hours over a window, e.g. 500h/7d "
    "(amount in h, m or s; window in w, d, h, m or s)"
)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param(
            "namespaces:\n  team-a:\n    a100: 4\n    budget:\n      a100: 500\n",
            f"quotas.yaml:5: namespaces.team-a.budget.a100: 500 {_NOT_A_BUDGET}",
            id="namespace-budget-without-units",
        ),
        pytest.param(
            "namespaces:\n"
            "  team-a:\n"
            "    budget:\n"
            "      t4: 1h/1d\n"
            "      a100: 0.0001h/7d\n"
            "  team-b: {}\n",
            "quotas.yaml:5: namespaces.team-a.budget.a100: '0.0001h/7d': the amount must be "
            "a whole number of GPU-seconds",
            id="namespace-budget-fraction-of-a-second",
        ),
        pytest.param(
            "namespaces:\n  team-a:\n    budget: {a100: 5h/400d}\n",
            "quotas.yaml:3: namespaces.team-a.budget.a100: '5h/400d': the window must be "
            "from 1s to 366d",
            id="namespace-budget-flow-mapping",
        ),
        pytest.param(
            "default:\n  t4: 1\n  budget:\n    a100: 5h/400d\n",
            "quotas.yaml:4: default.budget.a100: '5h/400d': the window must be from 1s to 366d",
            id="default-budget-window-too-long",
        ),
        pytest.param(
            "default:\n  budget:\n    a100: [1]\n",
            f"quotas.yaml:3: default.budget.a100: [1] {_NOT_A_BUDGET}",
            id="default-budget-a-list",
        ),
        pytest.param(
            "default:\n  budget:\n    a100: 5h/0d\n",
            "quotas.yaml:3: default.budget.a100: '5h/0d': the window must be from 1s to 366d",
            id="default-budget-zero-window",
        ),
        pytest.param(
            "namespaces:\n  team-a:\n    budget:\n      Bad_Key: 1h/1d\n",
            "quotas.yaml:4: namespaces.team-a.budget.Bad_Key: 'Bad_Key' is neither a class name "
            "(lowercase letters, digits and '-') nor '*'",
            id="namespace-budget-key-not-a-class-name",
        ),
        pytest.param(
            "default:\n  budget:\n    Bad_Key: 1h/1d\n",
            "quotas.yaml:3: default.budget.Bad_Key: 'Bad_Key' is neither a class name "
            "(lowercase letters, digits and '-') nor '*'",
            id="default-budget-key-not-a-class-name",
        ),
        pytest.param(
            "default:\n  budget: 500h/7d\n",
            "quotas.yaml:2: default.budget: '500h/7d' is not a mapping of class to budget, "
            "e.g. {a100: 500h/7d}",
            id="default-budget-not-a-mapping",
        ),
        pytest.param(
            "default:\n  budget: [a100, 500h/7d]\n",
            "quotas.yaml:2: default.budget: ['a100', '500h/7d'] is not a mapping of class to "
            "budget, e.g. {a100: 500h/7d}",
            id="default-budget-a-list-of-words",
        ),
    ],
)
def test_a_malformed_budget_is_refused_at_its_line(text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_quotas(text)
    assert raised.value.problems == [problem]


@pytest.mark.parametrize(
    ("text", "where", "value"),
    [
        pytest.param(
            "namespaces:\n  team-a:\n    a100: 1\n    budget: 500h/7d\n",
            "quotas.yaml:4: namespaces.team-a.budget: ",
            "'500h/7d'",
            id="namespace-budget-a-string",
        ),
        pytest.param(
            "namespaces:\n  team-a:\n    budget: [500h/7d]\n",
            "quotas.yaml:3: namespaces.team-a.budget: ",
            "dictionary",
            id="namespace-budget-a-list",
        ),
        pytest.param(
            "namespaces:\n  team-a:\n    budget: 5\n",
            "quotas.yaml:3: namespaces.team-a.budget: ",
            "5",
            id="namespace-budget-a-number",
        ),
    ],
)
def test_a_namespace_budget_that_is_not_a_mapping_is_refused_at_its_line(
    text: str, where: str, value: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_quotas(text)
    [problem] = raised.value.problems
    assert problem.startswith(where), problem
    assert value in problem.removeprefix(where), problem


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("default:\n  budget:\n", id="default-budget-empty"),
        pytest.param("default:\n  budget: ~\n", id="default-budget-null"),
    ],
)
def test_a_default_budget_of_nothing_is_refused_as_not_a_mapping(text: str) -> None:
    # `budget:` with nothing under it is no mapping of class to budget, refused as the
    # namespace entry's is; it is not a class called `budget` whose limit is no quantity.
    with pytest.raises(ConfigError) as raised:
        load_quotas(text)
    [problem] = raised.value.problems
    assert problem.startswith("quotas.yaml:2: default.budget: None is not a mapping"), problem


def test_a_budget_error_names_the_line_of_the_whole_file() -> None:
    # A block of a larger file (a ConfigMap's data) starting on line 20.
    text = "namespaces:\n  team-a:\n    budget:\n      t4: 1h/1d\n      a100: 3x/1d\n"
    with pytest.raises(ConfigError) as raised:
        load_quotas(text, source="gpuadm-config.yaml", first_line=20)
    assert raised.value.problems == [
        f"gpuadm-config.yaml:24: namespaces.team-a.budget.a100: '3x/1d' {_NOT_A_BUDGET}"
    ]


def test_every_malformed_budget_is_reported_each_at_its_line() -> None:
    text = (
        "namespaces:\n"
        "  team-a:\n"
        "    budget:\n"
        "      a100: 1h\n"
        "      t4: 1h/1d\n"
        "  team-b:\n"
        "    budget: {h100: 1h/999d}\n"
    )
    with pytest.raises(ConfigError) as raised:
        load_quotas(text)
    assert raised.value.problems == [
        f"quotas.yaml:4: namespaces.team-a.budget.a100: '1h' {_NOT_A_BUDGET}",
        "quotas.yaml:7: namespaces.team-b.budget.h100: '1h/999d': the window must be from "
        "1s to 366d",
    ]
