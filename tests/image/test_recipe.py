"""The image's recipe read as text: the Dockerfile, .dockerignore, image/build.sh, packaging.

Cheap checks that need no builder, run by `make test-fast` too. The image itself is built and
run in `test_image.py`.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from tests.image.container import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BUILD_SCRIPT = (ROOT / "image" / "build.sh").read_text()
DIGEST_PINNED = re.compile(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}")


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (keyword, arguments), continuation lines joined."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")),
    )
    found = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


STEPS = instructions(DOCKERFILE)
FROM_AT = next(i for i, (keyword, _) in enumerate(STEPS) if keyword == "FROM")


def args_declared(steps: list[tuple[str, str]]) -> dict[str, str | None]:
    """ARG names and their defaults (None when it has none)."""
    declared: dict[str, str | None] = {}
    for keyword, rest in steps:
        if keyword == "ARG":
            name, equals, default = rest.partition("=")
            declared[name] = default if equals else None
    return declared


def labels() -> dict[str, str]:
    """Every LABEL key and its value as written."""
    found: dict[str, str] = {}
    for keyword, rest in STEPS:
        if keyword == "LABEL":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                found[key] = value
    return found


def test_the_base_is_an_argument_pinned_by_tag_and_digest() -> None:
    before = args_declared(STEPS[:FROM_AT])
    default = before["BASE"]
    assert default is not None
    assert DIGEST_PINNED.fullmatch(default), default
    assert STEPS[FROM_AT] == ("FROM", "${BASE}")
    assert sum(keyword == "FROM" for keyword, _ in STEPS) == 1


def test_every_argument_a_step_uses_is_declared_in_the_stage() -> None:
    # An ARG from before FROM is empty inside the stage unless declared there again.
    stage = STEPS[FROM_AT + 1 :]
    in_stage = set(args_declared(stage))
    env = {
        name for keyword, rest in stage if keyword == "ENV" for name in re.findall(r"(\w+)=", rest)
    }
    for keyword, rest in stage:
        if keyword in ("LABEL", "ENV", "RUN", "COPY", "USER", "WORKDIR"):
            for name in re.findall(r"\$\{(\w+)\}", rest):
                assert name in in_stage | env | {"PATH"}, f"{keyword} uses ${{{name}}}"


def test_the_version_argument_defaults_to_the_project_version() -> None:
    assert args_declared(STEPS)["VERSION"] == PYPROJECT["project"]["version"]


def test_labels_are_the_oci_annotations() -> None:
    found = labels()
    assert found["org.opencontainers.image.title"] == "gpuadm"
    assert found["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]
    assert found["org.opencontainers.image.version"] == "${VERSION}"
    assert found["org.opencontainers.image.revision"] == "${REVISION}"
    assert found["org.opencontainers.image.base.name"] == "${BASE}"
    assert found["org.opencontainers.image.source"].startswith("https://")
    assert found["org.opencontainers.image.description"]


def test_gpuadm_runs_from_its_venv_as_65532() -> None:
    (user,) = (rest for keyword, rest in STEPS if keyword == "USER")
    assert user == "65532:65532"
    (path,) = re.findall(r"PATH=(\S+)", " ".join(r for k, r in STEPS if k == "ENV"))
    assert path.split(":")[0] == "/opt/gpuadm/bin"
    (run,) = (rest for keyword, rest in STEPS if keyword == "RUN" and "pip install" in rest)
    assert "python3 -m venv /opt/gpuadm" in run
    assert "/opt/gpuadm/bin/pip install" in run
    assert ("ENTRYPOINT", '["gpuadm"]') in STEPS


def copied_sources() -> list[str]:
    """What the Dockerfile's COPY steps take from the build context."""
    sources = []
    for keyword, rest in STEPS:
        if keyword == "COPY":
            *from_context, _destination = rest.split()
            sources += [s.rstrip("/") for s in from_context if not s.startswith("--")]
    return sources


def dockerignore_admits(path: str) -> bool:
    """Whether .dockerignore lets `path` into the build context (last matching rule wins)."""
    admitted = True
    for rule in (ROOT / ".dockerignore").read_text().splitlines():
        rule = rule.strip()
        if not rule or rule.startswith("#"):
            continue
        negated = rule.startswith("!")
        pattern = rule.removeprefix("!").rstrip("/")
        if fnmatch.fnmatchcase(path, pattern) or path.startswith(pattern + "/"):
            admitted = negated
    return admitted


@pytest.mark.parametrize("source", copied_sources())
def test_what_the_dockerfile_copies_is_in_the_build_context(source: str) -> None:
    assert (ROOT / source).exists()
    assert dockerignore_admits(source)


def build_script_array(name: str) -> list[str]:
    """The words of a bash array that image/build.sh assigns at the start of a line."""
    match = re.search(rf"^{name}=\(([^)]*)\)", BUILD_SCRIPT, flags=re.MULTILINE)
    assert match, f"image/build.sh assigns no {name}"
    return match[1].split()


def test_the_cache_key_covers_everything_the_dockerfile_copies() -> None:
    # A source the key missed would leave a stale image in the cache after it changed.
    keyed = set(build_script_array("SOURCE_FILES")) | set(build_script_array("SOURCE_TREES"))
    assert set(copied_sources()) <= keyed
    assert {"Dockerfile", ".dockerignore", "image/build.sh"} <= keyed


def test_the_wheel_holds_every_package() -> None:
    # The image installs gpuadm from a wheel, which holds only the packages that pyproject's
    # patterns match (as setuptools matches them: the dotted name against each pattern); the
    # editable install of development would hide a missing one.
    include = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    directories = {
        py.parent.relative_to(ROOT)
        for tree in ("webhook", "policies", "certs")
        for py in Path(ROOT, tree).rglob("*.py")
    }
    for directory in sorted(directories):
        assert (ROOT / directory / "__init__.py").exists(), f"{directory} is no package"
        dotted = ".".join(directory.parts)
        assert any(fnmatch.fnmatchcase(dotted, p) for p in include), f"{dotted} is left out"
