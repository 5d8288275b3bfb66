"""How every `gpuadm` command ends: one exit-code convention, and errors on stderr.

- 0: done, and the answer is yes (allowed, valid, written).
- 1: done, and the answer is no (denied, invalid config, nothing to show); what was wrong
  is printed on stdout, as part of the answer.
- 3 (`review` only): done, and the answer is "not yet": nothing would be refused, but a pod
  would wait in line for room (queue mode).
- 2: the command could not do its job (bad arguments, unreadable input, no cluster); the
  reason is printed on stderr as `gpuadm: <reason>`. argparse uses 2 for bad usage too.
"""

from __future__ import annotations

import sys
from enum import IntEnum


class ExitCode(IntEnum):
    """The process exit codes of every command."""

    OK = 0
    REFUSED = 1
    FAILED = 2
    WAITS = 3


class CommandError(Exception):
    """The command cannot do its job; `main` prints the message and exits with `code`."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def report(error: CommandError) -> ExitCode:
    """Print a command's failure on stderr, the same way for every command."""
    print(f"gpuadm: {error.message}", file=sys.stderr)
    return error.code
