"""`gpuadm certs`: make, install, show and rotate the webhook's TLS material."""

from __future__ import annotations

import argparse
import base64
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from certs import describe, load_certified_key, renewal_due, service_dns_names, write_tls_dir
from certs.rotation import issue
from webhook.cli import flags
from webhook.cli.exits import CommandError, ExitCode
from webhook.kube.client import Kube, KubeError, connect
from webhook.tls.keeper import WEBHOOK_KINDS, TLSKeeper, TLSTarget, secret_data


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpuadm certs ...` to the command line."""
    certs = sub.add_parser("certs", help="make, install, show and rotate TLS material")
    certs.set_defaults(run=run)
    actions = certs.add_subparsers(dest="certs_command", required=True)
    generate = actions.add_parser("generate", help="write a CA and serving certificate to DIR")
    generate.add_argument("--out", type=Path, required=True, help="directory to write to")
    flags.add_serving_names(generate)
    for name, text in (
        ("install", "create the Secret if missing, renew what is due, and set the caBundles"),
        ("rotate", "replace the CA now; the old one stays trusted until it expires"),
        ("show", "print what is served and trusted, and when it expires"),
    ):
        action = actions.add_parser(name, help=text)
        flags.add_serving_names(action)
        flags.add_kubeconfig(action)
        flags.add_tls_target(action)
        if name == "show":
            action.add_argument("--dir", type=Path, help="read files from DIR, not the cluster")


def target_of(args: argparse.Namespace) -> TLSTarget:
    """Return what the keeper manages, from the command line (`certs ...` or `serve`)."""
    return TLSTarget(
        namespace=args.namespace,
        secret=args.tls_secret,
        webhook_configuration=args.webhook_configuration,
        dns_names=[*service_dns_names(args.service, args.namespace), *args.dns],
        ip_addresses=args.ip,
    )


def run(args: argparse.Namespace) -> ExitCode:
    """Run one `gpuadm certs` action; return the exit code."""
    now = datetime.now(UTC)
    if args.certs_command == "generate":
        dns = [*service_dns_names(args.service, args.namespace), *args.dns]
        state = issue(dns_names=dns, ip_addresses=args.ip, now=now)
        paths = write_tls_dir(args.out, ca=state.ca, serving=state.serving)
        key = args.out / "ca.key"
        key.write_bytes(state.ca.key_pem)
        key.chmod(0o600)
        print(f"wrote {paths.ca_file}, {key}, {paths.cert_file}, {paths.key_file}")
        return ExitCode.OK
    if args.certs_command == "show" and args.dir is not None:
        return _show_files(args.dir, now)
    try:
        kube = connect(args.kubeconfig)
        if args.certs_command == "show":
            return _show_cluster(kube, args, now)
        scratch = Path(tempfile.mkdtemp(prefix="gpuadm-certs-"))
        keeper = TLSKeeper(kube, target_of(args), scratch)
        keeper.sync(rotate=args.certs_command == "rotate")
    except KubeError as error:
        raise CommandError(str(error)) from None
    assert keeper.state is not None
    print(f"Secret {args.namespace}/{args.tls_secret}: serving {describe(keeper.state.serving)}")
    print(f"CA: {describe(keeper.state.ca)}")
    print(f"caBundle of {args.webhook_configuration} (mutating and validating) trusts it")
    return ExitCode.OK


def _show_files(directory: Path, now: datetime) -> ExitCode:
    files = {name: (directory / name).read_bytes() for name in ("tls.crt", "tls.key")}
    for name in ("ca.crt", "ca.key"):
        if (directory / name).exists():
            files[name] = (directory / name).read_bytes()
    _print_material(files, now)
    return ExitCode.OK


def _show_cluster(kube: Kube, args: argparse.Namespace, now: datetime) -> ExitCode:
    secret = kube.get_secret(args.namespace, args.tls_secret)
    if secret is None:
        print(f"no Secret {args.namespace}/{args.tls_secret}; run `gpuadm certs install`")
        return ExitCode.REFUSED
    _print_material(secret_data(secret), now)
    for kind in WEBHOOK_KINDS:
        configuration = kube.get_webhook_configuration(kind, args.webhook_configuration)
        if configuration is None:
            print(f"{kind} webhook configuration {args.webhook_configuration}: not found")
            continue
        for webhook in configuration.get("webhooks") or []:
            bundle = base64.b64decode((webhook.get("clientConfig") or {}).get("caBundle") or "")
            print(
                f"{kind} webhook {webhook['name']}: caBundle holds "
                f"{bundle.count(b'BEGIN CERTIFICATE')} CA certificate(s)"
            )
    return ExitCode.OK


def _print_material(data: dict[str, bytes], now: datetime) -> None:
    """Print the serving certificate and, where its key is there too, the CA."""
    serving = load_certified_key(data["tls.crt"], data["tls.key"])
    print(f"serving: {describe(serving)}{_due(serving.cert_pem, now)}")
    if "ca.crt" in data and "ca.key" in data:
        ca = load_certified_key(data["ca.crt"], data["ca.key"])
        print(f"CA: {describe(ca)}{_due(ca.cert_pem, now)}")


def _due(cert_pem: bytes, now: datetime) -> str:
    return " (renewal due)" if renewal_due(cert_pem, now=now) else ""
