"""The GPU stacks' own pods pass gpuadm under the shipped policy, in their namespaces only.

Each pod is made from a stack's published DaemonSet (`tests/gpu_stacks.py`) as the DaemonSet
controller creates it, and judged by `mutate` and `validate` with examples/policy.yaml and
examples/quotas.yaml, the config deploy/ and the Helm chart install. In the namespace the
stack's documented install uses it is admitted unchanged; the same pod in a tenant's
namespace is refused by the guard, with a message that tells the admin to exempt the
namespace, not to switch a rule off.
"""

from __future__ import annotations

import orjson
import pytest

from tests.builders import review
from tests.gpu_stacks import DAEMON_SET_CONTROLLER, STACK_PODS, StackPod
from tests.support import ROOT
from webhook.admission import decisions
from webhook.admission.decision import Decision
from webhook.claims.lookup import NoClaims
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.quota.gate import Unlimited
from webhook.reviews.request import AdmissionRequest, decode_review

EXAMPLES = ROOT / "examples"
TRUSTED = "system:serviceaccount:gpuadm-system:gpuadm"
STACKS = [pytest.param(stack, id=stack.fixture.removesuffix(".yaml")) for stack in STACK_PODS]


@pytest.fixture(scope="module")
def shipped() -> ConfigHolder:
    return ConfigHolder(
        snapshot_from_text(
            (EXAMPLES / "policy.yaml").read_text(),
            (EXAMPLES / "quotas.yaml").read_text(),
            policy_source="examples/policy.yaml",
            quotas_source="examples/quotas.yaml",
        )
    )


def created(stack: StackPod, namespace: str) -> AdmissionRequest:
    """The review of the DaemonSet controller creating the stack's pod in `namespace`."""
    body = review(stack.pod(namespace), namespace=namespace, user=DAEMON_SET_CONTROLLER)
    return decode_review(orjson.dumps(body))


async def judged(config: ConfigHolder, request: AdmissionRequest) -> tuple[Decision, Decision]:
    """What /mutate and then /validate answer, as the apiserver would call them."""
    mutated = await decisions.mutate(
        request, config=config, templates=NoTemplates(), quota=Unlimited()
    )
    validated = await decisions.validate(
        request,
        config=config,
        quota=Unlimited(),
        claims=NoClaims(),
        trusted=decisions.Trusted(TRUSTED),
    )
    return mutated, validated


class NoTemplates:
    """A pod of no `dra` class asks for no ResourceClaimTemplate."""

    async def ensure(self, namespace: str, templates: object) -> None:
        raise AssertionError(f"a template was asked for in {namespace}: {templates}")


@pytest.mark.parametrize("stack", STACKS)
async def test_a_gpu_stacks_pod_is_admitted_unchanged_in_its_namespace(
    shipped: ConfigHolder, stack: StackPod
) -> None:
    assert stack.namespace in shipped.current.policy.exempt_namespaces
    for decision in await judged(shipped, created(stack, stack.namespace)):
        assert decision == Decision("allowed", revisions=shipped.current.revisions)


@pytest.mark.parametrize("stack", STACKS)
async def test_the_same_pod_in_a_tenants_namespace_is_told_to_exempt_its_namespace(
    shipped: ConfigHolder, stack: StackPod
) -> None:
    for decision in await judged(shipped, created(stack, "team-a")):
        assert decision.outcome == "denied"
        assert decision.reason.startswith("GPU access outside the pod's resources: ")
        assert stack.refused_for in decision.reason
        assert decision.reason.endswith(
            "its namespace team-a must be exempt: an admin adds it to the policy's "
            "exemptNamespaces (the Helm value policy.exemptNamespaces)"
        )
        assert "guard." not in decision.reason


@pytest.mark.parametrize("stack", STACKS)
async def test_without_its_host_paths_and_visible_devices_the_pod_passes_anywhere(
    shipped: ConfigHolder, stack: StackPod
) -> None:
    """What refuses the pod in a tenant's namespace is the guard, and nothing else of it."""
    stripped = stack.pod("team-a")
    spec = stripped["spec"]
    spec["volumes"] = [v for v in spec.get("volumes", []) if "hostPath" not in v]
    kept = {v["name"] for v in spec["volumes"]}
    for container in (*spec.get("initContainers", []), *spec["containers"]):
        container["env"] = [
            e for e in container.get("env", []) if e.get("name") != "NVIDIA_VISIBLE_DEVICES"
        ]
        container["volumeMounts"] = [
            m for m in container.get("volumeMounts", []) if m["name"] in kept
        ]
    request = decode_review(orjson.dumps(review(stripped, namespace="team-a")))
    for decision in await judged(shipped, request):
        assert decision.outcome == "allowed", decision.reason
