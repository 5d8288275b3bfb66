"""The `gpuadm` command: serve, review, check-config, certs, models, quota, usage, uninstall;
one module per command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from webhook.cli import (
    certificates,
    check_config,
    models,
    quota,
    review,
    serve,
    uninstall,
    usage,
)
from webhook.cli.exits import CommandError, ExitCode, report


def build_parser(prog: str = "gpuadm") -> argparse.ArgumentParser:
    """Return the parser of every subcommand; each sets `run`, the function that does it."""
    parser = argparse.ArgumentParser(
        prog=prog, description="GPU admission controller for Kubernetes."
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="print the version of gpuadm and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve.add_parser(sub)
    review.add_parser(sub)
    certificates.add_parser(sub)
    check_config.add_parser(sub)
    models.add_parser(sub)
    quota.add_parser(sub)
    usage.add_parser(sub)
    uninstall.add_parser(sub)
    return parser


class _Version(argparse.Action):
    """--version, read from the installed package only when asked for (reading package
    metadata costs more than starting the rest of the command line)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        import importlib.metadata

        try:
            version = importlib.metadata.version("gpuadm")
        except importlib.metadata.PackageNotFoundError:
            version = "(not installed)"
        print(f"{parser.prog} {version}")
        parser.exit()


def plugin() -> int:
    """`kubectl gpuadm ...`: the same command line under kubectl's name (a kubectl plugin is
    any `kubectl-<name>` on the PATH)."""
    return main(prog="kubectl gpuadm")


def main(argv: Sequence[str] | None = None, *, prog: str = "gpuadm") -> int:
    """Run the command line; return the process exit code (see `webhook.cli.exits`)."""
    args = build_parser(prog).parse_args(argv)
    try:
        return int(args.run(args))
    except CommandError as error:
        return int(report(error))
    except BrokenPipeError:
        # The reader went away (`gpuadm review ... | head`): nothing left to say to it, and
        # Python must not complain at exit while flushing the closed pipe either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return int(ExitCode.FAILED)
    except OSError as error:
        # The system refused what the command needed (a file, a directory, a socket): a
        # reason for the admin, never a traceback. Each command names its own files where
        # it can; this is what is left.
        where = f" ({error.filename})" if error.filename else ""
        return int(report(CommandError(f"{error.strerror or error}{where}")))
