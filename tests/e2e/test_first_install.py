"""An admin's first day with the chart, on a real node: a config the replicas would refuse
never installs; the chart's defaults rewrite and charge nothing; docs/deploy.md's first
install runs as written; an upgrade to a refused config changes nothing.

The scenarios share one control plane and node, in file order.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.e2e.installed import (
    NAMESPACE,
    RELEASE,
    TENANT_IMAGE,
    Image,
    Installation,
    on_a_real_node,
    wait_for,
)
from tests.support import ROOT

DEPLOY_DOC = ROOT / "docs" / "deploy.md"
# The image docs/deploy.md's first install names: the one "The image" builds and pushes.
DOCUMENTED_REPOSITORY = "registry.example.com/gpuadm"
CHECK_JOB = "gpuadm-config-check"
# Examples' quotas with one more, on a class the example policy does not have: the keys are
# well formed (the values' schema lets them through), and gpuadm would refuse the config.
UNKNOWN_CLASS_QUOTAS = {"namespaces": {"team-a": {"v100": 2}}}


@pytest.fixture(scope="module")
def installation(image: Image) -> Iterator[Installation]:
    with on_a_real_node(image) as installed:
        installed.make_namespace("plain")
        yield installed


def _chart_version() -> str:
    chart = yaml.safe_load((ROOT / "deploy" / "helm" / "gpuadm" / "Chart.yaml").read_text())
    version: str = chart["appVersion"]
    return version


def _check_log(installation: Installation) -> str:
    """What the check Job's container wrote, from the kubelet's logs."""
    directory = installation.node.workdir / "kubelet" / "pod-logs"
    files = list(directory.glob(f"{NAMESPACE}_{CHECK_JOB}-*/check-config/*.log"))
    assert files, f"no log of the {CHECK_JOB} Job's pod"
    # The latest Job's: an earlier one's may not be cleaned up yet.
    return max(files, key=lambda path: path.stat().st_mtime).read_text(errors="replace")


def _exists(read: Any, *args: str) -> bool:
    try:
        read(*args)
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True


def _uninstall(installation: Installation, *, hooks: bool = True) -> None:
    no_hooks = () if hooks else ("--no-hooks",)
    installation.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", *no_hooks)
    wait_for(lambda: not installation.gpuadm_pods(), "gpuadm's pods gone", 120)


def test_a_config_the_replicas_would_refuse_never_installs(
    installation: Installation, image: Image
) -> None:
    with pytest.raises(AssertionError) as refused:
        installation.install(installation.values(image, UNKNOWN_CLASS_QUOTAS))
    failure = str(refused.value)
    assert f"failed pre-install: 1 error occurred:\n\t* job {CHECK_JOB} failed" in failure
    assert "BackoffLimitExceeded" in failure
    # The Job's log is check-config's report, naming the file, the namespace and the class.
    log = _check_log(installation)
    assert "quotas.yaml" in log
    assert "team-a" in log
    assert "v100" in log
    # Nothing of the release was made: no replica, no config, no webhook.
    apps = kubernetes.client.AppsV1Api(installation.api)
    assert not _exists(apps.read_namespaced_deployment, "gpuadm", NAMESPACE)
    assert not _exists(installation.core.read_namespaced_config_map, "gpuadm-policy", NAMESPACE)
    admission = kubernetes.client.AdmissionregistrationV1Api(installation.api)
    assert not _exists(admission.read_validating_webhook_configuration, "gpuadm")
    # The failed Job and its config stay for the admin to read; the failed release goes as
    # docs/deploy.md says.
    batch = kubernetes.client.BatchV1Api(installation.api)
    assert _exists(batch.read_namespaced_job, CHECK_JOB, NAMESPACE)
    _uninstall(installation)


def test_an_image_the_node_cannot_pull_fails_the_install_saying_so(
    installation: Installation, image: Image
) -> None:
    """The placeholder image, or a typo in image.repository: the check Job cannot start, and
    the install fails at its deadline with nothing installed, rather than registering a
    fail-closed webhook that no replica will ever answer."""
    values = installation.values(image, {})
    values["image"] = {"repository": "registry.invalid/gpuadm", "pullPolicy": "IfNotPresent"}
    values["configCheck"] = {"activeDeadlineSeconds": 30}
    with pytest.raises(AssertionError) as refused:
        installation.install(values)
    assert f"job {CHECK_JOB} failed: DeadlineExceeded" in str(refused.value)
    admission = kubernetes.client.AdmissionregistrationV1Api(installation.api)
    assert not _exists(admission.read_validating_webhook_configuration, "gpuadm")
    # Its uninstall Job could not pull the image either: nothing of the release to undo.
    _uninstall(installation, hooks=False)


def test_the_defaults_rewrite_and_charge_nothing(installation: Installation, image: Image) -> None:
    values = installation.values(image, {})
    del values["quotas"]  # the chart's own: none
    installation.install(values, examples=None)
    wait_for(lambda: len(installation.ready_pods()) == 3, "3 gpuadm pods Ready")
    pod = {
        "metadata": {"generateName": "vllm-"},
        "spec": {
            "containers": [
                {
                    "name": "vllm",
                    "image": TENANT_IMAGE,
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }
    response = installation.core.create_namespaced_pod("plain", pod, _preload_content=False)
    stored = yaml.safe_load(response.data)
    container = stored["spec"]["containers"][0]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "1"},
        "requests": {"nvidia.com/gpu": "1"},
    }
    assert not any("gpuadm" in key for key in stored["metadata"].get("annotations", {}))
    assert not any("gpuadm" in key for key in stored["metadata"].get("labels", {}))
    assert "affinity" not in stored["spec"]
    assert "schedulingGates" not in stored["spec"]
    _uninstall(installation)


def _first_install_commands() -> str:
    """The first shell block of docs/deploy.md's "Install with Helm", as written."""
    text = DEPLOY_DOC.read_text()
    section = text[text.index("## Install with Helm") :]
    found = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert found is not None, "docs/deploy.md's 'Install with Helm' has no shell block"
    return found.group(1)


def test_the_documented_first_install_runs_as_written(
    installation: Installation, image: Image
) -> None:
    commands = _first_install_commands()
    assert commands.startswith("helm install gpuadm deploy/helm/gpuadm")
    # The image as "The image" builds and pushes it: the node holds it under that name.
    installation.node.tag(image.name, f"{DOCUMENTED_REPOSITORY}:{_chart_version()}")
    tools = {
        Path(installation.helm_binary).parent,
        installation.plane.bin_dir,
    }
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", commands],
        cwd=ROOT,
        env={
            **os.environ,
            "PATH": os.pathsep.join([*map(str, tools), os.environ["PATH"]]),
            "KUBECONFIG": str(installation.plane.kubeconfig_path),
            "HELM_CACHE_HOME": str(installation.values_dir / "helm-cache"),
        },
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert ran.returncode == 0, f"{ran.stdout}\n{ran.stderr}\n{installation.describe()}"
    assert 'deployment "gpuadm" successfully rolled out' in ran.stdout
    pods = installation.ready_pods()
    assert len(pods) == 3
    assert {p.spec.containers[0].image for p in pods} == {
        f"{DOCUMENTED_REPOSITORY}:{_chart_version()}"
    }
    # The example's classes are in force: an h100 pod is rewritten.
    stored = installation.create_gpu_pod("plain")
    assert stored["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert "gpuadm.io/class" in stored["metadata"]["labels"]


def test_an_upgrade_to_a_config_the_replicas_would_refuse_changes_nothing(
    installation: Installation, image: Image
) -> None:
    quotas = installation.core.read_namespaced_config_map("gpuadm-quotas", NAMESPACE).data
    pods = {p.metadata.name for p in installation.ready_pods()}
    with pytest.raises(AssertionError) as refused:
        installation.upgrade(installation.values(image, UNKNOWN_CLASS_QUOTAS))
    failure = str(refused.value)
    assert "UPGRADE FAILED: pre-upgrade hooks failed" in failure
    assert f"job {CHECK_JOB} failed: BackoffLimitExceeded" in failure
    assert "v100" in _check_log(installation)
    assert installation.core.read_namespaced_config_map("gpuadm-quotas", NAMESPACE).data == quotas
    assert {p.metadata.name for p in installation.ready_pods()} == pods
    history = yaml.safe_load(
        installation.helm("history", RELEASE, "--namespace", NAMESPACE, "-o", "yaml")
    )
    assert [(r["revision"], r["status"]) for r in history] == [(1, "deployed"), (2, "failed")]
