"""The cluster as the commands reach it: the kubeconfig read by the official client, every
call made by the async client (`webhook.kube.rest`), from an event loop of the command's own.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
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
