"""The cluster as the commands reach it: the kubeconfig read by the official client, every
call made by the async client (`webhook.kube.rest`), from an event loop of the command's own.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Coroutine
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, TypeVar

from webhook.cli.exits import CommandError

if TYPE_CHECKING:
    from webhook.config.snapshot import ConfigSnapshot
    from webhook.kube.rest import AsyncApi

T = TypeVar("T")


def cluster_api(args: argparse.Namespace) -> AsyncApi:
    """Return the client of the cluster `--kubeconfig` and `--context` name (else the pod's
    service account); raise `KubeError` if there is none to reach."""
    from webhook.kube.client import connect
    from webhook.kube.rest import AsyncApi

    return AsyncApi(connect(args.kubeconfig, context=args.context).endpoint())


def call(api: AsyncApi, work: Coroutine[Any, Any, T]) -> T:
    """Run `work`, which calls the apiserver through `api`, to its end in an event loop of its
    own, then close `api`'s connections (a later loop opens its own).

    A call that failed is raised as `KubeError`, said for the command's user: the apiserver's
    answer, or why there was none (`cannot reach the apiserver at ...`).
    """
    from webhook.kube.errors import KubeError
    from webhook.kube.rest import plainly

    async def closing() -> T:
        try:
            return await work
        finally:
            await api.close()

    try:
        return asyncio.run(closing())
    except KubeError as error:
        raise plainly(error, api.endpoint) from None


# What to do when the apiserver refuses a read of gpuadm's ConfigMaps: a tenant's command
# needs only those two, which the chart grants by name; an admin's reads the whole namespace.
TENANT_GRANT = (
    "ask your admin to turn on the chart's tenantAccess.readConfig for you (docs/tenants.md)"
)
ADMIN_GRANT = (
    "this command reads gpuadm's namespace as an admin does: run it with an admin's kubeconfig "
    "(docs/operations.md)"
)


async def _read_configmap(
    api: AsyncApi, namespace: str, name: str, when_forbidden: str
) -> dict[str, Any] | None:
    """Read one of gpuadm's ConfigMaps by name; a refusal says which grant is missing."""
    from webhook.kube.errors import KubeError

    try:
        return await api.get_configmap(namespace, name)
    except KubeError as error:
        if error.status != HTTPStatus.FORBIDDEN:
            raise
        raise CommandError(
            f"you may not read ConfigMap {namespace}/{name} ({error}): {when_forbidden}"
        ) from None


async def cluster_config(
    api: AsyncApi, namespace: str, *, when_forbidden: str = ADMIN_GRANT
) -> ConfigSnapshot:
    """Read gpuadm's policy and quotas from its ConfigMaps in `namespace`, as `serve` reads
    them; raise `CommandError` saying what is missing or invalid, and, if the reads are
    refused, `when_forbidden`."""
    from policies import ConfigError
    from webhook.config.configmap_source import POLICY_KEY, POLICY_MAP, QUOTAS_KEY, QUOTAS_MAP
    from webhook.config.read_budget import read_within
    from webhook.config.snapshot import snapshot_from_text

    # Each by name: a tenant may be granted get on exactly these two (the chart's
    # tenantAccess.readConfig), never a list of the namespace's usage records.
    maps = {
        name: await _read_configmap(api, namespace, name, when_forbidden)
        for name in (POLICY_MAP, QUOTAS_MAP)
    }
    if maps[POLICY_MAP] is None:
        raise CommandError(f"no ConfigMap {POLICY_MAP} in namespace {namespace}: is gpuadm there?")
    if maps[QUOTAS_MAP] is None:
        raise CommandError(
            f"no ConfigMap {QUOTAS_MAP} in namespace {namespace}: gpuadm refuses GPU pods in "
            "governed namespaces until it has one"
        )

    def text(name: str, key: str) -> str:
        data = (maps.get(name) or {}).get("data") or {}
        if key not in data:
            raise CommandError(
                f"ConfigMap {namespace}/{name} has no key {key}: gpuadm refuses GPU pods in "
                "governed namespaces until it has one"
            )
        return str(data[key])

    policy, quotas = text(POLICY_MAP, POLICY_KEY), text(QUOTAS_MAP, QUOTAS_KEY)
    try:
        return await read_within(
            lambda: snapshot_from_text(
                policy,
                quotas,
                policy_source=f"{POLICY_MAP}[{POLICY_KEY}]",
                quotas_source=f"{QUOTAS_MAP}[{QUOTAS_KEY}]",
            ),
            source=f"ConfigMaps {POLICY_MAP} and {QUOTAS_MAP}",
        )
    except ConfigError as error:
        raise CommandError(
            "the config in the cluster is invalid (gpuadm keeps the last valid one in force):\n  "
            + "\n  ".join(error.problems)
        ) from None
