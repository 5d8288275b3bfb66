"""`gpuadm uninstall`: the webhook configurations deleted first, then gpuadm's gate lifted from
every pod that waits behind it, and no other gate touched.

What it does to the cluster is checked here against a stand-in for the apiserver's pods,
ConfigMaps and webhook configurations (as the leader's release is, tests/webhook/leader);
the command as an admin runs it, against the small apiserver of the other commands' tests
(`--dry-run`, which only reads) and for real in tests/e2e/test_uninstall.py.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.builders import POLICY_YAML
from tests.support import ROOT
from tests.webhook.cli.apiserver import fake_apiserver
from webhook.cli.uninstall import MAX_ATTEMPTS, SETTLE_SECONDS, Unfinished, uninstall
from webhook.kube.errors import KubeError
from webhook.kube.objects import Page
from webhook.kube.rest import AsyncApi

GATE = "gpuadm.io/quota"
HOLD = {"name": "example.com/hold"}
NAMESPACE = "gpuadm-system"


def pod(name: str, *gates: str, namespace: str = "team-a", **metadata: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x"}]}
    if gates:
        spec["schedulingGates"] = [{"name": gate} for gate in gates]
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", **metadata},
        "spec": spec,
    }


class Cluster:
    """Pods, gpuadm's policy ConfigMap and its two webhook configurations, kept as the
    apiserver keeps them: a JSON patch whose `test` fails is a 422, a pod or configuration
    that is not there a 404. `calls` records every call, in order."""

    def __init__(self, *pods: dict[str, Any], policy: str | None = POLICY_YAML) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.policy = policy
        self.configurations = {"mutating", "validating"}
        self.calls: list[str] = []
        self.page_size = 2
        # Run before a pod's patch is applied, once per patch: another writer's change.
        self.meanwhile: dict[str, Callable[[dict[str, Any]], None]] = {}
        # A refusal of each patch of a pod, in turn (then the patches apply).
        self.refusals: dict[str, list[KubeError]] = {}

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get configmap {namespace}/{name}")
        if self.policy is None or (namespace, name) != (NAMESPACE, "gpuadm-policy"):
            return None
        return {"metadata": {"name": name}, "data": {"policy.yaml": self.policy}}

    async def get_webhook_configuration(self, kind: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get {kind} {name}")
        return {"metadata": {"name": name}} if kind in self.configurations else None

    async def delete_webhook_configuration(self, kind: str, name: str) -> bool:
        self.calls.append(f"delete {kind} {name}")
        found = kind in self.configurations and name == "gpuadm"
        self.configurations.discard(kind)
        return found

    async def list_pods(self) -> AsyncGenerator[Page]:
        self.calls.append("list pods")
        listed = [copy.deepcopy(p) for p in self.pods.values()]  # one version for all pages
        for start in range(0, len(listed), self.page_size):
            more = start + self.page_size < len(listed)
            yield Page(listed[start : start + self.page_size], "1", "next" if more else None)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get pod {namespace}/{name}")
        found = self.pods.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    async def patch_pod(
        self, namespace: str, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any]:
        self.calls.append(f"patch pod {namespace}/{name}")
        if (change := self.meanwhile.get(name)) and (namespace, name) in self.pods:
            change(self.pods[namespace, name])
        if self.refusals.get(name):
            raise self.refusals[name].pop(0)
        if (namespace, name) not in self.pods:
            raise KubeError(404, f'pods "{name}" not found')
        try:
            patched: dict[str, Any] = jsonpatch.apply_patch(self.pods[namespace, name], patch)
        except jsonpatch.JsonPatchException as error:
            raise KubeError(422, str(error)) from None
        self.pods[namespace, name] = patched
        return patched

    def gates(self, name: str, namespace: str = "team-a") -> list[str]:
        return [g["name"] for g in self.pods[namespace, name]["spec"].get("schedulingGates", [])]

    def patched(self) -> list[str]:
        return [call.split()[-1] for call in self.calls if call.startswith("patch pod")]


class Sleeps:
    """The settle wait, recorded: how long, and which calls came before it."""

    def __init__(self, cluster: Cluster, arrives: dict[str, Any] | None = None) -> None:
        self.cluster = cluster
        self.arrives = arrives
        self.waits: list[tuple[float, int]] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append((seconds, len(self.cluster.calls)))
        if self.arrives is not None:  # a review under way stores its gated pod now
            metadata = self.arrives["metadata"]
            self.cluster.pods[metadata["namespace"], metadata["name"]] = self.arrives


async def run(cluster: Cluster, *, dry_run: bool = False, sleeps: Sleeps | None = None) -> Any:
    stand_in: Any = cluster
    api: AsyncApi = stand_in
    return await uninstall(
        api, NAMESPACE, "gpuadm", dry_run=dry_run, sleep=sleeps or Sleeps(cluster)
    )


async def test_the_webhooks_go_first_then_only_gpuadms_gate_is_lifted() -> None:
    cluster = Cluster(
        pod("waiting", GATE),
        pod("held-twice", HOLD["name"], GATE),
        pod("held-elsewhere", HOLD["name"]),
        pod("running"),
        pod("going", GATE, deletionTimestamp="2026-01-01T00:00:00Z"),
        pod("waiting-too", GATE, namespace="team-b"),
    )
    sleeps = Sleeps(cluster)
    done = await run(cluster, sleeps=sleeps)

    assert cluster.calls[:3] == [
        f"get configmap {NAMESPACE}/gpuadm-policy",
        "delete mutating gpuadm",
        "delete validating gpuadm",
    ]
    # The reviews under way are waited for, after the deletes and before the list.
    assert sleeps.waits == [(SETTLE_SECONDS, 3)]
    assert cluster.calls[3] == "list pods"
    assert cluster.configurations == set()
    assert sorted(done.lifted) == ["team-a/held-twice", "team-a/waiting", "team-b/waiting-too"]
    assert cluster.gates("waiting") == []
    assert cluster.gates("waiting-too", "team-b") == []
    # Only gpuadm's gate goes: another controller's stays, where it was.
    assert cluster.gates("held-twice") == [HOLD["name"]]
    assert cluster.gates("held-elsewhere") == [HOLD["name"]]
    # A pod being deleted is never scheduled: it is left as it is.
    assert cluster.gates("going") == [GATE]
    assert sorted(cluster.patched()) == [
        "team-a/held-twice",
        "team-a/waiting",
        "team-b/waiting-too",
    ]
    assert done.summary() == (
        "deleted MutatingWebhookConfiguration gpuadm and ValidatingWebhookConfiguration gpuadm; "
        "lifted the gate gpuadm.io/quota of 3 pods"
    )


async def test_a_pod_gated_by_a_review_already_under_way_is_lifted_too() -> None:
    cluster = Cluster(pod("waiting", GATE))
    late = pod("late", GATE)
    done = await run(cluster, sleeps=Sleeps(cluster, arrives=late))
    assert sorted(done.lifted) == ["team-a/late", "team-a/waiting"]
    assert cluster.gates("late") == []


async def test_a_pod_changed_since_it_was_read_is_read_again_and_keeps_the_other_gate() -> None:
    cluster = Cluster(pod("waiting", GATE), pod("busy", GATE))

    def gated_in_front(found: dict[str, Any]) -> None:
        gates = found["spec"]["schedulingGates"]
        if HOLD not in gates:
            gates.insert(0, dict(HOLD))  # the gate's place moves: the test of the patch fails

    cluster.meanwhile["waiting"] = gated_in_front
    cluster.refusals["busy"] = [KubeError(409, "the object has been modified")]
    done = await run(cluster)
    assert sorted(done.lifted) == ["team-a/busy", "team-a/waiting"]
    assert cluster.gates("waiting") == [HOLD["name"]]
    assert cluster.gates("busy") == []
    for name in ("waiting", "busy"):
        assert cluster.calls.count(f"patch pod team-a/{name}") == 2
        assert cluster.calls.count(f"get pod team-a/{name}") == 1


async def test_a_pod_gone_or_released_by_the_leader_meanwhile_is_no_error() -> None:
    cluster = Cluster(pod("deleted", GATE), pod("released", GATE), pod("waiting", GATE))

    def delete(found: dict[str, Any]) -> None:
        del cluster.pods["team-a", "deleted"]

    def release(found: dict[str, Any]) -> None:
        found["spec"]["schedulingGates"] = []

    cluster.meanwhile.update(deleted=delete, released=release)
    done = await run(cluster)
    # Lifted by this command: only the pod whose gate it removed.
    assert done.lifted == ["team-a/waiting"]
    assert cluster.gates("released") == []
    assert cluster.calls.count("patch pod team-a/released") == 1
    assert cluster.calls.count("get pod team-a/released") == 1


async def test_a_pod_that_changes_at_every_attempt_stops_the_command_saying_what_was_done() -> None:
    cluster = Cluster(pod("restless", GATE))
    cluster.page_size = 1
    cluster.refusals["restless"] = [KubeError(409, "modified")] * MAX_ATTEMPTS
    with pytest.raises(Unfinished) as stopped:
        await run(cluster)
    assert cluster.calls.count("patch pod team-a/restless") == MAX_ATTEMPTS
    assert str(stopped.value.error) == (
        f"cannot lift the gate of pod team-a/restless: it changed at each of {MAX_ATTEMPTS} "
        "attempts"
    )
    assert stopped.value.done.summary().startswith("deleted MutatingWebhookConfiguration gpuadm")


async def test_a_refused_patch_stops_the_command_once_the_pages_other_pods_are_done() -> None:
    cluster = Cluster(pod("forbidden", GATE), pod("waiting", GATE))
    refusal = KubeError(403, 'pods "forbidden" is forbidden: User "x" cannot patch resource')
    cluster.refusals["forbidden"] = [refusal]
    with pytest.raises(Unfinished) as stopped:
        await run(cluster)
    assert str(stopped.value.error) == f"cannot lift the gate of pod team-a/forbidden: {refusal}"
    assert stopped.value.done.lifted == ["team-a/waiting"]
    assert stopped.value.done.summary() == (
        "deleted MutatingWebhookConfiguration gpuadm and ValidatingWebhookConfiguration gpuadm; "
        "lifted the gate gpuadm.io/quota of 1 pod"
    )


async def test_a_refusal_before_any_change_is_said_as_it_came() -> None:
    cluster = Cluster(pod("waiting", GATE))
    cluster.configurations.clear()  # deleted before: nothing changes until a gate is lifted
    cluster.refusals["waiting"] = [KubeError(403, "forbidden")]
    with pytest.raises(Exception, match="cannot lift the gate of pod team-a/waiting") as raised:
        await run(cluster)
    assert not isinstance(raised.value, Unfinished)


async def test_the_gate_is_the_policys_domain() -> None:
    cluster = Cluster(
        pod("ours", "gpus.example.com/quota"),
        pod("other-domain", GATE),
        policy=POLICY_YAML.replace("domain: gpuadm.io", "domain: gpus.example.com"),
    )
    done = await run(cluster)
    assert done.gate == "gpus.example.com/quota"
    assert done.lifted == ["team-a/ours"]
    assert cluster.gates("other-domain") == [GATE]


@pytest.mark.parametrize(
    ("policy", "why"),
    [
        pytest.param(None, f"no ConfigMap {NAMESPACE}/gpuadm-policy", id="no-configmap"),
        pytest.param("", f"ConfigMap {NAMESPACE}/gpuadm-policy has no policy.yaml", id="empty"),
        pytest.param(
            "domain: gpus.example.com\n",
            f"the policy in ConfigMap {NAMESPACE}/gpuadm-policy is invalid (",
            id="invalid",
        ),
    ],
)
async def test_without_a_valid_policy_the_default_gate_is_lifted_and_the_admin_told(
    policy: str | None, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = Cluster(pod("waiting", GATE), pod("elsewhere", "gpus.example.com/quota"))
    cluster.policy = policy
    done = await run(cluster)
    assert done.gate == GATE
    assert done.lifted == ["team-a/waiting"]
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning.startswith(f"gpuadm: warning: {why}")
    assert warning.endswith(f": lifting the default domain's gate, {GATE}")


async def test_configurations_already_gone_are_no_error_and_nothing_is_waited_for() -> None:
    cluster = Cluster(pod("waiting", GATE))
    cluster.configurations.clear()
    sleeps = Sleeps(cluster)
    done = await run(cluster, sleeps=sleeps)
    assert sleeps.waits == []
    assert done.lines() == [
        "mutatingwebhookconfiguration/gpuadm not found: already gone",
        "validatingwebhookconfiguration/gpuadm not found: already gone",
        f"pod team-a/waiting: gate {GATE} lifted",
        f"no webhook configuration to delete; lifted the gate {GATE} of 1 pod",
    ]


async def test_a_dry_run_reads_and_changes_nothing() -> None:
    cluster = Cluster(pod("waiting", GATE), pod("held-elsewhere", HOLD["name"]))
    before = copy.deepcopy(cluster.pods)
    sleeps = Sleeps(cluster)
    done = await run(cluster, dry_run=True, sleeps=sleeps)
    assert cluster.pods == before
    assert cluster.configurations == {"mutating", "validating"}
    assert not [c for c in cluster.calls if c.startswith(("delete", "patch"))]
    assert sleeps.waits == []
    assert done.lines()[-1] == (
        "would delete MutatingWebhookConfiguration gpuadm and ValidatingWebhookConfiguration "
        f"gpuadm; would lift the gate {GATE} of 1 pod"
    )


# --- the command, as an admin runs it ----------------------------------------------------------


def test_the_command_says_what_a_dry_run_would_do(tmp_path: Path) -> None:
    base = "/apis/admissionregistration.k8s.io/v1"
    with fake_apiserver() as apiserver:
        apiserver.objects.update(
            {
                f"/api/v1/namespaces/{NAMESPACE}/configmaps/gpuadm-policy": {
                    "metadata": {"name": "gpuadm-policy"},
                    "data": {"policy.yaml": POLICY_YAML},
                },
                f"{base}/validatingwebhookconfigurations/gpuadm": {"metadata": {"name": "gpuadm"}},
                "/api/v1/pods": {
                    "kind": "PodList",
                    "metadata": {"resourceVersion": "7"},
                    "items": [pod("waiting", GATE), pod("held", HOLD["name"], namespace="b")],
                },
            }
        )
        kubeconfig = str(apiserver.kubeconfig(tmp_path / "kubeconfig"))

        def uninstall_command(*argv: str) -> subprocess.CompletedProcess[str]:
            command = ["uninstall", "--dry-run", "--kubeconfig", kubeconfig, *argv]
            return subprocess.run(
                [sys.executable, "-m", "webhook.cli", *command],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        text = uninstall_command()
        shown = uninstall_command("-o", "json")
        as_yaml = uninstall_command("-o", "yaml")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines() == [
        "mutatingwebhookconfiguration/gpuadm not found: already gone (dry run)",
        "validatingwebhookconfiguration/gpuadm deleted (dry run)",
        f"pod team-a/waiting: gate {GATE} lifted (dry run)",
        f"would delete ValidatingWebhookConfiguration gpuadm; would lift the gate {GATE} of 1 pod",
    ]
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {
        "dryRun": True,
        "gate": GATE,
        "webhookConfigurations": [
            {"kind": "MutatingWebhookConfiguration", "name": "gpuadm", "existed": False},
            {"kind": "ValidatingWebhookConfiguration", "name": "gpuadm", "existed": True},
        ],
        "lifted": [{"namespace": "team-a", "name": "waiting"}],
    }
    assert as_yaml.returncode == 0, as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout) == json.loads(shown.stdout)
