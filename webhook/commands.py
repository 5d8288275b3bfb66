"""What each `gpuadm` subcommand does; `webhook.cli` only parses their arguments."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonpatch
import yaml
from aiohttp import web

from certs import (
    CertificateReloader,
    new_ca,
    new_serving_cert,
    server_ssl_context,
    write_tls_dir,
)
from policies import ConfigError, load_policy, load_quotas
from webhook import admission, certs_commands, logs
from webhook.app import create_app
from webhook.audit import AuditLog
from webhook.cluster import ClusterState
from webhook.config import ConfigHolder, ConfigSnapshot
from webhook.files import read_snapshot
from webhook.keys import TLS_RELOADER
from webhook.kube import Kube, KubeError, connect
from webhook.ledger import QuotaLedger
from webhook.metrics import Metrics
from webhook.reservations import MemoryStore
from webhook.review import AdmissionRequest
from webhook.settings import Settings
from webhook.tlskeeper import TLSKeeper
from webhook.usage import UsageIndex

log = logging.getLogger("gpuadm")

EXIT_OK, EXIT_DENIED, EXIT_USAGE = 0, 1, 2


def _fail(message: str) -> int:
    print(f"gpuadm: {message}", file=sys.stderr)
    return EXIT_USAGE


def load_config(policy: Path, quotas: Path | None) -> ConfigSnapshot:
    """Read the config files, or exit with every problem they have."""
    try:
        return read_snapshot(policy, quotas)
    except ConfigError as error:
        raise SystemExit(_fail("invalid config:\n  " + "\n  ".join(error.problems))) from None
    except OSError as error:
        raise SystemExit(_fail(f"cannot read config: {error}")) from None


# --- review -------------------------------------------------------------------------------


def review(args: argparse.Namespace) -> int:
    """Print what gpuadm would do to a pod: verdict, warnings, patch and the mutated pod."""
    config = load_config(args.policy, args.quotas)
    try:
        text = sys.stdin.read() if str(args.pod) == "-" else args.pod.read_text()
        pod = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as error:
        return _fail(f"cannot read pod {args.pod}: {error}")
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        return _fail(f"{args.pod} is not a Pod manifest")
    metadata = pod.get("metadata") or {}
    namespace = args.namespace or metadata.get("namespace") or "default"
    result = asyncio.run(_review(pod, namespace, config))
    if args.output == "json":
        print(json.dumps(result, indent=2))
    else:
        _print_review(result)
    return EXIT_OK if result["allowed"] else EXIT_DENIED


async def _review(pod: dict[str, Any], namespace: str, config: ConfigSnapshot) -> dict[str, Any]:
    """Run the pod through /mutate then /validate, as the apiserver would."""
    mutated = admission.mutate(_request(pod, namespace), config)
    result: dict[str, Any] = {
        "namespace": namespace,
        "allowed": mutated.outcome != "denied",
        "reason": mutated.reason,
        "warnings": list(mutated.warnings),
        "patch": mutated.patch,
        "pod": pod,
    }
    if not result["allowed"]:
        return result
    stored = jsonpatch.apply_patch(pod, mutated.patch) if mutated.patch else pod
    # A fresh ledger: the pod is judged against the quota as if the namespace held nothing.
    ledger = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False)
    validated = await admission.validate(
        _request(stored, namespace), config, ledger, trusted_user=""
    )
    result.update(
        allowed=validated.outcome != "denied",
        reason=validated.reason,
        warnings=list(dict.fromkeys([*mutated.warnings, *validated.warnings])),
        pod=stored,
        demand=mutated.plan.demand if mutated.plan else None,
    )
    return result


def _request(pod: dict[str, Any], namespace: str) -> AdmissionRequest:
    return AdmissionRequest(
        uid=str(uuid.uuid4()),
        operation="CREATE",
        namespace=namespace,
        name=str((pod.get("metadata") or {}).get("name") or ""),
        object=pod,
        old_object=None,
        dry_run=True,
        user="gpuadm-review",
        groups=(),
    )


def _print_review(result: dict[str, Any]) -> None:
    verdict = "allowed" if result["allowed"] else "denied"
    print(f"verdict: {verdict} (namespace {result['namespace']})")
    if result.get("demand"):
        print(f"demand: {result['demand']}")
    if result["reason"]:
        print(f"reason: {result['reason']}")
    for warning in result["warnings"]:
        print(f"warning: {warning}")
    if not result["allowed"]:
        return
    if result["patch"]:
        print("patch:")
        print(_indent(yaml.safe_dump(result["patch"], sort_keys=False)))
        print("pod after admission:")
        print(_indent(yaml.safe_dump(result["pod"], sort_keys=False)))
    else:
        print("patch: none (the pod is stored as written)")


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.rstrip().splitlines())


# --- check-config -------------------------------------------------------------------------


def check_config(files: Sequence[Path]) -> int:
    """Validate policy and quota files (or ConfigMaps holding them); print every problem."""
    problems: list[str] = []
    policies, quotas = [], []
    for path in files:
        try:
            for key, text in _config_texts(path):
                source = f"{path}[{key}]" if key else str(path)
                if _is_policy(key, text):
                    policies.append(load_policy(text, source=source))
                else:
                    quotas.append((source, load_quotas(text, source=source)))
        except ConfigError as error:
            problems += error.problems
        except (OSError, yaml.YAMLError) as error:
            problems.append(f"{path}: {error}")
    for policy in policies:
        for source, quota in quotas:
            problems += [f"{source}: {problem}" for problem in quota.unknown_classes(policy)]
    for problem in problems:
        print(problem)
    if problems:
        return EXIT_DENIED
    print(f"ok: {len(policies)} policy and {len(quotas)} quota config(s) are valid")
    return EXIT_OK


def _config_texts(path: Path) -> list[tuple[str, str]]:
    """Return (key, text) of each config in a file: itself, or the data of a ConfigMap."""
    text = path.read_text()
    document = yaml.safe_load(text)
    if isinstance(document, dict) and document.get("kind") == "ConfigMap":
        data = document.get("data") or {}
        return [(key, str(value)) for key, value in data.items() if key.endswith((".yaml", ".yml"))]
    return [("", text)]


def _is_policy(key: str, text: str) -> bool:
    if key:
        return key.startswith("policy")
    document = yaml.safe_load(text)
    return isinstance(document, dict) and "classes" in document


# --- serve --------------------------------------------------------------------------------


def serve_forever(args: argparse.Namespace) -> int:
    """Serve the webhook over HTTPS until interrupted."""
    logs.configure(args.log_level, args.log_format)
    cert_file, key_file = args.cert_file, args.key_file
    if (cert_file is None) != (key_file is None):
        return _fail("give --cert-file and --key-file together")
    if args.manage_tls and (args.policy or cert_file):
        return _fail("--manage-tls is for a cluster: give neither --policy nor --cert-file")
    try:
        kube = None if args.policy else connect(args.kubeconfig)
    except KubeError as error:
        return _fail(f"{error} (give --policy FILE to run standalone, without a cluster)")
    keeper = None
    if args.manage_tls:
        assert kube is not None
        directory = args.tls_dir or Path(tempfile.mkdtemp(prefix="gpuadm-tls-"))
        target = certs_commands.target_of(args, secret=args.tls_secret)
        keeper = TLSKeeper(kube, target, directory)
        try:
            paths = keeper.sync()
        except KubeError as error:
            return _fail(f"cannot set up TLS from Secret {args.tls_secret}: {error}")
        cert_file, key_file = paths.cert_file, paths.key_file
    elif cert_file is None:
        cert_file, key_file = _self_signed(args.tls_dir)
    settings = Settings(
        host=args.host,
        port=args.port,
        cert_file=cert_file,
        key_file=key_file,
        policy_file=args.policy,
        quotas_file=args.quotas,
        namespace=args.namespace,
        trusted_user=args.trusted_user or f"system:serviceaccount:{args.namespace}:gpuadm",
    )
    _use_fast_loop()
    audit = AuditLog(args.audit_log, max_bytes=args.audit_max_bytes, backups=args.audit_backups)
    app = _standalone_app(settings, audit) if kube is None else _cluster_app(settings, audit, kube)
    if keeper is not None:
        app.cleanup_ctx.append(_background(keeper.run))
    ssl_context = server_ssl_context(cert_file, key_file)
    app[TLS_RELOADER] = CertificateReloader(ssl_context, cert_file, key_file)
    log.info("serving on https://%s:%d", settings.host, settings.port)
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        ssl_context=ssl_context,
        print=None,
        access_log=None,
    )
    return EXIT_OK


def _standalone_app(settings: Settings, audit: AuditLog) -> web.Application:
    """Serve from files, with an in-memory ledger of what this process admitted."""
    assert settings.policy_file is not None
    holder = ConfigHolder(load_config(settings.policy_file, settings.quotas_file))
    metrics = Metrics()
    ledger = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False, metrics=metrics)
    log.info("standalone: config from %s, quota usage kept in memory", settings.policy_file)
    return create_app(settings, holder, quota=ledger, metrics=metrics, audit=audit)


def _cluster_app(settings: Settings, audit: AuditLog, kube: Kube) -> web.Application:
    """Serve from the cluster: ConfigMaps, the pod watch and shared usage records."""
    holder = ConfigHolder()
    metrics = Metrics()
    state = ClusterState(kube, settings.namespace, holder, metrics)
    app = create_app(settings, holder, quota=state.ledger, metrics=metrics, audit=audit)
    state.attach(app)
    log.info("in a cluster: config from ConfigMaps in namespace %s", settings.namespace)
    return app


def _background(
    run: Callable[[], Coroutine[Any, Any, None]],
) -> Callable[[web.Application], AsyncIterator[None]]:
    """Return a cleanup context that runs `run` for the life of the app."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return context


def _self_signed(tls_dir: Path | None) -> tuple[Path, Path]:
    """Make a CA and a serving certificate for local use; say where the CA is."""
    directory = tls_dir or Path(tempfile.mkdtemp(prefix="gpuadm-tls-"))
    now = datetime.now(UTC)
    ca = new_ca(now=now)
    serving = new_serving_cert(
        ca, dns_names=["localhost", "gpuadm"], ip_addresses=["127.0.0.1", "::1"], now=now
    )
    paths = write_tls_dir(directory, ca=ca, serving=serving)
    log.warning(
        "no --cert-file given: serving a self-signed certificate; its CA is %s", paths.ca_file
    )
    return paths.cert_file, paths.key_file


def _use_fast_loop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    uvloop.install()
