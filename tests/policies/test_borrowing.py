"""What a cohort member's pod is told: that it borrows, or what of its cohort it did not fit."""

from __future__ import annotations

from fractions import Fraction as F

import pytest

from policies.loading import load_quotas
from policies.quota.borrowing import told
from policies.quota.cohorts import Cohort
from policies.quota.judge import QuotaVerdict, judge
from tests.policies.test_cohorts import QUOTAS as COHORT_QUOTAS
from tests.policies.test_cohorts import cohort as cohort_of

# The cohort of tests/policies/test_cohorts.py, team-a with a T4 limit and a cap over all.
QUOTAS = COHORT_QUOTAS.replace(
    "    a100: 4\n    borrow", '    a100: 4\n    t4: 2\n    "*": 6\n    borrow', 1
)
EVICTED = "it may be evicted when a lender needs its quota back"


def cohort(quotas: str = QUOTAS) -> Cohort:
    return cohort_of(quotas)


def judged(
    research: Cohort, namespace: str, asks: int, held: dict[str, dict[str, int]]
) -> tuple[QuotaVerdict, QuotaVerdict]:
    """Judge a pod of `asks` A100s as the ledger does (against the limits of the moment);
    return the verdict before and after `told`."""
    usage = {ns: {c: F(v) for c, v in classes.items()} for ns, classes in held.items()}
    own = load_quotas(QUOTAS).limits_for(namespace)
    verdict = judge(
        namespace=namespace,
        class_name="a100",
        requested=F(asks),
        in_use=usage.get(namespace, {}),
        limits=research.limits_now(namespace, own, usage),
    )
    return verdict, told(verdict, research, namespace, "a100", F(asks), usage)


@pytest.mark.parametrize(
    ("namespace", "held"),
    [
        ("team-a", {"team-a": {"a100": 3}}),
        ("team-b", {}),  # a member the record shows nothing of
    ],
)
def test_a_pod_within_its_nominal_quota_is_told_nothing(
    namespace: str, held: dict[str, dict[str, int]]
) -> None:
    before, after = judged(cohort(), namespace, 1, held)
    assert after.allowed
    assert after == before


@pytest.mark.parametrize(
    ("held", "asks", "borrows", "in_use"),
    [
        (3, 2, 1, 5),  # partly within its nominal quota: only the part beyond borrows
        (4, 2, 2, 6),
    ],
)
def test_a_pod_that_borrows_is_warned_with_what_it_borrows(
    held: int, asks: int, borrows: int, in_use: int
) -> None:
    before, verdict = judged(cohort(), "team-a", asks, {"team-a": {"a100": held}})
    assert verdict.allowed
    assert verdict.warnings == (
        *before.warnings,
        f'namespace "team-a": this pod borrows {borrows} a100 from cohort research '
        f"({in_use} in use, nominal quota 4): {EVICTED}",
    )


@pytest.mark.parametrize(
    ("held", "asks", "idle"),
    [
        (6, 1, 0),  # at nominal + borrow
        (4, 3, 2),  # 2 of team-b's lent room idle, and the pod asks 3
    ],
)
def test_a_pod_past_its_nominal_quota_is_told_its_bound_and_what_is_idle(
    held: int, asks: int, idle: int
) -> None:
    before, after = judged(cohort(), "team-a", asks, {"team-a": {"a100": held}})
    assert not after.allowed
    assert after.message == (
        f"{before.message} (nominal quota 4, borrowing up to 6; cohort research has {idle} "
        "idle for it)"
    )


def test_a_pod_without_a_bound_on_borrowing_is_told_so() -> None:
    research = cohort(QUOTAS.replace("    borrow: {a100: 2}\n", ""))
    # team-b holds its guaranteed 1 and 2 of the pool; team-a holds 4 + the other 5.
    before, after = judged(research, "team-a", 1, {"team-a": {"a100": 9}, "team-b": {"a100": 3}})
    assert after.message == (
        f"{before.message} (nominal quota 4, borrowing no bound of its own; cohort research "
        "has 0 idle for it)"
    )


@pytest.mark.parametrize(
    ("reclaim", "how"),
    [
        ("never", "reclaim: never: it comes back as their pods end"),
        (
            "lowerPriority",
            "reclaim: lowerPriority: gpuadm evicts borrowed pods of lower priority to return "
            "it; retry",
        ),
        ("any", "reclaim: any: gpuadm evicts borrowed pods to return it; retry"),
    ],
)
def test_a_lender_refused_within_its_nominal_quota_is_told_who_holds_it(
    reclaim: str, how: str
) -> None:
    research = cohort(QUOTAS.replace("reclaim: lowerPriority", f"reclaim: {reclaim}"))
    # team-a borrows 2; team-b, holding 2, may reach 2: its 1 guaranteed and 1 of the pool.
    before, after = judged(research, "team-b", 2, {"team-a": {"a100": 6}, "team-b": {"a100": 2}})
    assert not after.allowed
    assert after.message == (
        f"{before.message} (within its nominal quota of 4, but borrowers in cohort research "
        f"hold 2 of the room it lends ({how}))"
    )


def test_a_refusal_by_another_limit_is_left_as_it_is() -> None:
    # The A100s fit the cohort (5 of 6); the cap over all classes ("*": 6) does not.
    before, after = judged(cohort(), "team-a", 2, {"team-a": {"a100": 3, "t4": 2}})
    assert not after.allowed
    assert after.exceeded == ("*",)
    assert after == before
