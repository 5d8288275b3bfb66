"""Realistic AdmissionReviews: every backend, whole GPUs and shares, pods of a few KiB."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import jsonpatch
import orjson

from policies import load_policy, plan
from tests.builders import POLICY_YAML

# (class, amount): every backend of the test policy, whole and shared where it can share.
ASKS = [
    ("a100", "1"),
    ("a100", "0.5"),
    ("t4", "2"),
    ("t4", "250m"),
    ("h100", "4"),
    ("a100-mig", "0.5"),
    ("v100", "0.5"),
    ("l4", "1"),
    ("a10", "0.25"),
    ("a10", "2"),
]
NAMESPACE = "bench"


def realistic_pod(class_name: str, amount: str, index: int) -> dict[str, Any]:
    """Return a pod like a training job's: env, probes, volumes, labels, two containers."""
    env = [{"name": f"SETTING_{i}", "value": f"value-{i}-" + "x" * 24} for i in range(24)]
    sidecar = {
        "name": "log-shipper",
        "image": "registry.example.com/shipper:2.4.1",
        "resources": {
            "limits": {"cpu": "100m", "memory": "128Mi"},
            "requests": {"cpu": "100m", "memory": "128Mi"},
        },
    }
    trainer = {
        "name": "trainer",
        "image": "registry.example.com/ml/trainer:1.18.0",
        "command": ["python", "-m", "trainer", "--epochs", "40"],
        "env": env,
        "resources": {
            "limits": {"cpu": "8", "memory": "32Gi", f"gpuadm.io/{class_name}": amount},
            "requests": {"cpu": "8", "memory": "32Gi", f"gpuadm.io/{class_name}": amount},
        },
        "volumeMounts": [
            {"name": "data", "mountPath": "/data"},
            {"name": "cache", "mountPath": "/cache"},
        ],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 10},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"train-{index}",
            "namespace": NAMESPACE,
            "uid": str(uuid.UUID(int=index)),
            "labels": {"app": "trainer", "team": "vision", "run": f"r{index}"},
            "annotations": {"example.com/owner": "vision-team", "example.com/run": str(index)},
        },
        "spec": {
            "containers": [trainer, sidecar],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
                {"name": "cache", "emptyDir": {}},
            ],
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
        },
    }


def review(pod: dict[str, Any], index: int) -> bytes:
    """Return the body the apiserver would POST for this pod."""
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.UUID(int=10**6 + index)),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": NAMESPACE,
                "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
                "object": pod,
                "dryRun": False,
            },
        }
    )


def mutate_and_validate_bodies(count: int = 200) -> tuple[list[bytes], list[bytes]]:
    """Return `/mutate` bodies (as users write pods) and `/validate` bodies (as stored)."""
    policy = load_policy(POLICY_YAML)
    mutate, validate = [], []
    for index in range(count):
        class_name, amount = ASKS[index % len(ASKS)]
        pod = realistic_pod(class_name, amount, index)
        mutate.append(review(pod, index))
        stored = jsonpatch.apply_patch(copy.deepcopy(pod), plan(pod, policy).patch)
        validate.append(review(stored, index))
    return mutate, validate
