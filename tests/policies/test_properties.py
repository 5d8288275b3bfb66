"""Properties of the rewrite over generated pods (hypothesis)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import Denial, load_policy, plan
from tests.apiserver_rules import violations
from tests.builders import POLICY_YAML

POLICY = load_policy(POLICY_YAML)
CLASSES = sorted(POLICY.classes)

quantities = st.one_of(
    st.integers(min_value=-1, max_value=8).map(str),
    st.sampled_from(["0.5", "250m", "0.1", "1.5", "0.999", "lots", "1e0"]),
)
memories = st.sampled_from(["1Gi", "10Gi", "15Gi", "40Gi", "100Gi", "1500Mi", "0"])
raw_resources = st.dictionaries(
    st.sampled_from(
        [
            "nvidia.com/gpu",
            "nvidia.com/gpumem",
            "tencent.com/vcuda-core",
            "aliyun.com/gpu-mem",
            "volcano.sh/vgpu-number",
            "cpu",
        ]
    ),
    st.integers(min_value=0, max_value=4).map(str),
    max_size=2,
)


@st.composite
def class_limits(draw: st.DrawFn, class_name: str) -> dict[str, str]:
    limits: dict[str, str] = {}
    if draw(st.booleans()):
        limits[f"gpuadm.io/{class_name}"] = draw(quantities)
    if draw(st.booleans()):
        limits[f"gpuadm.io/{class_name}-memory"] = draw(memories)
    return limits


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    class_name = draw(st.sampled_from(CLASSES))
    containers = []
    for index in range(draw(st.integers(min_value=1, max_value=3))):
        limits = draw(st.one_of(class_limits(class_name), raw_resources))
        containers.append(
            {
                "name": f"c{index}",
                "image": "registry.invalid/app:1",
                "resources": {"limits": limits, "requests": dict(limits)},
            }
        )
    spec: dict[str, Any] = {"containers": containers}
    if draw(st.booleans()):
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        }
    metadata: dict[str, Any] = {"name": "p"}
    if draw(st.booleans()):
        metadata["annotations"] = {"gpuadm.io/class": class_name}
    return {"metadata": metadata, "spec": spec}


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(pods())
def test_every_patch_applies_is_valid_and_idempotent(body: dict[str, Any]) -> None:
    original = copy.deepcopy(body)
    try:
        result = plan(body, POLICY)
    except Denial as denial:
        message = denial.message
        assert message, "a denial always says why"
        return
    assert body == original, "plan must not modify its input"
    patched = jsonpatch.apply_patch(body, result.patch)
    assert violations(patched, POLICY.domain) == []
    assert plan(patched, POLICY).patch == []


@settings(max_examples=200)
@given(
    st.dictionaries(
        st.sampled_from(["cpu", "memory", "example.com/fpga"]),
        st.integers(min_value=0, max_value=8).map(str),
        max_size=3,
    )
)
def test_pods_without_gpu_keys_are_untouched(limits: dict[str, str]) -> None:
    body = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "resources": {"limits": limits, "requests": dict(limits)}}]
        },
    }
    result = plan(body, POLICY)
    assert result.patch == []
    assert result.class_name is None
