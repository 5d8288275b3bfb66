"""What each command imports: the Kubernetes client, aiohttp, cryptography and the metrics
exporter only where they are used.

Start-up time itself is measured by `make bench` (bench/startup.py), never asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import ROOT

EXAMPLES = ROOT / "examples"
PROBE = """
import json, sys
from webhook.cli import main
code = main(sys.argv[1:])
heavy = ["kubernetes", "aiohttp", "cryptography", "prometheus_client"]
print(json.dumps({"code": code, "loaded": [m for m in heavy if m in sys.modules]}))
"""


def _loaded(*argv: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["code"] == 0, result.stdout
    loaded: list[str] = found["loaded"]
    return loaded


def test_check_config_loads_no_client_library() -> None:
    loaded = _loaded("check-config", str(EXAMPLES / "policy.yaml"), str(EXAMPLES / "quotas.yaml"))
    assert loaded == []


def test_review_runs_admission_and_quota_without_any_client_or_exporter_library() -> None:
    # The quota ledger and the admission path are plain Python: the apiserver transport
    # (aiohttp) and the metrics exporter load only in a replica that uses them.
    pod = str(EXAMPLES / "pods" / "a100-half.yaml")
    loaded = _loaded(
        "review",
        pod,
        "--policy",
        str(EXAMPLES / "policy.yaml"),
        "--quotas",
        str(EXAMPLES / "quotas.yaml"),
        "--in-use",
        "a100=1",
    )
    assert loaded == []


def test_building_the_command_line_loads_nothing_heavy() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import sys, webhook.cli; print(sorted(sys.modules))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for heavy in ("kubernetes", "aiohttp", "cryptography", "pydantic", "policies", "asyncio"):
        assert f"'{heavy}'" not in result.stdout, heavy
