"""The validating side: a stored pod must be a fixed point of the rewrite; updates keep D/*."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonpatch
import pytest

from policies import Denial, Policy, check_update, plan, require_fixed_point
from tests.builders import pod


def mutated(policy: Policy, limits: dict[str, str]) -> dict[str, Any]:
    body = pod(limits)
    result: dict[str, Any] = jsonpatch.apply_patch(body, plan(body, policy).patch)
    return result


def test_a_mutated_pod_passes(policy: Policy) -> None:
    result = require_fixed_point(plan(mutated(policy, {"gpuadm.io/a100": "0.5"}), policy))
    assert result.class_name == "a100"
    assert result.demand == "a100=0.5"


def test_a_pod_without_gpus_passes(policy: Policy) -> None:
    assert require_fixed_point(plan(pod({"cpu": "1"}), policy)).class_name is None


@pytest.mark.parametrize(
    ("limits", "where"),
    [
        pytest.param({"gpuadm.io/a100": "1"}, "/spec/containers/0/resources", id="class-key-left"),
        pytest.param(
            {"nvidia.com/gpu": "1"}, "/metadata/annotations", id="untyped-never-rewritten"
        ),
    ],
)
def test_a_gpu_pod_the_mutating_webhook_never_saw_is_sent_back(
    policy: Policy, limits: dict[str, str], where: str
) -> None:
    with pytest.raises(Denial) as denial:
        require_fixed_point(plan(pod(limits), policy))
    assert "not processed by gpuadm's mutating webhook" in denial.value.message
    assert "retry" in denial.value.message
    assert where in denial.value.message


def test_forged_annotations_do_not_pass_for_a_rewrite(policy: Policy) -> None:
    body = mutated(policy, {"gpuadm.io/t4": "0.5"})
    body["metadata"]["annotations"]["gpuadm.io/demand"] = "t4=0.01"
    with pytest.raises(Denial, match="not processed"):
        require_fixed_point(plan(body, policy))


def test_backend_resources_changed_after_mutation_are_caught(policy: Policy) -> None:
    body = mutated(policy, {"gpuadm.io/a100": "0.5"})
    for side in ("limits", "requests"):
        body["spec"]["containers"][0]["resources"][side]["nvidia.com/gpumem"] = "81920"
    # The pod now holds all the memory of a GPU; its demand annotation must follow.
    with pytest.raises(Denial, match=re.escape("/metadata/annotations/gpuadm.io~1demand")):
        require_fixed_point(plan(body, policy))


def test_an_invalid_pod_gets_the_rule_not_the_retry_message(policy: Policy) -> None:
    with pytest.raises(Denial, match="is neither a whole number"):
        require_fixed_point(plan(pod({"gpuadm.io/a100": "1.5"}), policy))


@pytest.mark.parametrize(
    ("field", "change"),
    [
        pytest.param("labels", lambda m: m.pop("gpuadm.io/class"), id="label-removed"),
        pytest.param("labels", lambda m: m.update({"gpuadm.io/class": "h100"}), id="label-changed"),
        pytest.param(
            "annotations",
            lambda m: m.update({"gpuadm.io/demand": "a100=0"}),
            id="annotation-changed",
        ),
        pytest.param(
            "annotations", lambda m: m.update({"gpuadm.io/extra": "x"}), id="annotation-added"
        ),
    ],
)
def test_updates_to_gpuadm_keys_are_denied(policy: Policy, field: str, change: object) -> None:
    old = mutated(policy, {"gpuadm.io/a100": "1"})
    new = copy.deepcopy(old)
    change(new["metadata"][field])  # type: ignore[operator]
    with pytest.raises(Denial, match="may be set by gpuadm only"):
        check_update(old, new, policy)


@pytest.mark.parametrize(
    ("class_name", "change", "key"),
    [
        pytest.param(
            "a100",
            {"nvidia.com/use-gputype": "NVIDIA H100 80GB HBM3"},
            "nvidia.com/use-gputype",
            id="hami-use-list-changed",
        ),
        pytest.param(
            "a100",
            {"nvidia.com/nouse-gputype": "NVIDIA A100-SXM4-80GB"},
            "nvidia.com/nouse-gputype",
            id="hami-nouse-list-added",
        ),
        pytest.param(
            "a10",
            {"nvidia.com/nouse-gputype": "NVIDIA H100"},
            "nvidia.com/nouse-gputype",
            id="volcano-nouse-list-changed",
        ),
        pytest.param(
            "a10",
            {"nvidia.com/use-gputype": "NVIDIA H100"},
            "nvidia.com/use-gputype",
            id="volcano-use-list-added",
        ),
        pytest.param(
            "a100", {"nvidia.com/use-gpuuuid": "GPU-1"}, "nvidia.com/use-gpuuuid", id="uuid"
        ),
        pytest.param("a10", {"volcano.sh/vgpu-mode": "mig"}, "volcano.sh/vgpu-mode", id="mode"),
    ],
)
def test_an_update_cannot_send_a_pending_pod_to_another_gpu_model(
    policy: Policy, class_name: str, change: dict[str, str], key: str
) -> None:
    old = mutated(policy, {f"gpuadm.io/{class_name}": "1"})
    assert "nodeName" not in old["spec"], "the pod is pending: not yet bound to a node"
    new = copy.deepcopy(old)
    new["metadata"]["annotations"].update(change)
    with pytest.raises(Denial) as denial:
        check_update(old, new, policy)
    assert f"annotation {key} may be set by gpuadm only" in denial.value.message
    assert "choose its GPUs" in denial.value.message


@pytest.mark.parametrize(
    ("limits", "change"),
    [
        pytest.param(
            {"gpuadm.io/a100": "0.5"}, {"hami.io/gpu-scheduler-policy": "spread"}, id="changed"
        ),
        pytest.param(
            {"gpuadm.io/a100": "0.5"}, {"hami.io/gpu-scheduler-policy": None}, id="removed"
        ),
        pytest.param({"cpu": "1"}, {"hami.io/gpu-scheduler-policy": "spread"}, id="added"),
    ],
)
def test_an_update_cannot_change_hamis_gpu_policy(
    policy: Policy, limits: dict[str, str], change: dict[str, str | None]
) -> None:
    """A pending share spread over a node's GPUs would leave fewer whole GPUs free than its
    class, which packs them, allows."""
    old = mutated(policy, limits)
    new = copy.deepcopy(old)
    annotations = new["metadata"].setdefault("annotations", {})
    for key, value in change.items():
        if value is None:
            del annotations[key]
        else:
            annotations[key] = value
    with pytest.raises(Denial) as denial:
        check_update(old, new, policy)
    assert (
        "annotation hami.io/gpu-scheduler-policy may be set by gpuadm only" in denial.value.message
    )


def test_an_update_cannot_remove_the_gpu_model_choice(policy: Policy) -> None:
    old = mutated(policy, {"gpuadm.io/a100": "1"})
    new = copy.deepcopy(old)
    del new["metadata"]["annotations"]["nvidia.com/use-gputype"]
    with pytest.raises(Denial, match=r"annotation nvidia\.com/use-gputype may be set by gpuadm"):
        check_update(old, new, policy)


def test_updates_to_other_keys_are_allowed(policy: Policy) -> None:
    old = mutated(policy, {"gpuadm.io/a100": "1"})
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["app"] = "train"
    new["metadata"]["annotations"]["note"] = "hi"
    check_update(old, new, policy)
