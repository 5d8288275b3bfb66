"""The source's shape keeps the limits it was given: `policies/` shows its architecture in
folders, each saying in one line what it holds, with at most 12 modules beside them; no
module of the quota's room in the server (`webhook/quota/`) passes 350 lines, so that none
grows two ideas."""

from __future__ import annotations

import ast

import pytest

from tests.support import ROOT

TOP_MODULES = 12
QUOTA_LINES = 350


def test_policies_has_at_most_twelve_modules_beside_its_folders() -> None:
    modules = [p.name for p in (ROOT / "policies").glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= TOP_MODULES, sorted(modules)


@pytest.mark.parametrize(
    "folder",
    sorted(
        p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "policies").glob("*/__init__.py")
    ),
)
def test_each_folder_of_policies_says_what_it_holds(folder: str) -> None:
    docstring = ast.get_docstring(ast.parse((ROOT / folder / "__init__.py").read_text()))
    assert docstring, f"{folder}/__init__.py has no docstring"
    assert "\n" not in docstring.strip(), f"{folder}: say it in one line"


@pytest.mark.parametrize(
    "module", sorted(p.name for p in (ROOT / "webhook" / "quota").glob("*.py"))
)
def test_no_module_of_the_quota_room_passes_350_lines(module: str) -> None:
    lines = (ROOT / "webhook" / "quota" / module).read_text().count("\n")
    assert lines <= QUOTA_LINES, f"webhook/quota/{module} has {lines} lines: split it"
