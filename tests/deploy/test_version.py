"""One version everywhere it is written: a chart whose appVersion names the image tag of an
older build would have nodes keep running that build after an upgrade (`IfNotPresent`)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _package() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


def test_the_chart_the_image_and_the_manifests_carry_the_package_version() -> None:
    version = _package()
    chart = yaml.safe_load((REPO / "deploy/helm/gpuadm/Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (version, version)
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.findall(r"^ARG VERSION=(\S+)$", dockerfile, re.MULTILINE) == [version]
    deployment = yaml.safe_load((REPO / "deploy/base/deployment.yaml").read_text())
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/gpuadm/gpuadm:{version}"


def test_the_changelog_has_a_section_for_the_version() -> None:
    changelog = (REPO / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.MULTILINE)
    assert released[0] == _package(), f"the newest section of CHANGELOG.md is {released[0]}"
