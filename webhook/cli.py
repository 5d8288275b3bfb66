"""The `gpuadm` command: serve, review, check-config, certs."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from webhook import certs_commands, commands


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="gpuadm", description="GPU admission controller for Kubernetes."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve /mutate and /validate over HTTPS")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    serve.add_argument("--port", type=int, default=8443, help="HTTPS port (default 8443)")
    serve.add_argument("--cert-file", type=Path, help="serving certificate (PEM)")
    serve.add_argument("--key-file", type=Path, help="key of the serving certificate (PEM)")
    serve.add_argument(
        "--tls-dir",
        type=Path,
        help="where a self-signed certificate is written when --cert-file is not given "
        "(default: a new temporary directory)",
    )
    _config_arguments(serve, required=False)
    serve.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "gpuadm-system"),
        help="gpuadm's namespace, where its ConfigMaps and usage records live "
        "(default: $POD_NAMESPACE, else gpuadm-system)",
    )
    serve.add_argument(
        "--kubeconfig",
        help="kubeconfig to reach the cluster (default: in-cluster service account, "
        "else $KUBECONFIG or ~/.kube/config); ignored when --policy is given",
    )
    serve.add_argument(
        "--manage-tls",
        action="store_true",
        help="in a cluster: keep the TLS Secret (--tls-secret) and the caBundle of gpuadm's "
        "webhook configurations yourself, writing the files to --tls-dir",
    )
    serve.add_argument("--tls-secret", default="gpuadm-tls", help="Secret for --manage-tls")
    serve.add_argument(
        "--webhook-configuration",
        default="gpuadm",
        help="name of gpuadm's two webhook configurations, for --manage-tls",
    )
    serve.add_argument(
        "--service", default="gpuadm", help="the Service in front of gpuadm, for --manage-tls"
    )
    serve.add_argument(
        "--dns", action="append", default=[], help="an extra DNS name to serve (--manage-tls)"
    )
    serve.add_argument(
        "--ip", action="append", default=[], help="an IP address to serve (--manage-tls)"
    )
    serve.add_argument(
        "--trusted-user",
        help="the only user allowed to change gpuadm's labels and annotations on a pod "
        "(default: system:serviceaccount:<namespace>:gpuadm)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--log-format",
        default="json",
        choices=["json", "text"],
        help="operational log format on stderr (default json)",
    )
    serve.add_argument(
        "--audit-log",
        default="-",
        help="where audit records go: - for stdout (default), else a file rotated by size",
    )
    serve.add_argument(
        "--audit-max-bytes",
        type=int,
        default=100 * 1024 * 1024,
        help="rotate the audit file at this size (default 100 MiB)",
    )
    serve.add_argument(
        "--audit-backups", type=int, default=5, help="rotated audit files to keep (default 5)"
    )

    review = sub.add_parser("review", help="show offline what gpuadm would do to a pod")
    review.add_argument("pod", type=Path, help="a Pod manifest (YAML or JSON); - for stdin")
    _config_arguments(review, required=True)
    review.add_argument("--namespace", "-n", help="namespace to judge the pod in")
    review.add_argument("--output", "-o", choices=["text", "json"], default="text")

    certs_commands.add_parser(sub)

    check = sub.add_parser("check-config", help="validate policy and quota files")
    check.add_argument("files", type=Path, nargs="+", help="policy.yaml, quotas.yaml or ConfigMaps")
    return parser


def _config_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    standalone = "" if required else "; given, gpuadm runs standalone on files, else in a cluster"
    parser.add_argument("--policy", type=Path, required=required, help="policy.yaml" + standalone)
    parser.add_argument("--quotas", type=Path, help="quotas.yaml (default: no quotas)")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the process exit code."""
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return commands.serve_forever(args)
    if args.command == "review":
        return commands.review(args)
    if args.command == "certs":
        return certs_commands.run(args)
    return commands.check_config(args.files)


if __name__ == "__main__":
    sys.exit(main())
