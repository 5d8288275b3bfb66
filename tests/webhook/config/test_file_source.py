"""Standalone config files: a file caught mid-write, emptied, deleted or garbled never applies."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import POLICY_YAML, QUOTAS_YAML
from webhook.config.file_source import FileSource, read_snapshot
from webhook.config.snapshot import QUOTAS_PART, ConfigHolder

LIMITS_OF_TEAM_A = {"a100": 4, "*": 5}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    policy, quotas = tmp_path / "policy.yaml", tmp_path / "quotas.yaml"
    policy.write_text(POLICY_YAML)
    quotas.write_text(QUOTAS_YAML)
    return policy, quotas


def source_on(files: tuple[Path, Path]) -> tuple[ConfigHolder, FileSource]:
    holder = ConfigHolder(read_snapshot(*files))
    return holder, FileSource(holder, *files, every_seconds=1.0)


async def test_an_edit_applies_once_two_reads_agree(files: tuple[Path, Path]) -> None:
    holder, source = source_on(files)
    files[1].write_text("namespaces:\n  team-a: {a100: 1}\n")
    assert not await source.reload_once()  # first sight: it may still be being written
    assert holder.current.quotas.limits_for("team-a") == LIMITS_OF_TEAM_A
    assert await source.reload_once()
    assert holder.current.quotas.limits_for("team-a") == {"a100": 1}


async def test_a_file_caught_mid_write_never_applies(files: tuple[Path, Path]) -> None:
    holder, source = source_on(files)
    whole = "namespaces:\n  team-a: {a100: 4}\n  team-b: {a100: 0}\n"
    # A writer rewriting in place: the first poll sees the file cut short where it still
    # parses (team-b's "none at all" missing), the next one sees it whole.
    files[1].write_text(whole[: whole.index("  team-b")])
    await source.reload_once()
    files[1].write_text(whole)
    await source.reload_once()
    assert holder.current.quotas.limits_for("team-b") == {"t4": 1}  # still the old default
    await source.reload_once()
    assert holder.current.quotas.limits_for("team-b") == {"a100": 0}


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        pytest.param(lambda p: p.write_text(""), "the document is empty", id="emptied"),
        pytest.param(lambda p: p.unlink(), "cannot read", id="deleted"),
        pytest.param(lambda p: p.write_bytes(b"namespaces: {\xff}\n"), "not UTF-8", id="not-utf8"),
        pytest.param(lambda p: p.write_text("default:\n  1: 1\n"), "not text", id="key-1"),
        pytest.param(lambda p: p.write_text("a: " + "[" * 900), "nested", id="nested-900"),
    ],
)
async def test_a_damaged_quotas_file_keeps_the_last_good_limits(
    files: tuple[Path, Path], damage: object, reason: str
) -> None:
    holder, source = source_on(files)
    damage(files[1])  # type: ignore[operator]
    for _ in range(3):
        assert not await source.reload_once()
    assert holder.current.quotas.limits_for("team-a") == LIMITS_OF_TEAM_A
    assert reason in holder.problems()[QUOTAS_PART]


async def test_without_a_quotas_file_there_are_no_quotas(files: tuple[Path, Path]) -> None:
    holder = ConfigHolder(read_snapshot(files[0], None))
    source = FileSource(holder, files[0], None, every_seconds=1.0)
    for _ in range(2):
        assert not await source.reload_once()
    assert holder.current.quotas_missing is None
    assert holder.current.quotas.limits_for("team-a") == {}
