"""`gpuadm review` of what users really have: workloads' pod templates, several documents,
Lists and stdin; `-n` for the stored pod too; `--in-use` for what already runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import ROOT
from webhook.cli import main
from webhook.cli.exits import ExitCode

POLICY = str(ROOT / "examples" / "policy.yaml")
QUOTAS = str(ROOT / "examples" / "quotas.yaml")
POD_SPEC = {
    "containers": [{"name": "main", "image": "x", "resources": {"limits": {"gpuadm.io/h100": "1"}}}]
}
GPUADM = [sys.executable, "-m", "webhook.cli"]
TEMPLATE = {"metadata": {"labels": {"app": "w"}}, "spec": POD_SPEC}


def workload(kind: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": TEMPLATE}
    if kind == "CronJob":
        spec = {"schedule": "@daily", "jobTemplate": {"spec": {"template": TEMPLATE}}}
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "w"}, "spec": spec}


def review(
    tmp_path: Path, documents: list[dict[str, Any]], *args: str, quotas: str = QUOTAS
) -> tuple[int, Any]:
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    command = [*GPUADM, "review", str(path), "--policy", POLICY, "--quotas", quotas, "-o", "json"]
    capture = subprocess.run(
        [*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert "Traceback" not in capture.stderr, capture.stderr
    # 0 runs, 1 refused, 3 waits: never 2, the command failing.
    assert capture.returncode in (0, 1, 3), capture.stderr
    return capture.returncode, json.loads(capture.stdout)


@pytest.mark.parametrize(
    "kind", ["Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "Job", "CronJob"]
)
def test_the_pod_template_of_a_workload_is_reviewed(
    kind: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(workload(kind)))
    assert main(["review", str(path), "--policy", POLICY, "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["demand"] == "h100=1"
    stored = result["pod"]
    assert stored["kind"] == "Pod"
    assert stored["metadata"]["generateName"] == "w-"
    assert stored["metadata"]["labels"]["app"] == "w"
    assert stored["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_the_example_job_is_reviewed_as_its_three_workers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = str(ROOT / "examples" / "pods" / "h100-job.yaml")
    assert main(["review", job, "--policy", POLICY, "--quotas", QUOTAS]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "pods: all 3 pods run" in out
    assert "namespace team-c, gang 'train' of 3 (Job): runs whole" in out


def test_the_example_job_with_room_for_two_waits_whole_in_its_queue_namespace(
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = str(ROOT / "examples" / "pods" / "h100-job.yaml")
    code = main(["review", job, "--policy", POLICY, "--quotas", QUOTAS, "--in-use", "h100=2"])
    assert code == ExitCode.WAITS
    out = capsys.readouterr().out
    assert "verdict: allowed (namespace team-c)" in out
    assert "pods: 0 of 3 pods run; 3 wait in line for room" in out
    assert "namespace team-c, h100: 3 pods ask for 3 (in use 2 of 4): 3 wait" in out
    assert (
        "namespace team-c, gang 'train' of 3 (Job): waits whole, and its 3 pods go together "
        'once they fit: namespace "team-c": h100 quota has no room for the gang'
    ) in out
    assert "its 3 waiting pods need 3 at once, in use 2 of 4" in out


def test_a_gang_in_enforce_mode_is_refused_whole(tmp_path: Path) -> None:
    job = workload("Job")
    job["apiVersion"] = "batch/v1"
    job["metadata"]["namespace"] = "team-e"
    job["spec"]["parallelism"] = 3
    quotas = quotas_file(tmp_path, "namespaces:\n  team-e: {h100: 2}\n")
    code, result = review_with(tmp_path, [job], quotas)
    assert code == 1
    (gang,) = [t for t in result["totals"] if "gang" in t]
    assert "its first pod is refused unless the whole gang fits" in gang["summary"]


def test_several_documents_and_lists_are_each_reviewed(tmp_path: Path) -> None:
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": POD_SPEC}
    half = {
        "kind": "Pod",
        "metadata": {"name": "q"},
        "spec": {
            "containers": [
                {"name": "m", "image": "x", "resources": {"limits": {"gpuadm.io/h100": "0.5"}}}
            ]
        },
    }
    listed = {"apiVersion": "v1", "kind": "List", "items": [workload("Job"), half]}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    code, result = review(tmp_path, [pod, service, listed])
    assert code == 1  # one of them would be denied
    verdicts = [(item["object"], item["allowed"]) for item in result["items"]]
    assert verdicts == [("Pod/p", True), ("Job/w", True), ("Pod/q", False)]


def test_stdin_is_read_with_a_dash() -> None:
    job = (ROOT / "examples" / "pods" / "h100-job.yaml").read_text()
    capture = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "review", "-", "--policy", POLICY, "-o", "json"],
        input=job,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert capture.returncode == 0, capture.stderr
    assert json.loads(capture.stdout)["namespace"] == "team-c"


def test_dash_n_is_the_namespace_of_the_stored_pod_too(tmp_path: Path) -> None:
    # A manifest that names another namespace is refused (test_kubectl_habits.py).
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": POD_SPEC}
    code, result = review(tmp_path, [pod], "-n", "team-b")
    assert code == 0
    assert result["namespace"] == "team-b"
    assert result["pod"]["metadata"]["namespace"] == "team-b"


@pytest.mark.parametrize(
    ("in_use", "allowed", "reason"),
    [
        pytest.param([], True, None, id="nothing-runs"),
        pytest.param(["--in-use", "a100=1"], True, None, id="fits-next-to-one"),
        pytest.param(
            ["--in-use", "a100=2"],
            False,
            'namespace "team-d": a100 quota exceeded: requested 1, in use 2 of 2',
            id="full",
        ),
        pytest.param(
            ["--in-use", "a100=1.5,t4=1"],
            False,
            'namespace "team-d": a100 quota exceeded: requested 1, in use 1.5 of 2',
            id="whole-and-share",
        ),
    ],
)
def test_in_use_says_whether_the_pod_fits_next_to_what_runs(
    tmp_path: Path, in_use: list[str], allowed: bool, reason: str | None
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("namespaces:\n  team-d:\n    a100: 2\n")
    limits = {"gpuadm.io/a100": "1"}
    container = {"name": "main", "image": "x", "resources": {"limits": limits}}
    pod = {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [container]}}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    capture = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "review",
            str(path),
            "--policy",
            POLICY,
            "--quotas",
            str(quotas),
            "-n",
            "team-d",
            "-o",
            "json",
            *in_use,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    result = json.loads(capture.stdout)
    assert result["allowed"] is allowed
    if reason:
        assert result["reason"].startswith(reason), result["reason"]


def test_in_use_of_a_class_the_policy_lacks_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    job = str(ROOT / "examples" / "pods" / "h100-job.yaml")
    assert main(["review", job, "--policy", POLICY, "--in-use", "h10=1"]) == 2
    assert "gpuadm: --in-use h10=1: no class 'h10' in the policy" in capsys.readouterr().err


def test_in_use_no_pod_could_hold_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    job = str(ROOT / "examples" / "pods" / "h100-job.yaml")
    assert main(["review", job, "--policy", POLICY, "--in-use", "h100=1.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuadm: --in-use h100=1.5: no pod can hold that: ")
    assert "backend nvidia gives whole GPUs only" in err


# Whole workloads: every pod a controller makes, judged in turn ----------------------------

HALF_A100 = {"limits": {"gpuadm.io/a100": "0.5"}}


def half_template() -> dict[str, Any]:
    container = {"name": "main", "image": "x", "resources": HALF_A100}
    return {"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [container]}}


def quotas_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "quotas.yaml"
    path.write_text(text)
    return str(path)


def review_with(
    tmp_path: Path, documents: list[dict[str, Any]], quotas: str, *args: str
) -> tuple[int, Any]:
    return review(tmp_path, documents, *args, quotas=quotas)


def deployment(replicas: int, name: str = "w") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "team-d"},
        "spec": {"replicas": replicas, "template": half_template()},
    }


@pytest.mark.parametrize(
    ("replicas", "code", "runs", "refused"),
    [
        pytest.param(3, 0, 3, 0, id="three-halves-fit-1.5"),
        pytest.param(4, 1, 3, 1, id="the-fourth-is-refused"),
        pytest.param(0, 0, 0, 0, id="scaled-to-0"),
    ],
)
def test_a_deployment_is_judged_as_all_its_replicas(
    tmp_path: Path, replicas: int, code: int, runs: int, refused: int
) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d:\n    a100: 1.5\n")
    exit_code, result = review_with(tmp_path, [deployment(replicas)], quotas)
    assert exit_code == code
    assert result["allowed"] is True  # the first pod alone fits
    workload = result["workload"]
    assert (workload["pods"], workload["runs"], workload["refused"]) == (replicas, runs, refused)
    if refused:
        assert workload["summary"] == "3 of 4 pods run; 1 would be refused"
    (total,) = result["totals"]
    assert total["asked"] == str(replicas * 0.5).removesuffix(".0")
    assert (total["limit"], total["inUse"], total["runs"]) == ("1.5", "0", runs)


def test_what_runs_already_leaves_less_room_for_the_replicas(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d:\n    a100: 1.5\n")
    code, result = review_with(tmp_path, [deployment(3)], quotas, "--in-use", "a100=0.5")
    assert code == 1
    assert result["workload"]["summary"] == "2 of 3 pods run; 1 would be refused"
    assert result["totals"][0]["summary"] == (
        "namespace team-d, a100: 3 pods ask for 1.5 (in use 0.5 of 1.5): 2 run, 1 refused"
    )


def test_the_workloads_of_one_input_share_the_namespaces_room(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d:\n    a100: 1.5\n")
    code, result = review_with(tmp_path, [deployment(2, "first"), deployment(2, "second")], quotas)
    assert code == 1
    first, second = result["items"]
    assert (first["object"], first["workload"]["runs"]) == ("Deployment/first", 2)
    assert (second["object"], second["workload"]["runs"], second["workload"]["refused"]) == (
        "Deployment/second",
        1,
        1,
    )
    (total,) = result["totals"]
    assert (total["pods"], total["asked"], total["runs"], total["refused"]) == (4, "2", 3, 1)


def test_in_queue_mode_the_pods_without_room_wait_and_the_exit_says_so(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "mode: queue\nnamespaces:\n  team-d:\n    a100: 1\n")
    code, result = review_with(tmp_path, [deployment(3)], quotas)
    assert code == ExitCode.WAITS
    workload = result["workload"]
    assert (workload["runs"], workload["waiting"], workload["refused"]) == (2, 1, 0)
    assert workload["summary"] == "2 of 3 pods run; 1 waits in line for room"


def test_in_warn_mode_every_pod_runs_and_those_past_the_limit_are_counted(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "mode: warn\nnamespaces:\n  team-d:\n    a100: 1\n")
    code, result = review_with(tmp_path, [deployment(3)], quotas)
    assert code == 0
    workload = result["workload"]
    assert (workload["runs"], workload["overQuota"]) == (3, 1)
    assert workload["summary"] == "all 3 pods run (1 past the limit: warn mode admits them)"


def pytorch_job(master: int, workers: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "train", "namespace": "team-d"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": master, "template": half_template()},
                "Worker": {"replicas": workers, "template": half_template()},
            }
        },
    }


def test_a_training_job_on_its_own_is_judged_as_a_gang(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d:\n    a100: 1.5\n")
    code, result = review_with(tmp_path, [pytorch_job(1, 3)], quotas)
    assert code == 1
    master, worker = result["items"]
    assert master["object"] == "PyTorchJob/train pytorchReplicaSpecs.Master"
    # Its master is its first pod, refused for the whole gang (4 of 0.5 against 1.5); so is
    # its first worker, and the others meet the same.
    assert (master["workload"]["pods"], master["workload"]["runs"]) == (1, 0)
    assert (worker["workload"]["pods"], worker["workload"]["runs"]) == (3, 0)
    gang = next(t for t in result["totals"] if "gang" in t)
    assert gang["gang"] == {"form": "PyTorchJob", "name": "train", "size": 4}
    assert gang["summary"] == (
        "namespace team-d, gang 'train' of 4 (PyTorchJob): none of its pods run (4 needed): "
        "its first pod is refused unless the whole gang fits, so nothing is held"
    )


def test_no_gpu_workload_in_a_multi_document_input_is_skipped(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d:\n    a100: 4\n")
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}
    notebook = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {"name": "nb", "namespace": "team-d"},
        "spec": {"template": half_template()},
    }
    code, result = review_with(tmp_path, [service, pytorch_job(1, 1), notebook], quotas)
    assert code == 0
    judged = [item["object"] for item in result["items"]]
    assert judged == [
        "PyTorchJob/train pytorchReplicaSpecs.Master",
        "PyTorchJob/train pytorchReplicaSpecs.Worker",
        "Notebook/nb spec.template",
    ]
    assert result["notJudged"] == ["Service/s"]


def test_a_podgroup_in_the_input_gives_its_pods_gang_its_size(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d:\n    a100: 4\n")
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "team-d"},
        "spec": {"minMember": 3},
    }
    pod_template = half_template()
    pod_template["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = "g"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "team-d"},
        "spec": {"parallelism": 3, "template": pod_template},
    }
    code, result = review_with(tmp_path, [group, job], quotas)
    assert code == 0
    assert result["workload"]["gang"] == {"form": "coscheduling", "name": "g", "size": 3}
    gang = next(t for t in result["totals"] if "gang" in t)
    assert gang["summary"] == (
        "namespace team-d, gang 'g' of 3 (coscheduling): runs whole: 3 of its pods run, "
        "of 3 it needs"
    )
    # Without its PodGroup, the gang's size is unknown, and said to be.
    code, result = review_with(tmp_path, [job], quotas)
    gang = next(t for t in result["totals"] if "gang" in t)
    assert "its size is unknown: its PodGroup is not in the input" in gang["summary"]


def test_a_large_workload_is_judged_whole_without_creating_each_pod(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d:\n    a100: 2\n")
    code, result = review_with(tmp_path, [deployment(5000)], quotas)
    assert code == 1
    workload = result["workload"]
    assert (workload["pods"], workload["runs"], workload["refused"]) == (5000, 4, 4996)


def test_a_daemonset_is_judged_as_one_pod_per_node(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d:\n    a100: 2\n")
    daemonset = {**deployment(1), "kind": "DaemonSet"}
    code, result = review_with(tmp_path, [daemonset], quotas)
    assert code == 0
    assert result["workload"]["pods"] is None
    assert result["workload"]["summary"] == "one pod per node, each judged as this one"


def test_a_gang_that_cannot_be_read_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pod_template = half_template()
    pod_template["metadata"]["annotations"] = {"gpuadm.io/gang": "g"}
    job = {"kind": "Job", "metadata": {"name": "j"}, "spec": {"template": pod_template}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["review", str(path), "--policy", POLICY]) == 2
    assert "gpuadm.io/gang='g' needs the annotation gpuadm.io/gang-size" in capsys.readouterr().err


def test_each_group_of_a_leader_worker_set_is_a_gang_of_its_size(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d:\n    a100: 1.5\n")
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "serve", "namespace": "team-d"},
        "spec": {
            "replicas": 2,
            "leaderWorkerTemplate": {"size": 2, "workerTemplate": half_template()},
        },
    }
    code, result = review_with(tmp_path, [lws], quotas)
    assert code == 1
    leaders, workers = result["items"]
    assert (leaders["workload"]["pods"], workers["workload"]["pods"]) == (2, 2)
    gang = next(t for t in result["totals"] if "gang" in t)
    assert gang["summary"] == (
        "namespace team-d, gang 'serve' of 2 (LeaderWorkerSet): in groups of 2, each of which "
        "needs all its pods: 3 of 4 run"
    )


# Bounds and odd input ------------------------------------------------------------------------


def h100_deployment(replicas: int, name: str = "w") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "team-d"},
        "spec": {"replicas": replicas, "template": TEMPLATE},
    }


def test_pods_are_created_until_room_runs_out_however_many_the_workload_has(
    tmp_path: Path,
) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d:\n    h100: 1200\n")
    code, result = review_with(tmp_path, [h100_deployment(2000)], quotas)
    assert code == 1
    workload = result["workload"]
    assert (workload["runs"], workload["refused"], workload["notJudged"]) == (1200, 800, 0)


def test_pods_beyond_the_reviews_budget_are_not_judged_and_the_review_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from webhook.cli import admission_run

    monkeypatch.setattr(admission_run, "MAX_CREATED", 10)
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d: {}\n")
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(h100_deployment(25)))
    assert main(["review", str(path), "--policy", POLICY, "--quotas", quotas]) == 2
    captured = capsys.readouterr()
    assert "pods: all 10 pods run; 15 more not judged: a review creates 10 pods at most" in (
        captured.out
    )
    assert captured.err == (
        "gpuadm: 15 pods of the input were not judged: a review creates 10 pods at most; "
        "review the workloads in parts\n"
    )


def test_aliases_that_nest_cannot_make_a_review_endless(tmp_path: Path) -> None:
    levels = ["a0: &a0 {template: {spec: {containers: [{name: m, image: x}]}}}"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 8)}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("kind: Weird\nmetadata: {name: w}\nspec:\n  " + "\n  ".join(levels) + "\n")
    capture = subprocess.run(
        [*GPUADM, "review", str(path), "--policy", POLICY, "-o", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # 8^8 templates once written out: refused at once, by what it stands for.
    assert capture.returncode == 2
    assert "stands for more than 2000000 values" in capture.stderr


def test_lists_of_aliased_lists_are_refused_past_the_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    levels = ["l0: &l0 {kind: List, items: [{kind: Service, metadata: {name: s}}]}"]
    levels += [
        f"l{i}: &l{i} {{kind: List, items: [{', '.join([f'*l{i - 1}'] * 10)}]}}"
        for i in range(1, 6)
    ]
    path = tmp_path / "lists.yaml"
    path.write_text("holder:\n  " + "\n  ".join(levels) + "\nkind: List\nitems: [*l5]\n")
    assert main(["review", str(path), "--policy", POLICY]) == 2
    assert f"{path} holds more than 10000 objects: review it in parts" in capsys.readouterr().err


def test_a_kind_of_another_api_group_is_found_by_its_shape(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d: {h100: 4}\n")
    volcano_job = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "vj", "namespace": "team-d"},
        "spec": {
            "minAvailable": 3,
            "tasks": [{"name": "worker", "replicas": 3, "template": TEMPLATE}],
        },
    }
    code, result = review_with(tmp_path, [volcano_job], quotas)
    assert code == 0
    assert "object" not in result  # one pod set: shown alone
    assert result["workload"]["pods"] == 3
    assert result["workload"]["summary"] == "all 3 pods run"


def test_a_rayjob_on_a_cluster_that_exists_makes_no_pods(tmp_path: Path) -> None:
    ray_job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "rj"},
        "spec": {"clusterSelector": {"ray.io/cluster": "shared"}},
    }
    code, result = review(tmp_path, [ray_job, h100_deployment(1)])
    assert code == 0
    assert result["notJudged"] == ["RayJob/rj"]


def test_a_podgroup_sizes_the_gang_of_its_own_namespace_only(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d: {h100: 8}\n")

    def group(namespace: str, size: int) -> dict[str, Any]:
        return {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "g", "namespace": namespace},
            "spec": {"minMember": size},
        }

    pods = {**TEMPLATE, "metadata": {"annotations": {"scheduling.k8s.io/group-name": "g"}}}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "team-d"},
        "spec": {"parallelism": 2, "template": pods},
    }
    code, result = review_with(tmp_path, [group("team-d", 2), group("other", 8), job], quotas)
    assert code == 0
    assert result["workload"]["gang"] == {"form": "volcano", "name": "g", "size": 2}


def test_a_gang_not_in_groups_is_said_to_miss_its_size(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d: {h100: 1}\n")
    pods = {
        **TEMPLATE,
        "metadata": {"annotations": {"gpuadm.io/gang": "g", "gpuadm.io/gang-size": "2"}},
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "team-d"},
        "spec": {"parallelism": 4, "template": pods},
    }
    code, result = review_with(tmp_path, [job], quotas)
    assert code == 1
    gang = next(t for t in result["totals"] if "gang" in t)
    assert gang["summary"] == (
        "namespace team-d, gang 'g' of 2 (gpuadm): none of its pods run (2 needed): its first "
        "pod is refused unless the whole gang fits, so nothing is held"
    )


def test_a_workload_scaled_to_0_is_shown_as_it_stands(tmp_path: Path) -> None:
    quotas = quotas_file(tmp_path, "namespaces:\n  team-d: {h100: 1}\n")
    code, result = review_with(tmp_path, [h100_deployment(1, "a"), h100_deployment(0, "b")], quotas)
    assert code == 0
    scaled = result["items"][1]
    assert (scaled["allowed"], scaled["workload"]["pods"]) == (True, 0)


@pytest.mark.parametrize(
    ("documents", "error"),
    [
        pytest.param(
            [
                {
                    "kind": "Pod",
                    "metadata": {
                        "name": "p",
                        "annotations": {"gpuadm.io/gang": "g", "gpuadm.io/gang-size": "²"},
                    },
                    "spec": POD_SPEC,
                }
            ],
            "gpuadm.io/gang-size is '²': a gang's size is a whole number from 1 to 10000",
            id="a-size-of-another-script",
        ),
        pytest.param(
            [
                {
                    "kind": "Pod",
                    "metadata": {
                        "name": "p",
                        "annotations": {"gpuadm.io/gang": "g", "gpuadm.io/gang-size": "9" * 5000},
                    },
                    "spec": POD_SPEC,
                }
            ],
            "a gang's size is a whole number from 1 to 10000",
            id="a-size-of-5000-digits",
        ),
    ],
)
def test_gang_sizes_that_are_no_number_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], documents: list[dict[str, Any]], error: str
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    assert main(["review", str(path), "--policy", POLICY]) == 2
    assert error in capsys.readouterr().err


def test_a_podgroup_whose_spec_is_no_mapping_is_a_group_of_one(tmp_path: Path) -> None:
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "g"},
        "spec": [1],
    }
    code, result = review(tmp_path, [group, h100_deployment(1)])
    assert code == 0
    assert result["workload"]["pods"] == 1


def test_a_pod_whose_aliases_stand_for_a_billion_values_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text(
        "kind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: m, image: x}]\n  "
        + "\n  ".join(levels)
        + "\n"
    )
    assert main(["review", str(path), "--policy", POLICY]) == 2
    assert capsys.readouterr().err == (
        f"gpuadm: {path} stands for more than 2000000 values once its YAML aliases are written "
        "out: review it in parts\n"
    )


@pytest.mark.parametrize("depth", [150, 5000])
def test_a_manifest_nested_too_deep_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("kind: Pod\nmetadata: {name: p}\nspec: " + "[" * depth + "]" * depth + "\n")
    assert main(["review", str(path), "--policy", POLICY]) == 2
    err = capsys.readouterr().err
    assert "nested" in err
    assert "Traceback" not in err
