"""The pure core of gpuadm: the policy and quota models, and every admission decision.

Nothing here does I/O, reads a clock or a global, or knows of HTTP or Kubernetes clients.
"""

from policies.access.guard import check_added_containers, check_guard
from policies.access.rewrite import Plan, plan, pod_charge
from policies.errors import Denial
from policies.loading import ConfigError, load_policy, load_quotas
from policies.policy import Policy, policy_warnings
from policies.quota.quotas import QuotaConfig
from policies.stored_pod import check_update, require_fixed_point

__all__ = [
    "ConfigError",
    "Denial",
    "Plan",
    "Policy",
    "QuotaConfig",
    "check_added_containers",
    "check_guard",
    "check_update",
    "load_policy",
    "load_quotas",
    "plan",
    "pod_charge",
    "policy_warnings",
    "require_fixed_point",
]
