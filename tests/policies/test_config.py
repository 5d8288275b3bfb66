"""Policy and quota configs: what loads, and errors that give line, field and value."""

from __future__ import annotations

from fractions import Fraction

import pytest
import yaml

from policies import ConfigError, Policy, load_policy, load_quotas
from policies.classes.backends import HamiClass, MigClass
from tests.builders import ALIAS_CYCLE, LAUGHS


def problems_of(loader: object, text: str) -> list[str]:
    with pytest.raises(ConfigError) as error:
        loader(text)  # type: ignore[operator]
    return error.value.problems


def test_spec_example_policy_loads(policy: Policy) -> None:
    assert set(policy.classes) == {"a100", "t4", "h100", "a100-mig", "v100", "l4", "a10"}
    a100 = policy.classes["a100"]
    assert isinstance(a100, HamiClass)
    assert a100.memory == 80 * 2**30
    assert a100.scheduler == "hami-scheduler"
    mig = policy.classes["a100-mig"]
    assert isinstance(mig, MigClass)
    assert mig.profile_share("1g.10gb") == Fraction(1, 7)


def test_a_policy_may_have_no_classes() -> None:
    """`classes: {}` is said on purpose (the Helm chart's default): nothing to rewrite or
    charge. Leaving `classes` out is still an error, as an emptied file is."""
    assert load_policy("classes: {}\n").classes == {}
    assert any("classes" in problem for problem in problems_of(load_policy, "domain: a.io\n"))
    assert any(
        "defaultClass 't4' is not a class (classes: none)" in problem
        for problem in problems_of(load_policy, "defaultClass: t4\nclasses: {}\n")
    )


def test_the_bundled_example_is_valid() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    policy = load_policy((root / "examples/policy.yaml").read_text())
    quotas = load_quotas((root / "examples/quotas.yaml").read_text())
    assert quotas.unknown_classes(policy) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "classes:\n  a:\n    backend: hami\n",
            "policy.yaml:2: classes.a: backend hami needs `memory`",
            id="hami-share-needs-memory",
        ),
        pytest.param(
            "classes:\n  a:\n    backend: gpu-manager\n    memory: lots\n",
            "policy.yaml:4: classes.a.memory: 'lots' is not a quantity",
            id="memory-not-a-quantity",
        ),
        pytest.param(
            "classes:\n  a:\n    backend: cuda\n",
            "policy.yaml:3: classes.a.backend: there is no backend 'cuda' (the backends: cgpu, ",
            id="unknown-backend",
        ),
        pytest.param(
            "classes:\n  a:\n    backend: nvidia\n    nodeSelecter: {}\n",
            "policy.yaml:4: classes.a.nodeSelecter: `nodeSelecter` is not a key of a nvidia class; "
            "did you mean `nodeSelector`?",
            id="misspelt-key",
        ),
        pytest.param(
            "defaultClass: b\nclasses:\n  a:\n    backend: nvidia\n",
            "defaultClass 'b' is not a class",
            id="default-class-unknown",
        ),
        pytest.param(
            "classes:\n  A_100:\n    backend: nvidia\n",
            "class name 'A_100' must be lowercase",
            id="class-name-invalid",
        ),
        pytest.param(
            "classes:\n  a-memory:\n    backend: nvidia\n",
            "must not end in '-memory'",
            id="class-name-clashes-with-memory-key",
        ),
        pytest.param(
            "domain: Not_A_Domain\nclasses:\n  a:\n    backend: nvidia\n",
            "policy.yaml:1: domain: 'Not_A_Domain' is not a DNS subdomain",
            id="bad-domain",
        ),
        pytest.param(
            "classes:\n  a:\n    backend: mig\n    memory: 80Gi\n    profiles: {}\n",
            "backend mig needs at least one profile",
            id="mig-without-profiles",
        ),
        pytest.param(
            "classes:\n  a:\n    backend: mig\n    memory: 80Gi\n    wholeProfile: 7g\n"
            "    profiles: {1g.10gb: 10Gi}\n",
            "wholeProfile '7g' is not one of the profiles",
            id="mig-unknown-whole-profile",
        ),
        pytest.param(
            "classes:\n  a10:\n    backend: hami\n    memory: 24Gi\n    gpuTypes: [A10]\n"
            "  a100:\n    backend: hami\n    memory: 80Gi\n    gpuTypes: [A100]\n",
            "HAMi GPU type 'A10' is a substring of 'A100'",
            id="hami-type-matches-too-much",
        ),
        pytest.param("classes: [\n", "policy.yaml:2: not valid YAML", id="broken-yaml"),
        pytest.param("- a\n- b\n", "expected a mapping at the top level", id="not-a-mapping"),
    ],
)
def test_policy_errors_name_line_field_and_value(text: str, expected: str) -> None:
    problems = problems_of(load_policy, text)
    assert any(expected in problem for problem in problems), problems


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "mode: strict\n",
            "quotas.yaml:1: mode: 'strict' is not one of enforce, warn, queue",
            id="unknown-mode",
        ),
        pytest.param(
            "namespaces:\n  team-a:\n    a100: -1\n",
            "quotas.yaml:3: namespaces.team-a.a100: -1 is negative",
            id="negative-limit",
        ),
        pytest.param(
            "namespaces:\n  team-a:\n    a100: many\n",
            "namespaces.team-a.a100: 'many' is not a quantity",
            id="limit-not-a-quantity",
        ),
        pytest.param(
            "default:\n  Bad_Key: 1\n",
            "quotas.yaml:2: default.Bad_Key: 'Bad_Key' is neither a class name",
            id="bad-class-key",
        ),
    ],
)
def test_quota_errors_name_namespace_class_and_value(text: str, expected: str) -> None:
    problems = problems_of(load_quotas, text)
    assert any(expected in problem for problem in problems), problems


def test_quota_limits_and_default_class(quotas: object) -> None:
    from policies import QuotaConfig

    assert isinstance(quotas, QuotaConfig)
    assert quotas.limits_for("team-a") == {"a100": 4, "*": 5}
    assert quotas.limits_for("elsewhere") == {"t4": 1}
    assert quotas.default_class_for("team-a") == "a100"
    assert quotas.default_class_for("elsewhere") is None


def test_quota_for_unknown_class_is_reported(policy: Policy) -> None:
    quotas = load_quotas("namespaces:\n  team-a:\n    b200: 1\n    defaultClass: b300\n")
    assert quotas.unknown_classes(policy) == [
        "namespaces.team-a.b200: no class 'b200' in the policy",
        "namespaces.team-a.defaultClass: no class 'b300' in the policy",
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        pytest.param("", "q.yaml:1: the document is empty; to have no quotas", id="empty"),
        pytest.param("  \n\n", "q.yaml:1: the document is empty", id="blank-lines"),
        pytest.param("# all off\n", "q.yaml:1: the document is empty", id="only-a-comment"),
        pytest.param("~\n", "q.yaml:1: the document is empty", id="null"),
        pytest.param("- a100\n", "q.yaml:1: expected a mapping at the top level", id="a-list"),
        pytest.param(
            "namespaces:\n  team-a:\n    1: 2\n",
            "q.yaml:3: the key 1 is not text to YAML; quote it",
            id="class-key-a-number",
        ),
        pytest.param(
            "default:\n  true: 1\n", "q.yaml:2: the key true is not text", id="class-key-a-bool"
        ),
        pytest.param("a: " + "[" * 900, "q.yaml:1: nested deeper than 64 levels", id="nested-900"),
        pytest.param(
            "a: &a [1]\nb: [" + ", ".join(["*a"] * 101) + "]\n",
            "q.yaml: more than 100 aliases",
            id="alias-bomb",
        ),
        pytest.param(
            ALIAS_CYCLE,
            "q.yaml:3: the alias *n stands inside the block &n it names, a loop",
            id="alias-cycle",
        ),
        pytest.param(
            "default: &d [1, *d]\n",
            "q.yaml:1: the alias *d stands inside the block &d it names",
            id="alias-cycle-in-a-list",
        ),
        pytest.param(
            LAUGHS,
            "q.yaml:6: more than 200000 keys and values, counting each alias as the block",
            id="laughs-under-the-alias-cap",
        ),
        pytest.param(
            "namespaces: {team-a: {a100: 1}}\n---\nnamespaces: {}\n",
            "not valid YAML",
            id="two-documents",
        ),
        pytest.param("x" * (1024 * 1024 + 1), "over the 1048576 a config holds", id="too-long"),
    ],
)
def test_a_quota_file_that_says_nothing_valid_is_refused(text: str, problem: str) -> None:
    # Never "no quotas": an emptied or broken file must not switch every limit off.
    with pytest.raises(ConfigError) as raised:
        load_quotas(text, source="q.yaml")
    assert problem in raised.value.problems[0]


@pytest.mark.parametrize("text", ["namespaces: {}\n", "{}\n", "mode: enforce\n"])
def test_no_quotas_at_all_is_an_explicit_document(text: str) -> None:
    quotas = load_quotas(text)
    assert quotas.mode == "enforce"
    assert quotas.limits_for("any") == {}


def test_a_block_shared_by_aliases_is_read_as_written_out() -> None:
    # What a config uses aliases for: one block of limits for several namespaces.
    text = "namespaces:\n  team-a: &limits {a100: 2, t4: 1}\n  team-b: *limits\n  team-c: *limits\n"
    quotas = load_quotas(text)
    assert quotas.limits_for("team-c") == quotas.limits_for("team-a") == {"a100": 2, "t4": 1}


def test_aliases_count_as_the_blocks_they_repeat_up_to_the_bound() -> None:
    # 98 aliases of a block of 2,001 nodes, and the block, stand for 198,105 nodes: under
    # the bound, read (and refused for its unknown keys); two more aliases pass it, and the
    # text is refused before anything walks it.
    block = "[" + ", ".join(["1"] * 2000) + "]"
    under = f"namespaces: {{}}\nx-shared: &b {block}\nx-refs: [" + ", ".join(["*b"] * 98) + "]\n"
    with pytest.raises(ConfigError) as raised:
        load_quotas(under, source="q.yaml")
    assert "more than 200000" not in raised.value.problems[0]
    over = under.replace("x-refs: [", "x-refs: [*b, *b, ")
    with pytest.raises(ConfigError) as raised:
        load_quotas(over, source="q.yaml")
    assert "q.yaml:3: more than 200000 keys and values" in raised.value.problems[0]


@pytest.mark.parametrize(
    ("backend", "exempt", "named"),
    [
        pytest.param(
            "nvidia",
            ["kube-system"],
            [
                "class a (nvidia) needs NVIDIA's device plugin",
                "(gpu-operator, nvidia-device-plugin)",
            ],
            id="device-plugin-with-kube-system-alone",
        ),
        pytest.param("nvidia", ["nvidia-device-plugin"], [], id="device-plugin-in-its-chart-s"),
        pytest.param(
            "hami", ["gpu-operator"], ["needs HAMi", "(hami-system, kube-system)"], id="hami"
        ),
        pytest.param("hami", ["kube-system"], [], id="hami-in-kube-system"),
        pytest.param(
            "kai",
            ["gpu-operator", "kai-scheduler"],
            ["needs KAI Scheduler's pods that hold a shared GPU, and no namespace"],
            id="kai-without-its-reservations",
        ),
        pytest.param("gpu-manager", [], [], id="a-stack-without-a-namespace-of-its-own"),
    ],
)
def test_a_gpu_stack_a_class_needs_left_governed_is_warned_of(
    backend: str, exempt: list[str], named: list[str]
) -> None:
    # Only stacks the classes need: no admin is pushed to exempt a namespace for nothing.
    from policies.policy import exemption_warnings

    gpu_class = {"backend": backend, "memory": "80Gi"}
    text = yaml.safe_dump({"exemptNamespaces": exempt, "classes": {"a": gpu_class}})
    warnings = exemption_warnings(load_policy(text))
    assert all(w.startswith("exemptNamespaces: class a (") for w in warnings)
    for part in named:
        assert any(part in warning for warning in warnings), warnings
    assert bool(warnings) == bool(named)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        pytest.param(
            "namespaces:\n\tteam-a: 1\n",
            "quotas.yaml:2: not valid YAML: found character '\\t'",
            id="tab",
        ),
        pytest.param(
            "a: *nope\n",
            "quotas.yaml:1: not valid YAML: found undefined alias 'nope'",
            id="undefined-alias",
        ),
    ],
)
def test_a_yaml_error_names_what_it_found(text: str, said: str) -> None:
    assert said in problems_of(load_quotas, text)[0]


def test_a_file_of_forty_thousand_errors_says_fifty_and_how_many_more() -> None:
    # Each error is placed by a walk of its mapping: saying all of them took minutes.
    text = "namespaces:\n" + "".join(f"  t{i}: {{a100: x}}\n" for i in range(40_000))
    problems = problems_of(load_quotas, text)
    assert len(problems) == 51
    assert problems[0].startswith("quotas.yaml:2: namespaces.t0.a100: 'x' is not a quantity")
    assert problems[-1] == "quotas.yaml: and 39950 more problems"
