"""The plan memo: a remembered plan is the plan, and the key holds all that plan reads."""

from __future__ import annotations

import copy
import gc
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings

from policies import Denial, plan
from policies.access.rewrite import memo_key
from tests.builders import pod
from tests.policies.test_properties import POLICY, pods
from webhook.config.plan_memo import PlanMemo


def fresh(body: dict[str, Any]) -> Any:
    try:
        return plan(body, POLICY)
    except Denial as denial:
        return denial.message


def memoized(memo: PlanMemo, body: dict[str, Any]) -> Any:
    try:
        return memo.plan(body, namespace_default_class=None)
    except Denial as denial:
        return denial.message


@settings(max_examples=300)
@given(pods(), pods())
def test_a_remembered_plan_is_the_plan(first: dict[str, Any], second: dict[str, Any]) -> None:
    memo = PlanMemo(POLICY)
    for body in (first, second, first, second):
        assert memoized(memo, body) == fresh(body)


def unrelated_changes(body: dict[str, Any]) -> dict[str, Any]:
    changed = copy.deepcopy(body)
    metadata = changed["metadata"]
    metadata["name"] = "another"
    metadata["uid"] = "1234"
    metadata.setdefault("labels", {"app": "x"})["pod-template-hash"] = "abc"
    metadata.setdefault("annotations", {"note": "x"})["example.com/run"] = "7"
    for c in changed["spec"]["containers"]:
        c["image"] = "registry.invalid/other:2"
        c["env"] = [{"name": "A", "value": "1"}]
    return changed


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(pod({"gpuadm.io/a100": "0.5"}, annotations={"a": "b"}), id="class-share"),
        pytest.param(
            pod({"nvidia.com/gpu": "1"}, annotations={"gpuadm.io/class": "l4"}), id="untyped"
        ),
    ],
)
def test_pods_of_one_template_share_a_key(body: dict[str, Any]) -> None:
    body["metadata"]["labels"] = {"app": "train"}
    assert memo_key(body, POLICY) == memo_key(unrelated_changes(body), POLICY)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda p: p["metadata"]["annotations"].update({"gpuadm.io/class": "t4"}),
            id="class-annotation",
        ),
        pytest.param(lambda p: p["metadata"]["labels"].clear(), id="labels-emptied"),
        pytest.param(
            lambda p: p["metadata"]["labels"].update({"gpuadm.io/class": "x"}), id="class-label"
        ),
        pytest.param(lambda p: p["spec"].update(schedulerName="other"), id="scheduler"),
        pytest.param(lambda p: p["spec"].update(nodeName="n1"), id="node-name"),
        pytest.param(
            lambda p: p["spec"]["containers"][0]["resources"]["limits"].update(
                {"gpuadm.io/a100": "1"}
            ),
            id="resources",
        ),
        pytest.param(
            lambda p: p["spec"]["containers"][0].update(name="renamed"), id="container-name"
        ),
        pytest.param(
            lambda p: p["metadata"]["annotations"].update({"nvidia.com/use-gputype": "A100"}),
            id="backend-annotation",
        ),
        pytest.param(
            lambda p: p["metadata"]["annotations"].update(
                {"hami.io/gpu-scheduler-policy": "spread"}
            ),
            id="gpu-policy-annotation",
        ),
    ],
)
def test_what_plan_reads_changes_the_key(change: Any) -> None:
    body = pod({"gpuadm.io/a100": "0.5"}, annotations={"a": "b"})
    body["metadata"]["labels"] = {"app": "train"}
    changed = copy.deepcopy(body)
    change(changed)
    assert memo_key(body, POLICY) != memo_key(changed, POLICY)


def test_the_namespace_default_class_is_part_of_the_key() -> None:
    body = pod({"nvidia.com/gpu": "1"})
    assert memo_key(body, POLICY, namespace_default_class="h100") != memo_key(body, POLICY)


def test_the_memo_is_bounded() -> None:
    memo = PlanMemo(POLICY, max_entries=2)
    bodies = [pod({"gpuadm.io/h100": str(n)}) for n in (1, 2, 3)]
    for body in bodies:
        memo.plan(body, namespace_default_class=None)
    memo.plan(bodies[2], namespace_default_class=None)
    assert len(memo) == 2


def test_the_memo_is_bounded_in_bytes_and_counts_evictions() -> None:
    bodies = [pod({"gpuadm.io/h100": str(n)}) for n in range(1, 9)]
    one = PlanMemo(POLICY)
    one.plan(bodies[0], namespace_default_class=None)
    entry = one.stats().weight_bytes
    memo = PlanMemo(POLICY, max_bytes=3 * entry + entry // 2)
    for body in bodies:
        memo.plan(body, namespace_default_class=None)
    stats = memo.stats()
    assert stats.entries == 3
    assert stats.weight_bytes <= 3 * entry + entry // 2
    assert stats.evictions == len(bodies) - 3


def test_a_plan_heavier_than_its_share_of_the_budget_is_not_remembered() -> None:
    large = pod({"gpuadm.io/a100": "0.5"})
    large["spec"]["containers"] *= 1000
    for index, container in enumerate(large["spec"]["containers"]):
        large["spec"]["containers"][index] = {**container, "name": f"c{index}"}
    memo = PlanMemo(POLICY)
    first = memo.plan(large, namespace_default_class=None)
    assert memo.stats().entries == 0
    assert memo.plan(large, namespace_default_class=None) == first


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def malformed(change: Any) -> dict[str, Any]:
    body = pod({"gpuadm.io/a100": "0.5"}, annotations={"a": "b"})
    change(body)
    return body


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(malformed(lambda b: b["metadata"].update(labels={"x": 5})), id="label"),
        pytest.param(malformed(lambda b: b["metadata"].update(name=["x"])), id="name"),
        pytest.param(malformed(lambda b: b["metadata"].update(annotations=["a"])), id="notes"),
        pytest.param(malformed(lambda b: b.update(spec=["x"])), id="spec"),
        pytest.param(malformed(lambda b: b["spec"]["containers"].append(5)), id="container"),
        pytest.param(malformed(lambda b: b["spec"].update(containers={"a": 1})), id="containers"),
        pytest.param(
            malformed(lambda b: b["spec"]["containers"][0]["resources"].update(limits=[1])),
            id="limits",
        ),
        pytest.param(malformed(lambda b: b["spec"].update(tolerations=[None])), id="toleration"),
        pytest.param(malformed(lambda b: b["spec"].update(nodeName=3)), id="node"),
        pytest.param(
            malformed(lambda b: b["spec"].update(affinity={"a": nested(20)})),
            id="deep",
        ),
        pytest.param(
            malformed(
                lambda b: b["spec"]["containers"][0]["resources"].update(limits={"cpu": b"1"})
            ),
            id="not-json",
        ),
    ],
)
def test_a_malformed_pod_is_refused_even_after_its_like_was_remembered(
    bad: dict[str, Any],
) -> None:
    # The memo's key leaves the spec's shape check to `plan` on a miss; a remembered pod
    # must never let a malformed one through as its like.
    memo = PlanMemo(POLICY)
    good = malformed(lambda b: None)
    assert not isinstance(memoized(memo, good), str)
    with pytest.raises(Denial) as fresh_denial:
        plan(bad, POLICY)
    for _ in range(2):  # planned, then remembered
        with pytest.raises(Denial) as denial:
            memo.plan(bad, namespace_default_class=None)
        assert denial.value.message == fresh_denial.value.message


def test_the_memo_weighs_what_its_entries_really_hold() -> None:
    # Distinct small pods, as a tenant can send them: each one an entry of its own. Their
    # weight must cover the memory the entries really take (their JSON once sat in 4 KiB
    # allocations, three times what was counted), and not overstate it wildly either.
    memo = PlanMemo(POLICY, max_entries=10_000, max_bytes=1 << 40)
    bodies = []
    for index in range(2_000):
        body = pod({"gpuadm.io/h100": "1"})
        body["spec"]["containers"][0]["name"] = f"c{index}"
        bodies.append(body)
    memoized(memo, bodies[0])
    gc.collect()
    tracemalloc.start()
    before = memo.stats().weight_bytes
    for body in bodies[1:]:
        memoized(memo, body)
    gc.collect()
    taken, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    weighed = memo.stats().weight_bytes - before
    assert taken <= weighed <= 3 * taken
