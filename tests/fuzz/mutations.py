"""Realistic reviews, and strategies that change them at any JSON path into any JSON value.

Each case starts from a review the apiserver would send (built with `tests.builders`), picks
one to three paths in it (the root, any member of an object, any item of a list) and puts
there a value of another JSON type, a large or deep one, a number past every limit, or
nothing at all (the member or item is removed). Values that Python cannot hold or write as
JSON (integers of thousands of digits, nesting deeper than the encoder goes) are written as
raw JSON text, so the webhook reads exactly what an attacker would send.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import jsonpatch
import orjson
from hypothesis import strategies as st

from policies import load_policy, plan
from tests.builders import POLICY_YAML, container, pod, review

Path = tuple[str | int, ...]
ZONE = {"key": "zone", "operator": "In", "values": ["a", "b"]}
TOLERATION = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Removed:
    """Put at a path: the member or item there is taken out."""


REMOVED = Removed()


def _pods() -> list[tuple[dict[str, Any], str]]:
    """Return pods in every request form, each with the namespace it is created in."""
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [ZONE]}, {"matchFields": [ZONE]}]
            }
        }
    }
    sidecar = container("proxy", {"gpuadm.io/a100": "250m"}, restartPolicy="Always")
    # What the guard reads: env, security contexts, volumes.
    guarded = container(
        "tools",
        {"cpu": "1"},
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, {"name": "A", "value": "b"}],
        securityContext={"privileged": False},
    )
    return [
        (pod({"gpuadm.io/a100": "0.5"}), "team-x"),
        (
            pod(
                {"nvidia.com/gpu": "2", "cpu": "1"},
                init=[container("warm", {"gpuadm.io/a100-memory": "10Gi"}), sidecar],
                affinity=affinity,
                tolerations=[TOLERATION],
            ),
            "team-a",
        ),
        (
            pod(
                {"gpuadm.io/t4": "1"},
                annotations={"gpuadm.io/class": "t4", "team": "vision"},
                schedulerName="default-scheduler",
                affinity=affinity,
            ),
            "team-x",
        ),
        (
            pod(
                {"gpuadm.io/a100-mig-memory": "10Gi"},
                extra=[guarded],
                nodeName="",
                volumes=[{"name": "data", "hostPath": {"path": "/data"}}],
            ),
            "team-a",
        ),
        (pod({"cpu": "1", "memory": "1Gi"}), "team-x"),
    ]


def _stored(body: dict[str, Any]) -> dict[str, Any]:
    """Return a pod as the apiserver stores it after gpuadm's rewrite."""
    patch = plan(body, load_policy(POLICY_YAML)).patch
    stored: dict[str, Any] = jsonpatch.apply_patch(body, patch) if patch else copy.deepcopy(body)
    stored["metadata"]["uid"] = "5d4c3b2a"
    return stored


def seed_reviews() -> list[dict[str, Any]]:
    """Return reviews as the apiserver sends them: creates, stored pods, updates, deletes."""
    reviews = []
    for number, (body, namespace) in enumerate(_pods()):
        stored = _stored(body)
        changed = copy.deepcopy(stored)
        changed["metadata"].setdefault("labels", {})["gpuadm.io/class"] = "h100"
        debug = {"name": "debug", "image": "busybox", "env": [{"name": "X", "value": "1"}]}
        changed["spec"]["ephemeralContainers"] = [debug]
        uid = f"fuzz-{number}"
        reviews += [
            review(body, namespace=namespace, uid=uid),
            review(stored, namespace=namespace, uid=uid),
            review(changed, operation="UPDATE", old=stored, namespace=namespace, uid=uid),
            review(None, operation="DELETE", old=stored, namespace=namespace, uid=uid),
        ]
    for item in reviews:
        item["request"]["dryRun"] = item["request"]["uid"].endswith("1")
    return reviews


# Kept encoded: decoding one is the cheapest way to a fresh copy for each case.
SEEDS = [orjson.dumps(seed) for seed in seed_reviews()]


def paths(document: object) -> list[Path]:
    """Return the path of `document` and of everything inside it."""
    found: list[Path] = []
    pending: list[tuple[Path, object]] = [((), document)]
    while pending:
        path, value = pending.pop()
        found.append(path)
        if isinstance(value, dict):
            pending += [((*path, key), item) for key, item in value.items()]
        elif isinstance(value, list):
            pending += [((*path, index), item) for index, item in enumerate(value)]
    return found


def _at(document: Any, path: Path) -> Any:
    for step in path:
        document = document[step]
    return document


def put(document: Any, path: Path, value: object) -> Any:
    """Return `document` with `value` at `path` (the path's member removed for REMOVED)."""
    if not path:
        return {} if value is REMOVED else value
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if value is REMOVED:
        if last in parent or isinstance(last, int):
            del parent[last]
    else:
        parent[last] = value
    return document


def _deep(depth: int, brackets: tuple[str, str]) -> orjson.Fragment:
    opening, closing = brackets
    return orjson.Fragment(opening * depth + "1" + closing * depth)


# The members gpuadm reads, in the review and in the pod, to add where a seed has none.
MEMBER_NAMES = [
    "uid",
    "kind",
    "operation",
    "namespace",
    "userInfo",
    "groups",
    "extra",
    "dryRun",
    "object",
    "oldObject",
    "metadata",
    "annotations",
    "labels",
    "generateName",
    "spec",
    "containers",
    "initContainers",
    "restartPolicy",
    "resources",
    "limits",
    "requests",
    "claims",
    "gpuadm.io/a100",
    "gpuadm.io/class",
    "nvidia.com/gpu",
    "nvidia.com/use-gputype",
    "schedulerName",
    "nodeName",
    "affinity",
    "nodeAffinity",
    "requiredDuringSchedulingIgnoredDuringExecution",
    "nodeSelectorTerms",
    "matchExpressions",
    "matchFields",
    "tolerations",
    "env",
    "value",
    "volumes",
    "hostPath",
    "path",
    "securityContext",
    "privileged",
    "ephemeralContainers",
]

# Quantities as they are written, and as they are not.
QUANTITY_TEXTS = [
    "1",
    "0.5",
    "250m",
    "10Gi",
    "1e3",
    "1.5",
    "0",
    "-1",
    "",
    " 1 ",
    "0x10",
    "1e999999999",
    "1e-999999999",
    "9" * 4301,
    "0." + "0" * 5000 + "1",
    "8Ei",
    "NaN",
    "Infinity",
    "1Ki1",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(QUANTITY_TEXTS),
)

huge_numbers = st.sampled_from(
    [
        orjson.Fragment(b"9" * 4400),
        orjson.Fragment(b"-" + b"1" * 5000),
        orjson.Fragment(b"1e999999999"),
        orjson.Fragment(b"1" * 30 + b".5e-400"),
        orjson.Fragment(b"18446744073709551616"),
    ]
)

long_strings = st.integers(min_value=100, max_value=200_000).map(lambda n: "é" * n)

# Depths up to and past the 1024 levels the JSON decoder reads.
deep_values = st.builds(
    _deep, st.integers(min_value=15, max_value=1100), st.sampled_from([("[", "]"), ('{"a":', "}")])
)

json_values: st.SearchStrategy[object] = st.one_of(
    scalars,
    huge_numbers,
    long_strings,
    deep_values,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.text(max_size=8), scalars, max_size=3),
    st.lists(st.dictionaries(st.text(max_size=8), scalars, max_size=2), max_size=2),
    # Built anew for each case: a shared list could end up inside itself.
    st.builds(lambda: [None]),
    st.builds(lambda: [{}]),
    st.just(REMOVED),
)


@st.composite
def mutated_reviews(draw: st.DrawFn) -> tuple[Any, object]:
    """Return a seed review changed at one to three paths, and the uid it was sent with."""
    document: Any = orjson.loads(draw(st.sampled_from(SEEDS)))
    # Paths are picked evenly: drawn from a list, the first (the root) would come up most.
    pick = draw(st.randoms(use_true_random=False))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        where = pick.choice(paths(document))
        if draw(st.booleans()) and isinstance(_at(document, where), dict):
            # A member the seed does not have, such as affinity on a pod without one.
            where = (*where, draw(st.sampled_from(MEMBER_NAMES)))
        document = put(document, where, draw(json_values))
    request = document.get("request") if isinstance(document, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return document, uid


def encoded(document: object) -> bytes:
    """Return the review as JSON bytes, raw fragments written as they are."""
    return orjson.dumps(document)
