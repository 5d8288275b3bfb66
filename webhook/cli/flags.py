"""Flags shared by several commands, each defined once with one name and one default."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

DEFAULT_NAMESPACE = "gpuadm-system"
# The name of gpuadm's Mutating- and ValidatingWebhookConfiguration, as deploy/ ships them.
WEBHOOK_CONFIGURATION = "gpuadm"


# A namespace's name, as the apiserver checks it: a DNS-1123 label.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def namespace_name(value: str) -> str:
    """Return `value` if it can name a namespace; else say why, as kubectl's server would."""
    if not _NAMESPACE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a namespace's name: at most 63 lowercase letters, digits and "
            "'-', starting and ending with a letter or digit"
        )
    return value


def port(value: str) -> int:
    """Return `value` as a TCP port to listen on, 1 to 65535."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port: give 1 to 65535")
    return number


def add_config_files(parser: argparse.ArgumentParser, *, otherwise: str) -> None:
    """Add --policy and --quotas; `otherwise` says what a command does without them."""
    parser.add_argument("--policy", type=Path, help=f"policy.yaml; {otherwise}")
    parser.add_argument("--quotas", type=Path, help="quotas.yaml (default: no quotas)")


def add_kubeconfig(parser: argparse.ArgumentParser) -> None:
    """Add --kubeconfig and --context, as kubectl reads them."""
    parser.add_argument(
        "--kubeconfig",
        help="kubeconfig to reach the cluster (default: $KUBECONFIG, a list of files as "
        "kubectl reads it; else, in a pod, its service account; else ~/.kube/config)",
    )
    parser.add_argument(
        "--context", help="the kubeconfig context to use (default: its current-context)"
    )


def add_gpuadm_namespace(parser: argparse.ArgumentParser, *, has_tenant: bool = False) -> None:
    """Add --gpuadm-namespace, gpuadm's own namespace. `-n` is always a tenant's namespace;
    the old spelling `--namespace` of commands that have no tenant (`has_tenant`) still
    works, and warns."""
    default = os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE
    parser.add_argument(
        "--gpuadm-namespace",
        default=default,
        type=namespace_name,
        help="gpuadm's namespace, where its ConfigMaps, records and TLS Secret live "
        f"(default: $POD_NAMESPACE, else {DEFAULT_NAMESPACE})",
    )
    if has_tenant:
        return
    parser.add_argument(
        "--namespace",
        dest="gpuadm_namespace",
        type=namespace_name,
        action=_Deprecated,
        help=argparse.SUPPRESS,
    )


class _Deprecated(argparse.Action):
    """An old flag spelling: it sets the same value, and says which to use instead."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(
            f"gpuadm: warning: {option_string} is deprecated here: gpuadm's own namespace is "
            "--gpuadm-namespace (-n and --namespace name a tenant's namespace)",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def add_serving_names(parser: argparse.ArgumentParser) -> None:
    """Add the flags that say where gpuadm serves, and so what its certificate names."""
    add_gpuadm_namespace(parser)
    parser.add_argument(
        "--service", default="gpuadm", help="the Service in front of gpuadm (default gpuadm)"
    )
    parser.add_argument("--dns", action="append", default=[], help="an extra DNS name to serve")
    parser.add_argument("--ip", action="append", default=[], help="an IP address to serve")


def add_tls_target(parser: argparse.ArgumentParser) -> None:
    """Add the flags that name what `serve --manage-tls` and `certs` keep in a cluster."""
    parser.add_argument(
        "--tls-secret",
        "--secret",
        dest="tls_secret",
        default="gpuadm-tls",
        help="the Secret that holds gpuadm's CA and serving certificate (default gpuadm-tls)",
    )
    parser.add_argument(
        "--webhook-configuration",
        default=WEBHOOK_CONFIGURATION,
        help="name of gpuadm's Mutating- and ValidatingWebhookConfiguration, whose caBundle "
        f"gpuadm keeps (default {WEBHOOK_CONFIGURATION})",
    )


def seconds_between(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a number of seconds from `low` to `high`."""

    def seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: give {low:g} to {high:g} seconds"
            )
        return value

    return seconds
