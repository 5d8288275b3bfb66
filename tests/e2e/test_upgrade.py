"""gpuadm 0.1.0, installed as it was released, upgraded by `helm upgrade` to this tree.

0.1.0's chart (from git history) with 0.1.0's image (built from its own Dockerfile) on a real
node; tenants' pods admitted and charged, and GPUQuota objects published, by 0.1.0; then
`helm upgrade` to this tree's chart and image while pods are created in three namespaces:
one with room to spare, one held at its quota by churn (a pod deleted for each refusal), and
a burst into a third while replicas of both versions serve. The rollout is paused while both
versions serve, so that they judge side by side for as long as the test needs, whatever the
machine's speed; the pods stored never exceed a quota.

This version writes the usage record in a format 0.1.0 cannot read (docs/operations.md,
"Upgrading from 0.1.0"): a 0.1.0 replica that meets one refuses the pod with "retry", so
during the rollout some creates are refused so, and retried as clients retry; none is
admitted past a limit. Once the rollout is over, every namespace fills exactly.
The scenarios share one installation, in file order.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e.installed import (
    CHART,
    NAMESPACE,
    RELEASE,
    RELEASE_0_1_0,
    RETRIED,
    Image,
    Installation,
    Outcomes,
    build_released_image,
    classify,
    create,
    on_a_real_node,
    released_chart,
    wait_for,
)
from tests.support import ROOT

ROOM = 20
# "burst": 0.1.0 admits HELD of LIMIT; a burst in the rollout, when replicas of both versions
# serve, may add exactly the rest.
LIMIT, HELD, BURST = 50, 30, 60
TENANTS: dict[str, dict[str, object]] = {
    "stream": {"h100": 10_000},
    "upgraded": {"h100": 10_000},
    "tight": {"h100": ROOM},
    "burst": {"h100": LIMIT},
    "mixed": {"h100": 10_000},
}
# Rounds of creates at once, while the rollout is paused, until what the test must see has
# happened: each round dials new connections, to replicas of either version.
ROUNDS, ROUND = 12, 40
QUOTAS = {"mode": "enforce", "namespaces": TENANTS}
# After the upgrade, a GPU-hour budget too, which 0.1.0 did not know: its GPUQuota shows it in
# the status fields and columns the upgraded CRD added.
BUDGET = "500h/7d"
QUOTAS_AFTER = {
    "mode": "enforce",
    "namespaces": {**TENANTS, "upgraded": {"h100": 10_000, "budget": {"h100": BUDGET}}},
}
OPERATIONS_DOC = ROOT / "docs" / "operations.md"
# How 0.1.0 refuses a pod whose namespace's record it cannot read: its answer to any fault,
# with HTTP status 500, which the suite's clients retry as they retry a "retry".
OLD_REFUSAL = "gpuadm failed to judge this request"
# What 0.1.0 logs when it meets a record in this version's format (a list, where it wants a
# mapping).
OLD_MISREAD = "'list' object has no attribute 'items'"
GPUQUOTAS = ("gpuadm.io", "v1alpha1", "gpuquotas")


@pytest.fixture(scope="module")
def old_image() -> Image:
    return build_released_image(RELEASE_0_1_0)


@pytest.fixture(scope="module")
def installation(image: Image, old_image: Image) -> Iterator[Installation]:
    with on_a_real_node(image, old_image) as installed:
        for namespace in TENANTS:
            installed.make_namespace(namespace)
        yield installed


def _gpuquota(installation: Installation, namespace: str, name: str) -> dict[str, Any] | None:
    custom = kubernetes.client.CustomObjectsApi(installation.api)
    try:
        found: dict[str, Any] = custom.get_namespaced_custom_object(
            *GPUQUOTAS[:2], namespace, GPUQUOTAS[2], name
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return found


def _stored(installation: Installation, namespace: str) -> list[str]:
    pods = installation.core.list_namespaced_pod(namespace).items
    return [p.metadata.name for p in pods if p.metadata.deletion_timestamp is None]


def _limits(pod: dict[str, Any]) -> dict[str, str]:
    limits: dict[str, str] = pod["spec"]["containers"][0]["resources"]["limits"]
    return limits


def test_0_1_0_installs_and_serves(installation: Installation, old_image: Image) -> None:
    # 0.1.0's chart defaults hold the example classes (h100 among them): no examples file.
    installation.install(
        installation.values(old_image, QUOTAS), chart=released_chart(RELEASE_0_1_0), examples=None
    )
    wait_for(lambda: len(installation.ready_pods()) == 3, "3 gpuadm 0.1.0 pods Ready")
    assert installation.all_pods_are(old_image.name)

    stored = installation.create_gpu_pod("upgraded")
    assert _limits(stored) == {"nvidia.com/gpu": "1"}
    outcomes = installation.create_many("tight", ROOM + 10)
    assert len(outcomes.created) == ROOM, outcomes
    assert len(outcomes.refused) == 10
    assert len(_stored(installation, "tight")) == ROOM
    assert len(installation.create_many("burst", HELD).created) == HELD

    def published() -> bool:
        quota = _gpuquota(installation, "tight", "h100")
        return quota is not None and str(quota.get("status", {}).get("inUse")) == str(ROOM)

    wait_for(published, "0.1.0's leader publishing GPUQuota tight/h100", 60)


@dataclass
class Creates:
    """Creates GPU pods in a namespace one after another until stopped, retrying as a client
    would (a Job controller, kubectl in a script) what the apiserver could not send to gpuadm
    or gpuadm asked to retry, up to `retries` times. With `churn`, holds the namespace at its
    quota: a quota refusal deletes the oldest pod. Samples the pods stored after each answer.

    From `threads` threads: the apiserver keeps each connection to a replica open and reuses
    it, so one caller at a time is answered by one replica until that replica stops; callers
    at once open several connections, to replicas of both versions in a rollout."""

    installation: Installation
    namespace: str
    churn: bool = False
    threads: int = 1
    retries: int = 8
    created: int = 0
    refused: int = 0
    most_stored: int = 0
    refused_by_old: int = 0
    retried: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Creates:
        for _ in range(self.threads):
            worker = threading.Thread(target=self._run, daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=60)

    def _run(self) -> None:
        client = self.installation.plane.api_client()
        core = kubernetes.client.CoreV1Api(client)
        try:
            while not self._stop.is_set():
                self._one(core)
                if self.churn:
                    pods = core.list_namespaced_pod(self.namespace).items
                    stored = sum(1 for p in pods if p.metadata.deletion_timestamp is None)
                    with self._lock:
                        self.most_stored = max(self.most_stored, stored)
                self._stop.wait(0.05)
        except Exception as error:  # a dead thread must fail the test, not end quietly
            with self._lock:
                self.failures.append(f"the thread died: {error!r}")
        finally:
            client.close()

    def _one(self, core: kubernetes.client.CoreV1Api) -> None:
        for attempt in range(self.retries + 1):
            kind, message = classify(lambda: create(core, self.namespace))
            if OLD_REFUSAL in message:  # 0.1.0 answers its faults with HTTP 500
                kind = "retry"
            if kind in RETRIED and attempt < self.retries:
                with self._lock:
                    self.retried.append(f"{kind}: {message}")
                # Backing off as client-go does, from 0.2 s to 2 s: a 0.1.0 replica stops
                # without draining, and the apiserver's calls to it fail until it is gone.
                time.sleep(min(0.2 * 2**attempt, 2.0))
                continue
            break
        if kind in RETRIED and OLD_REFUSAL in message:
            # A 0.1.0 replica, each of its tries, on a record this version wrote: refused,
            # never admitted. The create is lost as a refusal is; the client tries anew.
            with self._lock:
                self.refused_by_old += 1
        elif kind == "created":
            with self._lock:
                self.created += 1
        elif self.churn and kind == "refused" and "h100 quota exceeded" in message:
            with self._lock:
                self.refused += 1
            pods = core.list_namespaced_pod(self.namespace).items
            live = [p for p in pods if p.metadata.deletion_timestamp is None]
            # None stored while gpuadm still counts some: a deletion it has not seen yet.
            if live:
                oldest = min(live, key=lambda p: p.metadata.creation_timestamp)
                try:
                    core.delete_namespaced_pod(oldest.metadata.name, self.namespace)
                except ApiException as error:
                    if error.status != 404:  # another thread deleted it first
                        raise
        else:
            with self._lock:
                self.failures.append(f"{kind}: {message}")


def _pause(installation: Installation, paused: bool) -> None:
    """Pause or resume the rollout of gpuadm's Deployment, as `kubectl rollout pause` does."""
    apps = kubernetes.client.AppsV1Api(installation.api)
    apps.patch_namespaced_deployment("gpuadm", NAMESPACE, {"spec": {"paused": paused}})


def _ca(installation: Installation) -> bytes:
    """ca.crt of the Secret gpuadm-tls, which the first replica up made and none of Helm's."""
    secret = installation.core.read_namespaced_secret("gpuadm-tls", NAMESPACE)
    return base64.b64decode(secret.data["ca.crt"])


def _bundles(installation: Installation) -> dict[str, bytes]:
    """The caBundle of every webhook of both configurations named gpuadm."""
    admission = kubernetes.client.AdmissionregistrationV1Api(installation.api)
    configurations = [
        admission.read_mutating_webhook_configuration("gpuadm"),
        admission.read_validating_webhook_configuration("gpuadm"),
    ]
    return {
        w.name: base64.b64decode(w.client_config.ca_bundle or "")
        for c in configurations
        for w in c.webhooks
    }


@dataclass
class KeptLogs:
    """Copies gpuadm's container logs off the node every half second while it runs: the
    kubelet removes a pod's logs with the pod, and a rollout deletes the old replicas."""

    installation: Installation
    logs: dict[str, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> KeptLogs:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._copy()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._copy()

    def _copy(self) -> None:
        directory = self.installation.node.workdir / "kubelet" / "pod-logs"
        for path in directory.glob(f"{NAMESPACE}_*/gpuadm/*.log"):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            if len(text) >= len(self.logs.get(str(path), "")):
                self.logs[str(path)] = text

    def misread(self, pods: set[str]) -> int:
        """How often gpuadm's pods `pods` logged a record they could not read as 0.1.0 reads
        it: this version's format met by 0.1.0."""
        return sum(
            text.count(OLD_MISREAD)
            for path, text in self.logs.items()
            if Path(path).parent.parent.name.split("_")[1] in pods
        )

    def decisions(self, pods: set[str], namespace: str) -> list[str]:
        """The times of the audit records of `namespace`'s pod creates that gpuadm's pods
        `pods` wrote (CRI log lines: time, stream, tag, then gpuadm's own line)."""
        times = []
        for path, text in self.logs.items():
            if Path(path).parent.parent.name.split("_")[1] not in pods:
                continue
            for line in text.splitlines():
                record = line.split(" ", 3)[-1]
                if f'"namespace":"{namespace}"' in record and '"endpoint":"validate"' in record:
                    times.append(json.loads(record)["time"])
        return sorted(times)


def _documented_handover() -> str:
    """The shell block of operations.md's first step of "Upgrading from 0.1.0", as written."""
    text = OPERATIONS_DOC.read_text()
    section = text[text.index("### Upgrading from 0.1.0") :]
    found = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert found is not None, "operations.md's 'Upgrading from 0.1.0' has no shell block"
    return textwrap.dedent(found.group(1))


def test_the_upgrade_stops_until_the_crd_is_handed_over_as_documented(
    installation: Installation, image: Image, old_image: Image
) -> None:
    """0.1.0's chart installed the CRD from crds/, which is no object of the release: Helm
    will not take it over, and stops the upgrade before it changes anything. The admin's
    step of operations.md, run as written with kubectl, hands it over."""
    with pytest.raises(AssertionError, match="cannot be imported into the current release"):
        installation.upgrade(installation.values(image, QUOTAS_AFTER))
    assert installation.all_pods_are(old_image.name)
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _documented_handover()],
        env={
            **os.environ,
            "PATH": f"{installation.plane.bin_dir}{os.pathsep}{os.environ['PATH']}",
            "KUBECONFIG": str(installation.plane.kubeconfig_path),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    extensions = kubernetes.client.ApiextensionsV1Api(installation.api)
    crd = extensions.read_custom_resource_definition("gpuquotas.gpuadm.io")
    assert crd.metadata.labels["app.kubernetes.io/managed-by"] == "Helm"
    assert crd.metadata.annotations["meta.helm.sh/release-name"] == RELEASE


def test_reused_values_of_0_1_0_do_not_render_with_this_chart(
    installation: Installation, image: Image
) -> None:
    """`--reuse-values` keeps 0.1.0's chart defaults in place of this chart's: the schema
    refuses its runbookBaseURL "", and the keys added since are missing. What works is the
    values given again (the test's upgrade), or `--reset-then-reuse-values`."""
    overrides = installation.values_dir / "image-only.yaml"
    overrides.write_text(
        yaml.safe_dump({"image": {"repository": image.repository, "tag": image.tag}})
    )
    common = ("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--dry-run", "-f", str(overrides))
    with pytest.raises(AssertionError, match="runbookBaseURL"):
        installation.helm(*common, "--reuse-values")
    rendered = installation.helm(*common, "--reset-then-reuse-values")
    assert "validate-configmaps.gpuadm.io" in rendered


def test_helm_upgrade_to_this_tree_over_admits_nowhere(
    installation: Installation, image: Image, old_image: Image
) -> None:
    wait_for(lambda: len(installation.ready_pods()) == 3, "3 gpuadm 0.1.0 pods Ready")
    ca = _ca(installation)
    assert all(ca in bundle for bundle in _bundles(installation).values())
    old_pods = {p.metadata.name for p in installation.gpuadm_pods()}
    errors: list[BaseException] = []

    def upgrade() -> None:
        try:
            # This tree's chart holds no class: the example policy and quotas come in as the
            # suite's other installs take them, with the test's quotas over them.
            installation.upgrade(installation.values(image, QUOTAS_AFTER))
        except BaseException as error:  # reported by the test's thread
            errors.append(error)

    def both_versions_ready() -> bool:
        images = {p.spec.containers[0].image for p in installation.ready_pods()}
        return images == {old_image.name, image.name}

    started = time.monotonic()
    with (
        Creates(installation, "stream") as stream,
        Creates(installation, "tight", churn=True, threads=6) as churn,
        KeptLogs(installation) as kept,
    ):
        time.sleep(2)
        helm = threading.Thread(target=upgrade)
        helm.start()
        mixed = wait_for(both_versions_ready, "a replica of each version Ready", 180)
        # Held there: `helm upgrade --wait` takes a paused Deployment as ready and returns.
        _pause(installation, True)
        wait_for(both_versions_ready, "a replica of each version Ready, paused", 30)
        # More callers at once than the apiserver keeps idle connections (25 a host): it
        # dials new ones, to replicas of both versions, while 0.1.0's hold theirs.
        burst_start = datetime.now(UTC).isoformat(timespec="milliseconds")
        outcomes = installation.create_many("burst", BURST, threads=ROUND)
        in_mixed = Outcomes()
        rounds = 0
        while rounds < ROUNDS:
            time.sleep(1)  # KeptLogs copies the logs every half second
            new_pods = {p.metadata.name for p in installation.gpuadm_pods()} - old_pods
            judged_by_both = kept.decisions(old_pods, "burst") and kept.decisions(new_pods, "burst")
            if judged_by_both and kept.misread(old_pods) > 0:
                break
            # "burst" is at or near its limit: more creates there are judged by either version.
            # "mixed" has room: this tree admits there, in its format, which 0.1.0 then meets.
            more = installation.create_many("burst", ROUND, threads=ROUND)
            outcomes.merge(more)
            in_mixed.merge(installation.create_many("mixed", ROUND, threads=ROUND))
            rounds += 1
        burst_took = time.monotonic() - started - mixed
        _pause(installation, False)
        helm.join(300)
        upgraded = time.monotonic() - started
        assert not helm.is_alive()
        assert not errors, errors
        wait_for(lambda: installation.all_pods_are(image.name), "the 0.1.0 replicas gone", 120)
        time.sleep(2)
    new_pods = {p.metadata.name for p in installation.gpuadm_pods()} - old_pods
    burst_by_old = [t for t in kept.decisions(old_pods, "burst") if t >= burst_start]
    burst_by_new = kept.decisions(new_pods, "burst")
    tight_by_old = kept.decisions(old_pods, "tight")
    tight_by_new = kept.decisions(new_pods, "tight")
    overlap = sum(t > tight_by_new[0] for t in tight_by_old) if tight_by_new else 0
    print(
        f"mixed after {mixed:.1f} s; burst and {rounds} more rounds ended {burst_took:.1f} s "
        f"after; 'mixed' created {len(in_mixed.created)}, refused by 0.1.0 "
        f"{len(in_mixed.other)}; helm upgrade --wait "
        f"returned after {upgraded:.1f} s; burst: created {len(outcomes.created)}, refused "
        f"{len(outcomes.refused)}, by 0.1.0 {len(burst_by_old)}, by this tree "
        f"{len(burst_by_new)}; stream created {stream.created}; churn created {churn.created}, "
        f"refused {churn.refused}, most stored {churn.most_stored}, judged by 0.1.0 "
        f"{len(tight_by_old)}, by this tree {len(tight_by_new)}, 0.1.0's after this tree's "
        f"first {overlap}; retried {len(stream.retried) + len(churn.retried)} + "
        f"{len(outcomes.retried)}: {(stream.retried + churn.retried + outcomes.retried)[:3]}; "
        f"refused by 0.1.0 on a record of this version: churn {churn.refused_by_old}, stream "
        f"{stream.refused_by_old}, burst {len(outcomes.other)}"
    )
    misread = kept.misread(old_pods)
    print(f"0.1.0 met a record in this version's format {misread} times")
    # While the versions served side by side, 0.1.0 met this version's record, and refused.
    assert misread > 0, "0.1.0 never met a record of this version: the rollout never mixed"
    # The burst was judged by replicas of both versions, and admitted no more than fit:
    # each create not admitted was refused for the quota, or by a 0.1.0 replica that met a
    # record of this version's and asked for a retry (each of its tries).
    assert burst_by_old, "no 0.1.0 replica judged the burst"
    assert burst_by_new, "no replica of this tree judged the burst"
    assert [m for m in outcomes.other + in_mixed.other if OLD_REFUSAL not in m] == []
    assert in_mixed.refused == in_mixed.unreachable == in_mixed.retry == []
    assert outcomes.unreachable == []
    assert outcomes.retry == []
    assert len(outcomes.created) <= LIMIT - HELD, outcomes
    assert [m for m in outcomes.refused if "h100 quota exceeded" not in m] == []
    assert len(_stored(installation, "burst")) <= LIMIT
    # "tight", held at its quota all along, never held more.
    assert churn.most_stored <= ROOM, f"tight held {churn.most_stored} pods, over {ROOM}"
    assert len(_stored(installation, "tight")) <= ROOM
    assert churn.failures == [], churn.failures[:5]
    assert stream.failures == [], stream.failures[:5]
    assert stream.created > 20
    # Once only this version serves, the burst's namespace fills exactly: no room was lost
    # to the rollout, none given twice.
    left = LIMIT - len(_stored(installation, "burst"))
    topped = installation.create_many("burst", left + 10)
    assert len(topped.created) == left, topped
    assert len(topped.refused) == 10
    assert len(_stored(installation, "burst")) == LIMIT
    pods = installation.ready_pods()
    assert len(pods) == 3
    assert {p.spec.containers[0].image for p in pods} == {image.name}
    stored = installation.create_gpu_pod("upgraded")
    assert _limits(stored) == {"nvidia.com/gpu": "1"}
    # gpuadm's own TLS goes on: the same CA, now in the webhook this chart added too.
    assert _ca(installation) == ca
    bundles = _bundles(installation)
    assert "validate-configmaps.gpuadm.io" in bundles
    assert all(ca in bundle for bundle in bundles.values()), bundles.keys()


def test_the_upgrade_carried_the_crd_and_gpuquotas_show_the_budget(
    installation: Installation,
) -> None:
    """The CRD is the chart's template now, upgraded with it: its budget columns and status
    fields are there, GPUQuota objects fill them, and every quota is still published."""
    extensions = kubernetes.client.ApiextensionsV1Api(installation.api)
    crd = extensions.read_custom_resource_definition("gpuquotas.gpuadm.io")
    columns = {c.name for c in crd.spec.versions[0].additional_printer_columns or []}
    assert {"Budget", "Budget used"} <= columns
    assert crd.metadata.annotations["helm.sh/resource-policy"] == "keep"

    def budget_published() -> bool:
        status = (_gpuquota(installation, "upgraded", "h100") or {}).get("status", {})
        return status.get("budget") == BUDGET and "budgetUsed" in status

    wait_for(budget_published, "GPUQuota upgraded/h100 showing its budget", 120)

    def tight_published() -> bool:
        status = (_gpuquota(installation, "tight", "h100") or {}).get("status", {})
        return str(status.get("limit")) == str(ROOM)

    wait_for(tight_published, "the new leader publishing GPUQuota tight/h100", 60)
