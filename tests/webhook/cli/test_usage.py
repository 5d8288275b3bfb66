"""`gpuadm usage`: the GPU-hours records, read from the cluster as an admin reads them.

The command reads the small apiserver of the other commands' tests, which serves gpuadm's
policy and quotas and GPU-hours records written as the leader writes them (`encode_hours`),
at a fixed moment (`NOW`) handed to the command instead of the clock.
"""

from __future__ import annotations

import csv
import io
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.quota.budget import DAY, HOUR
from policies.quota.gpu_hours import Bucket, ClassHours, Hours, encode_hours
from tests.builders import POLICY_YAML
from tests.support import ROOT
from tests.webhook.cli.apiserver import FakeApiserver, fake_apiserver, write_kubeconfig
from webhook.cli import build_parser, main, usage
from webhook.kube.objects import HOURS_DATA_KEY, HOURS_RECORD_LABEL, hours_record_name

NAMESPACE = "gpuadm-system"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
# 2027-01-15T08:00:00Z, on the hour.
NOW = 1_800_000_000
QUOTAS_YAML = """
mode: enforce
namespaces:
  team-a:
    a100: 4
    budget: {a100: 20h/1d, "*": 100h/7d}
  team-b:
    h100: 2
    budget: {t4: 5h/1d}
"""

# team-a's a100: a day-wide bucket that ended 2 days ago, then three hour-wide buckets of
# the last three hours; 7200 GPU-seconds older than every bucket are in the total only.
TEAM_A = Hours(
    NOW - 30,
    {
        "a100": ClassHours(
            Fraction(55800),
            (
                Bucket(NOW - 3 * DAY, DAY, Fraction(36000)),
                Bucket(NOW - 3 * HOUR, HOUR, Fraction(3600)),
                Bucket(NOW - 2 * HOUR, HOUR, Fraction(7200)),
                Bucket(NOW - HOUR, HOUR, Fraction(1800)),
            ),
        ),
        # A third of a T4 for 4000 s: GPU-seconds that are no whole number.
        "t4": ClassHours(Fraction(4000, 3), (Bucket(NOW - HOUR, HOUR, Fraction(4000, 3)),)),
    },
)
TEAM_B = Hours(
    NOW - 90,
    {
        "h100": ClassHours(
            Fraction(7200),
            (
                Bucket(NOW - 2 * HOUR, HOUR, Fraction(3600)),
                Bucket(NOW - HOUR, HOUR, Fraction(3600)),
            ),
        )
    },
)


def config_map(name: str, data: dict[str, str], **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "data": data,
    }


def record(namespace: str, hours: Hours) -> dict[str, Any]:
    """The ConfigMap the leader writes for a namespace's hours."""
    return config_map(
        hours_record_name(namespace),
        {HOURS_DATA_KEY: json.dumps(encode_hours(hours))},
        **{HOURS_RECORD_LABEL: namespace},
    )


def broken_record(namespace: str, text: str) -> dict[str, Any]:
    return config_map(
        hours_record_name(namespace), {HOURS_DATA_KEY: text}, **{HOURS_RECORD_LABEL: namespace}
    )


def config_maps(*records: dict[str, Any], quotas: str = QUOTAS_YAML) -> dict[str, Any]:
    return {
        "kind": "ConfigMapList",
        "metadata": {"resourceVersion": "1"},
        "items": [
            config_map("gpuadm-policy", {"policy.yaml": POLICY_YAML}),
            config_map("gpuadm-quotas", {"quotas.yaml": quotas}),
            *records,
        ],
    }


@pytest.fixture(scope="module")
def running_apiserver() -> Iterator[FakeApiserver]:
    with fake_apiserver() as server:
        yield server


@pytest.fixture
def apiserver(running_apiserver: FakeApiserver) -> FakeApiserver:
    """The apiserver, serving gpuadm's config and the records of team-a and team-b."""
    running_apiserver.objects.clear()
    running_apiserver.forbidden.clear()
    running_apiserver.objects[CONFIGMAPS] = config_maps(
        record("team-a", TEAM_A), record("team-b", TEAM_B)
    )
    return running_apiserver


def run_usage(apiserver: FakeApiserver, tmp_path: Path, *argv: str) -> int:
    """Run `gpuadm usage` against the apiserver at `NOW`; return its exit code."""
    kubeconfig = apiserver.kubeconfig(tmp_path / "kubeconfig")
    args = build_parser().parse_args(["usage", "--kubeconfig", str(kubeconfig), *argv])
    return int(usage.run(args, clock=lambda: NOW))


def items(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str
) -> dict[tuple[str, str], dict[str, Any]]:
    """The `-o json` items, by namespace and class."""
    assert run_usage(apiserver, tmp_path, "-o", "json", *argv) == 0
    found: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["items"]
    return {(item["namespace"], item["class"]): item for item in found}


def test_the_table_shows_each_namespace_and_class_with_its_budget(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_usage(apiserver, tmp_path) == 0
    # team-a a100: 13.5h in 30 days, 15.5h in all; in the last day (its budget's window)
    # the three hour-wide buckets, 3.5h. `*` sums a100 and t4 (4000/3 s, 0.37h). team-b's
    # t4 has a budget and no usage: shown at 0h.
    assert capsys.readouterr().out == (
        "NAMESPACE   CLASS   GPU-HOURS   TOTAL    COUNTED-TO             BUDGET    BUDGET-USED\n"
        "team-a      a100    13.5h       15.5h    2027-01-15T07:59:30Z   20h/1d    3.5h\n"
        "team-a      t4      0.37h       0.37h    2027-01-15T07:59:30Z   -         -\n"
        "team-a      *       13.87h      15.87h   2027-01-15T07:59:30Z   100h/7d   13.87h\n"
        "team-b      h100    2h          2h       2027-01-15T07:58:30Z   -         -\n"
        "team-b      t4      0h          0h       2027-01-15T07:58:30Z   5h/1d     0h\n"
    )


def test_no_headers_prints_the_rows_only(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_usage(apiserver, tmp_path, "--no-headers", "-n", "team-b") == 0
    assert capsys.readouterr().out == (
        "team-b   h100   2h   2h   2027-01-15T07:58:30Z   -       -\n"
        "team-b   t4     0h   0h   2027-01-15T07:58:30Z   5h/1d   0h\n"
    )


def test_json_gives_hours_to_the_hundredth_and_exact_gpu_seconds(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = items(apiserver, tmp_path, capsys)
    assert list(found) == [
        ("team-a", "a100"),
        ("team-a", "t4"),
        ("team-a", "*"),
        ("team-b", "h100"),
        ("team-b", "t4"),
    ]
    assert found["team-a", "a100"] == {
        "namespace": "team-a",
        "class": "a100",
        "period": "30d",
        "since": "2026-12-16T08:00:00Z",
        "gpuHours": 13.5,
        "gpuSeconds": "48600",
        "totalGpuHours": 15.5,
        "totalGpuSeconds": "55800",
        "countedTo": "2027-01-15T07:59:30Z",
        "budget": "20h/1d",
        "budgetUsedGpuHours": 3.5,
        "budgetUsedGpuSeconds": "12600",
    }
    t4 = found["team-a", "t4"]
    assert (t4["gpuHours"], t4["gpuSeconds"], t4["totalGpuSeconds"]) == (0.37, "4000/3", "4000/3")
    assert "budget" not in t4
    assert "budgetUsedGpuHours" not in t4
    every = found["team-a", "*"]
    assert every["gpuSeconds"] == every["budgetUsedGpuSeconds"] == "149800/3"
    assert every["totalGpuSeconds"] == "171400/3"
    assert (every["gpuHours"], every["totalGpuHours"]) == (13.87, 15.87)
    assert every["budget"] == "100h/7d"
    assert found["team-b", "t4"]["budgetUsedGpuSeconds"] == "0"


def test_yaml_is_the_json_document(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_usage(apiserver, tmp_path, "-o", "json") == 0
    as_json = json.loads(capsys.readouterr().out)
    assert run_usage(apiserver, tmp_path, "-o", "yaml") == 0
    assert yaml.safe_load(capsys.readouterr().out) == as_json
    assert len(as_json["items"]) == 5


def test_csv_is_a_header_then_a_row_per_item(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_usage(apiserver, tmp_path, "-o", "csv") == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == (
        "namespace,class,period,since,gpuHours,gpuSeconds,totalGpuHours,totalGpuSeconds,"
        "countedTo,budget,budgetUsedGpuHours,budgetUsedGpuSeconds,error"
    )
    assert lines[1] == (
        "team-a,a100,30d,2026-12-16T08:00:00Z,13.5,48600,15.5,55800,2027-01-15T07:59:30Z,"
        "20h/1d,3.5,12600,"
    )
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["namespace"], r["class"]) for r in rows] == [
        ("team-a", "a100"),
        ("team-a", "t4"),
        ("team-a", "*"),
        ("team-b", "h100"),
        ("team-b", "t4"),
    ]
    assert rows[1]["gpuSeconds"] == "4000/3"
    assert rows[1]["budget"] == rows[1]["budgetUsedGpuHours"] == ""

    assert run_usage(apiserver, tmp_path, "-o", "csv", "--no-headers") == 0
    assert capsys.readouterr().out.splitlines() == lines[1:]


@pytest.mark.parametrize(
    ("since", "gpu_seconds", "start"),
    [
        # Every bucket the record keeps.
        ("30d", "48600", "2026-12-16T08:00:00Z"),
        # The day-wide bucket ended as the period began: not counted.
        ("2d", "12600", "2027-01-13T08:00:00Z"),
        ("48h", "12600", "2027-01-13T08:00:00Z"),
        ("2880m", "12600", "2027-01-13T08:00:00Z"),
        ("172800s", "12600", "2027-01-13T08:00:00Z"),
        # The period begins half way through the bucket of two hours ago: counted whole;
        # the one of three hours ago ended before it: not counted.
        ("90m", "9000", "2027-01-15T06:30:00Z"),
        # Within the last hour's bucket: all of it.
        ("1s", "1800", "2027-01-15T07:59:59Z"),
    ],
)
def test_since_counts_the_buckets_that_reach_into_the_period(
    apiserver: FakeApiserver,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    since: str,
    gpu_seconds: str,
    start: str,
) -> None:
    a100 = items(apiserver, tmp_path, capsys, "--since", since)["team-a", "a100"]
    assert a100["gpuSeconds"] == gpu_seconds
    assert a100["since"] == start
    # The total and the budget's own window do not depend on the period.
    assert a100["totalGpuSeconds"] == "55800"
    assert a100["budgetUsedGpuSeconds"] == "12600"


def test_since_changes_the_table_s_gpu_hours(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_usage(apiserver, tmp_path, "--since", "90m", "-n", "team-a") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:4] == ["team-a", "a100", "2.5h", "15.5h"]


def test_dash_n_shows_that_namespace_only(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    found = items(apiserver, tmp_path, capsys, "-n", "team-b")
    assert list(found) == [("team-b", "h100"), ("team-b", "t4")]
    assert found["team-b", "h100"]["totalGpuSeconds"] == "7200"


def test_dash_n_of_a_namespace_without_a_record_shows_nothing(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_usage(apiserver, tmp_path, "-n", "team-z", "-o", "json") == 0
    assert json.loads(capsys.readouterr().out) == {"items": []}
    assert run_usage(apiserver, tmp_path, "-n", "team-z") == 0
    assert capsys.readouterr().out == (
        "NAMESPACE   CLASS   GPU-HOURS   TOTAL   COUNTED-TO   BUDGET   BUDGET-USED\n"
    )
    assert run_usage(apiserver, tmp_path, "-n", "team-z", "--no-headers") == 0
    assert capsys.readouterr().out == ""
    assert run_usage(apiserver, tmp_path, "-n", "team-z", "-o", "csv") == 0
    assert capsys.readouterr().out.count("\n") == 1


def test_without_budgets_the_budget_columns_are_empty(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.objects[CONFIGMAPS] = config_maps(
        record("team-a", TEAM_A), quotas="namespaces:\n  team-a: {a100: 4}\n"
    )
    found = items(apiserver, tmp_path, capsys)
    assert list(found) == [("team-a", "a100"), ("team-a", "t4")]
    assert all("budget" not in item for item in found.values())


def test_the_default_budget_applies_to_namespaces_without_an_entry(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.objects[CONFIGMAPS] = config_maps(
        record("team-b", TEAM_B), quotas="default:\n  budget: {h100: 1h/90m}\n"
    )
    h100 = items(apiserver, tmp_path, capsys)["team-b", "h100"]
    # The window of 90 minutes reaches into the bucket of two hours ago: counted whole.
    assert (h100["budget"], h100["budgetUsedGpuSeconds"]) == ("1h/90m", "7200")


def test_an_unreadable_record_is_shown_with_its_error_and_exits_1(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.objects[CONFIGMAPS] = config_maps(
        record("team-a", TEAM_A),
        broken_record("team-c", '{"checkpoint": -1, "classes": {}}'),
        broken_record("team-b", "{not json"),
    )
    assert run_usage(apiserver, tmp_path, "--no-headers") == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["team-a", "a100"],
        ["team-a", "t4"],
        ["team-a", "*"],
        ["team-b", "error:"],
        ["team-c", "error:"],
    ]
    assert lines[3].startswith(
        "team-b   error: ConfigMap gpuadm-gpu-hours-team-b cannot be read: hours.json is not JSON: "
    )
    assert lines[4] == (
        "team-c   error: ConfigMap gpuadm-gpu-hours-team-c cannot be read: checkpoint -1 is "
        "not a time in seconds; fix or delete it (deleting it forgets the namespace's counted "
        "hours)"
    )

    assert run_usage(apiserver, tmp_path, "-o", "json", "-n", "team-c") == 1
    assert json.loads(capsys.readouterr().out) == {
        "items": [
            {
                "namespace": "team-c",
                "error": "ConfigMap gpuadm-gpu-hours-team-c cannot be read: checkpoint -1 is "
                "not a time in seconds; fix or delete it (deleting it forgets the namespace's "
                "counted hours)",
            }
        ]
    }
    assert run_usage(apiserver, tmp_path, "-o", "csv", "-n", "team-b") == 1
    (row,) = csv.DictReader(io.StringIO(capsys.readouterr().out))
    assert row["namespace"] == "team-b"
    assert row["class"] == row["gpuSeconds"] == ""
    assert row["error"].startswith("ConfigMap gpuadm-gpu-hours-team-b cannot be read")

    # Another namespace's broken record is not this one's answer.
    assert run_usage(apiserver, tmp_path, "-n", "team-a") == 0
    assert "error" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("since", "reason"),
    [
        (
            "30",
            "--since '30' is not a period: give a whole number of weeks, days, hours, "
            "minutes or seconds, e.g. 2w, 30d, 12h, 90m or 600s",
        ),
        ("1y", "--since '1y' is not a period"),
        ("1.5h", "--since '1.5h' is not a period"),
        ("-1d", "--since '-1d' is not a period"),
        ("30D", "--since '30D' is not a period"),
        ("1 d", "--since '1 d' is not a period"),
        ("", "--since '' is not a period"),
        ("0d", "--since '0d' is an empty period: give at least 1s"),
        ("367d", "--since '367d' is longer than 366d; the records keep 35d of usage"),
        ("9999999999999s", "--since '9999999999999s' is longer than 366d"),
    ],
)
def test_a_bad_since_is_refused_before_the_cluster_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], since: str, reason: str
) -> None:
    # The kubeconfig does not exist: a command that read the cluster would say so instead.
    missing = str(tmp_path / "nowhere")
    assert main(["usage", f"--since={since}", "--kubeconfig", missing]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"gpuadm: {reason}")


def test_no_reachable_cluster_exits_2_without_a_traceback(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    closed = write_kubeconfig(tmp_path / "closed", f"https://127.0.0.1:{port}")
    for kubeconfig, reason in [
        (
            closed,
            f"gpuadm: cannot read the cluster: cannot reach the apiserver at "
            f"https://127.0.0.1:{port}",
        ),
        (tmp_path / "nowhere", "gpuadm: cannot read the cluster: cannot reach a cluster"),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "webhook.cli", "usage", "--kubeconfig", str(kubeconfig)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        assert result.stdout == ""
        (line,) = result.stderr.splitlines()
        assert line.startswith(reason), line


def test_without_gpuadm_s_config_the_command_says_so(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.objects[CONFIGMAPS] = {"kind": "ConfigMapList", "metadata": {}, "items": []}
    kubeconfig = str(apiserver.kubeconfig(tmp_path / "kubeconfig"))
    assert main(["usage", "--kubeconfig", kubeconfig]) == 2
    assert capsys.readouterr().err == (
        "gpuadm: no ConfigMap gpuadm-policy in namespace gpuadm-system: is gpuadm there?\n"
    )


def test_an_admin_s_command_refused_a_config_map_says_it_needs_an_admin(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.forbidden.add(f"{CONFIGMAPS}/gpuadm-quotas")
    kubeconfig = str(apiserver.kubeconfig(tmp_path / "kubeconfig"))
    assert main(["usage", "--kubeconfig", kubeconfig]) == 2
    assert capsys.readouterr().err == (
        "gpuadm: you may not read ConfigMap gpuadm-system/gpuadm-quotas (403: configmaps "
        '"gpuadm-quotas" is forbidden): this command reads gpuadm\'s namespace as an admin '
        "does: run it with an admin's kubeconfig (docs/operations.md)\n"
    )


def test_without_gpuadm_s_quotas_the_command_says_so(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = apiserver.objects[CONFIGMAPS]
    listed["items"] = [i for i in listed["items"] if i["metadata"]["name"] != "gpuadm-quotas"]
    kubeconfig = str(apiserver.kubeconfig(tmp_path / "kubeconfig"))
    assert main(["usage", "--kubeconfig", kubeconfig]) == 2
    assert capsys.readouterr().err == (
        "gpuadm: no ConfigMap gpuadm-quotas in namespace gpuadm-system: gpuadm refuses GPU pods "
        "in governed namespaces until it has one\n"
    )


def test_the_records_are_read_in_gpuadm_s_namespace(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moved = apiserver.objects.pop(CONFIGMAPS)
    apiserver.objects["/api/v1/namespaces/gpu-adm/configmaps"] = moved
    found = items(apiserver, tmp_path, capsys, "--gpuadm-namespace", "gpu-adm")
    assert len(found) == 5


def test_as_an_admin_runs_it_with_the_real_clock(
    apiserver: FakeApiserver, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through `main`, as `gpuadm usage -n NS -o json`: the totals do not depend on the clock."""
    kubeconfig = str(apiserver.kubeconfig(tmp_path / "kubeconfig"))
    assert main(["usage", "-n", "team-b", "-o", "json", "--kubeconfig", kubeconfig]) == 0
    (h100, t4) = json.loads(capsys.readouterr().out)["items"]
    assert (h100["class"], h100["totalGpuSeconds"], h100["totalGpuHours"]) == ("h100", "7200", 2.0)
    assert (t4["class"], t4["totalGpuSeconds"]) == ("t4", "0")
