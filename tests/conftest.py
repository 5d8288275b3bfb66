"""Fixtures shared by every suite: the test policy and quota config, loaded once."""

from __future__ import annotations

import pytest
from hypothesis import settings

from policies import Policy, QuotaConfig, load_policy, load_quotas
from tests.builders import POLICY_YAML, QUOTAS_YAML

# Property tests assert what is computed, never how fast: Hypothesis' per-example deadline
# (200 ms) failed a plan-memo property on a loaded CI machine where one example took 288 ms
# and its rerun 0.3 ms. Speed is measured by `make bench`.
settings.register_profile("gpuadm", deadline=None)
settings.load_profile("gpuadm")


@pytest.fixture(scope="session")
def policy() -> Policy:
    """Return the test policy."""
    return load_policy(POLICY_YAML)


@pytest.fixture(scope="session")
def quotas() -> QuotaConfig:
    """Return the test quota config."""
    return load_quotas(QUOTAS_YAML)
