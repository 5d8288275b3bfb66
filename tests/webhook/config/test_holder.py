"""The config holder: what a new snapshot in force is told about, and what a bad one leaves."""

from __future__ import annotations

import pytest

from webhook.config.snapshot import ConfigHolder, snapshot_from_text


def test_a_new_policy_in_force_logs_its_warnings(caplog: pytest.LogCaptureFixture) -> None:
    holder = ConfigHolder()
    text = "classes:\n  any:\n    backend: volcano\n    memory: 24Gi\n"
    holder.offer(snapshot_from_text(text, "", policy_source="p", quotas_source="q"))
    assert "class any (volcano) lists neither `models` nor `gpuTypes`" in caplog.text
