"""`gpuadm certs`: make, install, show and rotate the webhook's TLS material."""

from __future__ import annotations

import argparse
import base64
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from webhook.cli import flags
from webhook.cli.exits import CommandError, ExitCode

if TYPE_CHECKING:
    from webhook.kube.rest import AsyncApi
    from webhook.tls.keeper import TLSTarget

# The certificate and cluster libraries are imported by the actions that use them, so that
# the commands that never do (review, check-config) start without them.


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
            action.add_argument(
                "-o",
                "--output",
                choices=["text", "wide", "json", "yaml"],
                default="text",
                help="text (default; wide is the same), json or yaml",
            )


def target_of(args: argparse.Namespace) -> TLSTarget:
    """Return what the keeper manages, from the command line (`certs ...` or `serve`)."""
    from certs import service_dns_names
    from webhook.tls.keeper import TLSTarget

    return TLSTarget(
        namespace=args.gpuadm_namespace,
        secret=args.tls_secret,
        webhook_configuration=args.webhook_configuration,
        dns_names=[*service_dns_names(args.service, args.gpuadm_namespace), *args.dns],
        ip_addresses=args.ip,
    )


def run(args: argparse.Namespace) -> ExitCode:
    """Run one `gpuadm certs` action; return the exit code."""
    from certs import describe, service_dns_names, write_tls_dir
    from certs.rotation import issue
    from webhook.cli.cluster import call, cluster_api
    from webhook.kube.errors import KubeError
    from webhook.tls.keeper import TLSKeeper

    now = datetime.now(UTC)
    if args.certs_command == "generate":
        dns = [*service_dns_names(args.service, args.gpuadm_namespace), *args.dns]
        state = issue(dns_names=dns, ip_addresses=args.ip, now=now)
        try:
            paths = write_tls_dir(args.out, ca=state.ca, serving=state.serving)
            key = args.out / "ca.key"
            key.write_bytes(state.ca.key_pem)
            key.chmod(0o600)
        except OSError as error:
            raise CommandError(f"cannot write to {args.out}: {error.strerror or error}") from None
        print(f"wrote {paths.ca_file}, {key}, {paths.cert_file}, {paths.key_file}")
        return ExitCode.OK
    if args.certs_command == "show" and args.dir is not None:
        return _show_files(args.dir, args, now)
    try:
        api = cluster_api(args)
        if args.certs_command == "show":
            stored, configurations = call(api, _read_tls(api, args))
            return _show_cluster(stored, configurations, args, now)
        import tempfile

        scratch = Path(tempfile.mkdtemp(prefix="gpuadm-certs-"))
        keeper = TLSKeeper(api, target_of(args), scratch)
        call(api, keeper.sync(rotate=args.certs_command == "rotate"))
    except KubeError as error:
        raise CommandError(str(error)) from None
    assert keeper.state is not None
    secret = f"{args.gpuadm_namespace}/{args.tls_secret}"
    print(f"Secret {secret}: serving {describe(keeper.state.serving)}")
    print(f"CA: {describe(keeper.state.ca)}")
    print(f"caBundle of {args.webhook_configuration} (mutating and validating) trusts it")
    return ExitCode.OK


def _show_files(directory: Path, args: argparse.Namespace, now: datetime) -> ExitCode:
    files: dict[str, bytes] = {}
    for name in ("tls.crt", "tls.key", "ca.crt", "ca.key"):
        path = directory / name
        try:
            files[name] = path.read_bytes()
        except FileNotFoundError:
            if name in ("tls.crt", "tls.key"):
                raise CommandError(f"cannot read {path}: no such file") from None
        except OSError as error:
            raise CommandError(f"cannot read {path}: {error.strerror or error}") from None
    shown = Shown()
    problems = _check_material(files, _host(args), now, shown)
    return _verdict(shown, problems, args.output)


async def _read_tls(
    api: AsyncApi, args: argparse.Namespace
) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any] | None]]:
    """Read the TLS Secret, and if there is one, both webhook configurations by kind."""
    from webhook.tls.keeper import WEBHOOK_KINDS

    secret = await api.get_secret(args.gpuadm_namespace, args.tls_secret)
    if secret is None:
        return None, {}
    configurations = {
        kind: await api.get_webhook_configuration(kind, args.webhook_configuration)
        for kind in WEBHOOK_KINDS
    }
    return secret, configurations


def _show_cluster(
    secret: dict[str, Any] | None,
    configurations: dict[str, dict[str, Any] | None],
    args: argparse.Namespace,
    now: datetime,
) -> ExitCode:
    from webhook.tls.keeper import secret_data

    if secret is None:
        print(f"no Secret {args.gpuadm_namespace}/{args.tls_secret}; run `gpuadm certs install`")
        return ExitCode.REFUSED
    data = secret_data(secret)
    shown = Shown()
    problems = _check_material(data, _host(args), now, shown)
    for kind, configuration in configurations.items():
        if configuration is None:
            problems.append(f"{kind} webhook configuration {args.webhook_configuration}: not found")
            continue
        for webhook in configuration.get("webhooks") or []:
            encoded = (webhook.get("clientConfig") or {}).get("caBundle") or ""
            try:
                bundle = base64.b64decode(encoded, validate=True)
            except ValueError:
                bundle = b""
            count = bundle.count(b"BEGIN CERTIFICATE")
            shown.add(
                f"{kind} webhook {webhook['name']}: caBundle holds {count} CA certificate(s)",
                "webhooks",
                {"kind": kind, "name": webhook["name"], "caCertificates": count},
            )
            if "tls.crt" in data:
                problem = _chain_problem(data["tls.crt"], bundle, _host(args), now)
                if problem:
                    problems.append(f"{kind} webhook {webhook['name']}: its caBundle {problem}")
    return _verdict(shown, problems, args.output)


def _host(args: argparse.Namespace) -> str:
    """The name the apiserver calls gpuadm by: the Service's, in gpuadm's namespace."""
    return f"{args.service}.{args.gpuadm_namespace}.svc"


class Shown:
    """What `certs show` found, as text lines and as fields for -o json|yaml."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.fields: dict[str, Any] = {}

    def add(self, line: str, key: str, value: Any) -> None:
        self.lines.append(line)
        if key == "webhooks":
            self.fields.setdefault(key, []).append(value)
        else:
            self.fields[key] = value


def _check_material(data: dict[str, bytes], host: str, now: datetime, shown: Shown) -> list[str]:
    """Print the serving certificate and the CA; return what is wrong with them: a key that
    is not the certificate's, a serving certificate the CA did not sign or that does not
    name `host`, an expired certificate."""
    from certs import CertifiedKey, describe, load_certified_key

    problems = []
    for label, cert, key in (("serving", "tls.crt", "tls.key"), ("CA", "ca.crt", "ca.key")):
        if cert not in data:
            if label == "CA":
                problems.append("no CA certificate (ca.crt): nothing to check the chain against")
            continue
        try:
            if key in data:
                material = load_certified_key(data[cert], data[key])
            else:
                material = CertifiedKey(cert_pem=data[cert], key_pem=b"")
            described = describe(material)
        except ValueError as error:  # KeyMismatchError too
            problems.append(f"{label}: {cert} and {key}: {error}")
            continue
        if material.not_after <= now:
            problems.append(f"{label}: expired at {material.not_after.isoformat()}")
        due = _renewal_due(data[cert], now)
        shown.add(
            f"{label}: {described}{' (renewal due)' if due else ''}",
            "serving" if label == "serving" else "ca",
            {
                "certificate": described,
                "notAfter": material.not_after.isoformat(),
                "renewalDue": due,
            },
        )
    if "tls.crt" in data and "ca.crt" in data:
        problem = _chain_problem(data["tls.crt"], data["ca.crt"], host, now)
        if problem:
            problems.append(f"ca.crt {problem}")
    return problems


def _chain_problem(serving: bytes, bundle: bytes, host: str, now: datetime) -> str:
    """Say why a client trusting `bundle` would refuse `serving` for `host`, or ""."""
    from certs import ChainError, verify_chain

    if not bundle:
        return "is empty: the apiserver trusts no certificate of gpuadm's"
    try:
        verify_chain(serving, bundle, hostname_or_ip=host, now=now)
    except ChainError as error:
        return f"does not vouch for the serving certificate: {error}"
    return ""


def _verdict(shown: Shown, problems: list[str], output: str) -> ExitCode:
    code = ExitCode.REFUSED if problems else ExitCode.OK
    if output in ("json", "yaml"):
        result = {**shown.fields, "valid": not problems, "problems": problems}
        if output == "json":
            print(json.dumps(result, indent=2))
        else:
            print(yaml.safe_dump(result, sort_keys=False).rstrip())
        return code
    for line in shown.lines:
        print(line)
    for problem in problems:
        print(f"problem: {problem}")
    if not problems:
        print("ok: the key pairs match, the CA signed the serving certificate, none has expired")
    return code


def _renewal_due(cert_pem: bytes, now: datetime) -> bool:
    from certs import renewal_due

    return renewal_due(cert_pem, now=now)
