"""Fixtures shared by every suite: the test policy and quota config, loaded once."""

from __future__ import annotations

import pytest

from policies import Policy, QuotaConfig, load_policy, load_quotas
from tests.builders import POLICY_YAML, QUOTAS_YAML


@pytest.fixture(scope="session")
def policy() -> Policy:
    """Return the test policy."""
    return load_policy(POLICY_YAML)


@pytest.fixture(scope="session")
def quotas() -> QuotaConfig:
    """Return the test quota config."""
    return load_quotas(QUOTAS_YAML)
