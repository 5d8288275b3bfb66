"""`gpuadm models`: the catalogue as an admin copies from it."""

from __future__ import annotations

import json

import pytest

from webhook.cli import main


def test_the_table_shows_memory_profiles_and_the_node_label(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["models", "h200"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["NAME", "MEMORY", "MIG", "PROFILES"]
    (h200,) = [line for line in lines if line.split()[:3] == ["NVIDIA", "H200", "143771Mi"]]
    assert h200.split() == [
        "NVIDIA",
        "H200",
        "143771Mi",
        "1g.18gb,1g.18gb+me,1g.35gb,2g.35gb,3g.71gb,4g.71gb,7g.141gb",
        "NVIDIA-H200",
    ]
    # A model the catalogue names without figures is listed, with none.
    assert any(line.startswith("NVIDIA GH200 120GB") and " - " in line for line in lines)


def test_json_carries_each_stacks_spelling(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "T4", "-o", "json"]) == 0
    models = {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    t4 = models["Tesla T4"]
    assert t4["memoryMiB"] == 15360
    assert t4["migProfiles"] == []
    assert t4["spellings"] == {
        "nodeLabel": "Tesla-T4",
        "hami": "NVIDIA-Tesla T4",
        "volcano": "NVIDIA-Tesla T4",
        "dra": "Tesla T4",
    }


def test_a_filter_that_matches_nothing_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "Z9000"]) == 1
    assert capsys.readouterr().out == "no GPU model gpuadm knows has 'Z9000' in its name\n"
