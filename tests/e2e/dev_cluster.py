"""Run the test control plane by hand until Ctrl-C.

Usage::

    python -m tests.e2e.dev_cluster [--kubeconfig PATH]

Starts the same etcd and kube-apiserver the end-to-end tests use, prints how
to reach them, and stops them cleanly on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from tests.e2e.cluster import ControlPlane, ControlPlaneError

HEALTH_CHECK_SECONDS = 1.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.e2e.dev_cluster",
        description="Run the end-to-end test control plane until Ctrl-C.",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="also copy the admin kubeconfig here (removed again on exit), "
        "so a fixed KUBECONFIG keeps working across restarts",
    )
    return parser.parse_args(argv)


def usage_hint(plane: ControlPlane, kubeconfig: Path) -> str:
    """Describe how to reach the running control plane, with and without kubectl."""
    quoted = shlex.quote(str(kubeconfig))
    curl = (
        f"curl --cacert {shlex.quote(str(plane.ca_file))}"
        f" -H 'Authorization: Bearer {plane.token}' {plane.url}/api/v1/namespaces"
    )
    python = (
        "python -c 'import kubernetes as k; k.config.load_kube_config();"
        " print([n.metadata.name for n in k.client.CoreV1Api().list_namespace().items])'"
    )
    return "\n".join(
        [
            "Control plane is ready (no controller-manager, scheduler or kubelet).",
            f"  API server:  {plane.url}",
            f"  kubeconfig:  {kubeconfig}",
            f"  logs:        {plane.log_path('kube-apiserver')}",
            f"               {plane.log_path('etcd')}",
            "",
            f"  export KUBECONFIG={quoted}",
            "",
            "Without kubectl:",
            f"  {curl}",
            f"  {python}",
            "",
            "Press Ctrl-C to stop.",
        ]
    )


def stop_on_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt so it takes the same clean exit as Ctrl-C."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def serve(plane: ControlPlane, kubeconfig: Path) -> None:
    """Print the usage hint, then block until interrupted or a process dies."""
    print(usage_hint(plane, kubeconfig), flush=True)
    try:
        while True:
            plane.raise_if_exited()
            time.sleep(HEALTH_CHECK_SECONDS)
    except KeyboardInterrupt:
        print("\nStopping the control plane.", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the control plane until Ctrl-C; return the process exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    stop_on_sigterm()
    try:
        with ControlPlane() as plane:
            kubeconfig = plane.kubeconfig_path
            if args.kubeconfig is not None:
                # copy() keeps the owner-only mode: the file holds the admin token.
                kubeconfig = Path(shutil.copy(plane.kubeconfig_path, args.kubeconfig))
            try:
                serve(plane, kubeconfig)
            finally:
                if args.kubeconfig is not None:
                    kubeconfig.unlink(missing_ok=True)
    except ControlPlaneError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # Interrupted while building or starting; start() already cleaned up.
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
