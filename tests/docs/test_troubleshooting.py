"""docs/troubleshooting.md names every refusal gpuadm has.

Each `Denial` raised in the code is found by reading the source, and the longest literal
part of its message must appear on the page; the quota and transport refusals, which are
not Denials, are listed here and must appear in the code and on the page. A new refusal
fails this test until the page says what causes it and how to fix it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support import ROOT

PAGE = ROOT / "docs" / "troubleshooting.md"
SOURCES = [*(ROOT / "policies").rglob("*.py"), *(ROOT / "webhook").rglob("*.py")]
# Literal parts shorter than this say too little to find a message by ("is not a ").
SHORTEST = 15
# Refusals that are not Denials: quota verdicts, the HTTP edge, the DRA keeper.
OTHER_REFUSALS = [
    "quota exceeded: requested",
    "quota mode is warn: admitted, but enforce would deny",
    "gpuadm's view of GPU usage is not in sync with the cluster yet; retry",
    "gpuadm cannot reach the apiserver (",
    "does not exist",
    "is busy",
    "retry in a minute, when the oldest",
    "(a slow sender, or a replica at its",
    "gpuadm failed to judge this request (incident",
    "may give it GPUs that its resources do not hold; set it to void or",
    "in a GPU pod sees every GPU of the node, not only the pod's; drop privileged",
    "exposes the node's GPU devices outside the pod's resources; ask for GPUs in",
    "names GPUs to the NVIDIA Container Toolkit's volume-mounts device list",
    "is written by the GPU stack's scheduler to tell its device plugin which GPUs to",
    "is written by KAI's binder when it binds a GPU share, to record which GPU the share is",
    "overrides a limit that",
    "as it was made; retry",
    "cannot vouch for what the namespace used",
    # The end of every guard denial: how an admin lets a GPU stack's own pod through.
    "must be exempt: an admin adds it to the policy's exemptNamespaces "
    "(the Helm value policy.exemptNamespaces)",
    "is the GPU stack's own, an admin adds it to the policy's gpuStackUsers",
]


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _literal_parts(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        joined = "".join(str(v.value) if isinstance(v, ast.Constant) else "\0" for v in node.values)
        return joined.split("\0")
    if isinstance(node, ast.BinOp):
        return _literal_parts(node.left) + _literal_parts(node.right)
    return []


def denials() -> list[tuple[str, str]]:
    """(where, the longest literal part) of every `Denial(...)` in the code."""
    found = []
    for path in sorted(SOURCES):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "Denial"
                and node.args
            ):
                continue
            parts = [_normal(p).strip(" :;,(") for p in _literal_parts(node.args[0])]
            parts = [p for p in parts if len(p) >= SHORTEST]
            if parts:
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.append((where, max(parts, key=len)))
    return found


def test_the_source_is_read() -> None:
    assert len(denials()) >= 40


@pytest.mark.parametrize(("where", "words"), denials())
def test_every_denial_is_on_the_page(where: str, words: str) -> None:
    page = _normal(PAGE.read_text())
    assert words in page, (
        f"{where}: a refusal docs/troubleshooting.md does not explain; add its message, "
        f"cause and fix there: {words!r}"
    )


@pytest.mark.parametrize("words", OTHER_REFUSALS)
def test_every_other_refusal_is_in_the_code_and_on_the_page(words: str) -> None:
    code = "".join(_normal(p.read_text()) for p in SOURCES)
    assert words in code or all(w in code for w in words.split(" (")), words
    assert words in _normal(PAGE.read_text()), words


def test_the_page_is_linked_from_the_readme_and_the_tenants_guide() -> None:
    for source in ("README.md", "docs/tenants.md"):
        assert "troubleshooting.md" in (ROOT / source).read_text(), source
    assert Path(ROOT / "docs" / "tenants.md").exists()
