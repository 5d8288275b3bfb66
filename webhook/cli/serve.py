"""`gpuadm serve`: the webhook over HTTPS, standalone on files or in a cluster."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from webhook.cli import flags
from webhook.cli.exits import CommandError, ExitCode
from webhook.server.settings import CLAIM_CONTROLLERS

# How long a thread may hold the interpreter while another waits for it. A large pod is
# planned in a worker thread (webhook.reviews.large_pods); at Python's default of 5 ms, the
# event loop waited up to that long for each of a small review's turns while one ran.
SWITCH_SECONDS = 0.0005

# The server, TLS and cluster modules, and the standard library's network and TLS modules,
# are imported when gpuadm serves, so that the commands that never do (review,
# check-config) start without them.


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpuadm serve` to the command line."""
    serve = sub.add_parser("serve", help="serve /mutate and /validate over HTTPS")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    serve.add_argument("--port", type=flags.port, default=8443, help="HTTPS port (default 8443)")
    serve.add_argument("--cert-file", type=Path, help="serving certificate (PEM)")
    serve.add_argument("--key-file", type=Path, help="key of the serving certificate (PEM)")
    serve.add_argument(
        "--tls-dir",
        type=Path,
        help="where a self-signed certificate is written when --cert-file is not given "
        "(default: a new temporary directory)",
    )
    serve.add_argument(
        "--client-ca-file",
        type=Path,
        help="answer /mutate and /validate only for callers whose client certificate this CA "
        "signed (the apiserver's, set in its admission configuration); probes and /metrics "
        "need none",
    )
    flags.add_config_files(
        serve, otherwise="given, gpuadm runs standalone on files, else in a cluster"
    )
    flags.add_kubeconfig(serve)
    flags.add_serving_names(serve)
    serve.add_argument(
        "--manage-tls",
        action="store_true",
        help="in a cluster: keep the TLS Secret (--tls-secret) and the caBundle of gpuadm's "
        "webhook configurations yourself, writing the files to --tls-dir",
    )
    flags.add_tls_target(serve)
    serve.add_argument(
        "--trusted-user",
        help="the only user allowed to change gpuadm's labels and annotations on a pod, and "
        "to write its ResourceClaimTemplates (default: system:serviceaccount:<namespace>:gpuadm)",
    )
    serve.add_argument(
        "--claim-controller-user",
        action="append",
        metavar="USER",
        help="a user of Kubernetes' resourceclaim controller, which alone makes ResourceClaims "
        "for GPUs; repeat for each (default: " + ", ".join(CLAIM_CONTROLLERS) + ")",
    )
    serve.add_argument(
        "--lease-seconds",
        type=_lease_seconds,
        default=15.0,
        help="in a cluster: how long the Lease of the replica that releases waiting pods (queue "
        "mode) and publishes GPUQuota objects lasts unrenewed, so how long a leader's death "
        "can delay releases (default 15, at least 1)",
    )
    serve.add_argument(
        "--gpu-hours-checkpoint-seconds",
        type=flags.seconds_between(1, 3600),
        default=60.0,
        help="in a cluster: how often the leader counts GPU pods' running time into each "
        "namespace's GPU-hour record, and every replica reads the records; a leader that dies "
        "loses at most this much of pods deleted meanwhile (default 60)",
    )
    serve.add_argument(
        "--gpu-hours-bucket-seconds",
        type=int,
        choices=[10, 30, 60, 300, 600, 900, 1800, 3600],
        default=3600,
        metavar="{60,300,600,900,1800,3600}",
        help="the grain of the GPU-hour records: a budget's window counts whole buckets, so "
        "it may count up to this much of usage just before it (default 3600; 10 and 30 are "
        "for tests with windows of seconds: at most 1,000 buckets this narrow are kept, "
        "older time in wider ones)",
    )
    serve.add_argument(
        "--shutdown-delay-seconds",
        type=_non_negative_seconds,
        default=0.0,
        help="after SIGTERM, keep answering this long while /readyz fails and connections "
        "close after each answer, so callers move to other replicas before this one stops "
        "(the chart sets 5; default 0)",
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
    serve.set_defaults(run=run)


def run(args: argparse.Namespace) -> ExitCode:
    """Serve the webhook over HTTPS until interrupted."""
    import gc
    import socket
    import ssl
    import tempfile
    import uuid

    from certs import CertificateReloader, server_ssl_context
    from webhook.cli.certificates import target_of
    from webhook.cli.cluster import call, cluster_api
    from webhook.cli.config_files import load_config
    from webhook.kube.errors import KubeError
    from webhook.observe import logs
    from webhook.observe.audit_log import AuditLog
    from webhook.server import listener
    from webhook.server.appkeys import METRICS
    from webhook.server.lifecycle import Background
    from webhook.server.replica import cluster_app, standalone_app
    from webhook.server.settings import Settings
    from webhook.tls.keeper import TLSKeeper

    logs.configure(args.log_level, args.log_format)
    cert_file, key_file = args.cert_file, args.key_file
    if (cert_file is None) != (key_file is None):
        raise CommandError("give --cert-file and --key-file together")
    if args.manage_tls and (args.policy or cert_file):
        raise CommandError("--manage-tls is for a cluster: give neither --policy nor --cert-file")
    try:
        api = None if args.policy else cluster_api(args)
    except KubeError as error:
        raise CommandError(
            f"{error} (give --policy FILE to run standalone, without a cluster)"
        ) from None
    keeper = None
    if args.manage_tls:
        assert api is not None
        directory = args.tls_dir or Path(tempfile.mkdtemp(prefix="gpuadm-tls-"))
        keeper = TLSKeeper(api, target_of(args), directory)
        try:
            # Before serving, to serve from the start what the Secret holds; the app's loop
            # then opens the client's connections anew, shared by the keeper's later checks.
            paths = call(api, keeper.sync())
        except KubeError as error:
            raise CommandError(
                f"cannot set up TLS from Secret {args.tls_secret}: {error}"
            ) from None
        cert_file, key_file = paths.cert_file, paths.key_file
    elif cert_file is None:
        cert_file, key_file = _self_signed(args.tls_dir)
    settings = Settings(
        host=args.host,
        port=args.port,
        cert_file=cert_file,
        key_file=key_file,
        client_ca_file=args.client_ca_file,
        policy_file=args.policy,
        quotas_file=args.quotas,
        namespace=args.gpuadm_namespace,
        trusted_user=args.trusted_user or f"system:serviceaccount:{args.gpuadm_namespace}:gpuadm",
        claim_controllers=tuple(args.claim_controller_user or CLAIM_CONTROLLERS),
        lease_seconds=args.lease_seconds,
        gpu_hours_checkpoint_seconds=args.gpu_hours_checkpoint_seconds,
        gpu_hours_bucket_seconds=args.gpu_hours_bucket_seconds,
        identity=f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
    )
    _use_fast_loop()
    audit = AuditLog(args.audit_log, max_bytes=args.audit_max_bytes, backups=args.audit_backups)
    for flag, path in (
        ("--cert-file", cert_file),
        ("--key-file", key_file),
        ("--client-ca-file", args.client_ca_file),
    ):
        if path is not None and not Path(path).is_file():
            raise CommandError(f"cannot read {flag} {path}: no such file")
    try:
        ssl_context = server_ssl_context(cert_file, key_file, client_ca_file=args.client_ca_file)
    except (OSError, ssl.SSLError) as error:
        raise CommandError(f"cannot load the TLS files: {error}") from None
    reloader = CertificateReloader(ssl_context, cert_file, key_file)
    if api is None:
        snapshot = load_config(args.policy, args.quotas)
        app = standalone_app(settings, snapshot, audit=audit, tls=reloader)
    else:
        extra = (Background("tls-keeper", keeper.run),) if keeper else ()
        app = cluster_app(settings, api, audit=audit, tls=reloader, extra=extra)
    # What is loaded by now (modules, the config, the app) lives as long as the process.
    # Frozen, the collector no longer walks it in each full collection: with the Kubernetes
    # client loaded, such a walk held the event loop for 40 to 160 ms under load.
    gc.freeze()
    sys.setswitchinterval(SWITCH_SECONDS)
    try:
        listener.serve(
            app,
            host=settings.host,
            port=settings.port,
            ssl_context=ssl_context,
            on_refused=app[METRICS].connections_refused.inc,
            on_opened=app[METRICS].connections_opened.inc,
            drain_seconds=args.shutdown_delay_seconds,
        )
    except OSError as error:
        raise CommandError(
            f"cannot listen on {settings.host}:{settings.port}: {error.strerror or error}"
        ) from None
    return ExitCode.OK


_lease_seconds = flags.seconds_between(1, 3600)
# Beyond a minute the kubelet's default grace period (30 s) would kill the replica mid-drain
# anyway; the chart refuses a grace period under the delay + webhook timeout + 5 s.
_non_negative_seconds = flags.seconds_between(0, 60)


def _self_signed(tls_dir: Path | None) -> tuple[Path, Path]:
    """Make a CA and a serving certificate for local use; say where the CA is."""
    import logging
    import tempfile
    from datetime import UTC, datetime

    from certs import new_ca, new_serving_cert, write_tls_dir

    directory = tls_dir or Path(tempfile.mkdtemp(prefix="gpuadm-tls-"))
    now = datetime.now(UTC)
    ca = new_ca(now=now)
    serving = new_serving_cert(
        ca, dns_names=["localhost", "gpuadm"], ip_addresses=["127.0.0.1", "::1"], now=now
    )
    paths = write_tls_dir(directory, ca=ca, serving=serving)
    logging.getLogger("gpuadm").warning(
        "no --cert-file given: serving a self-signed certificate; its CA is %s", paths.ca_file
    )
    return paths.cert_file, paths.key_file


def _use_fast_loop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    uvloop.install()
