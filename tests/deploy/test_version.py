"""One version everywhere it is written: a chart whose appVersion names the image tag of an
older build would have nodes keep running that build after an upgrade (`IfNotPresent`)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
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
    if not _prerelease(_package()):  # a pre-release is newer than every section (below)
        assert released[0] == _package(), f"the newest section of CHANGELOG.md is {released[0]}"


def _prerelease(version: str) -> bool:
    return re.fullmatch(r"\d+\.\d+\.\d+-[0-9A-Za-z.]+", version) is not None


def _unreleased(changelog: str) -> str:
    """Return what CHANGELOG.md records under [Unreleased]."""
    found = re.search(r"^## \[Unreleased\]\n(.*?)^## \[", changelog, re.MULTILINE | re.DOTALL)
    assert found is not None, "CHANGELOG.md has no [Unreleased] section before the releases"
    return found.group(1).strip()


def test_a_change_after_a_release_never_takes_its_version() -> None:
    """The image's tag is the version: a change built under a release's version would share
    its tag, and a node holding the release's image (`IfNotPresent`) would keep running it.
    So once CHANGELOG.md records a change under [Unreleased], the version is a pre-release of
    the next one, newer than every release the changelog names."""
    changelog = (REPO / "CHANGELOG.md").read_text()
    version = _package()
    if _unreleased(changelog):
        assert _prerelease(version), (
            f"CHANGELOG.md records unreleased changes, but the version is {version}: "
            "give it a pre-release suffix, such as 0.3.0-rc.1"
        )
        released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.MULTILINE)
        newest = tuple(int(n) for n in released[0].split("."))
        assert tuple(int(n) for n in version.split("-")[0].split(".")) > newest


@pytest.mark.parametrize(
    ("version", "prerelease"),
    [
        ("0.3.0-rc.1", True),
        ("0.3.0-dev", True),
        ("0.2.0", False),
        ("0.3.0-", False),
        ("0.3-rc.1", False),
    ],
)
def test_a_pre_release_is_a_release_s_version_with_a_suffix(version: str, prerelease: bool) -> None:
    assert _prerelease(version) is prerelease


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("## [Unreleased]\n\n## [0.2.0] - 2026-11-28\n", ""),
        ("## [Unreleased]\n\n### Added\n\n- a thing\n\n## [0.2.0]\n", "### Added\n\n- a thing"),
    ],
)
def test_the_unreleased_section_is_read_up_to_the_first_release(text: str, found: str) -> None:
    assert _unreleased(text) == found
