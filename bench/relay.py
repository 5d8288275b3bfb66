"""The benchmark's balancer in a process of its own, on uvloop.

The end-to-end suite's `Balancer` relays every byte in a thread of the process that holds
it. In the benchmark that process also sends the bursts' 200 creates, so the relay and the
client take turns at one interpreter lock, and on two cores they take CPU from the
apiserver and gpuadm: a burst through three replicas measured the relay as much as
gpuadm. A cluster's Service forwards in the kernel. Here the same `Balancer` runs in a
process of its own, on uvloop, told where to route over its stdin:
`python -m bench.relay` prints its port, then reads lines of comma-separated ports (none:
route nowhere) and answers `ok` to each.
"""

from __future__ import annotations

import subprocess
import sys

from tests.e2e.gpuadm import Balancer
from tests.support import ROOT


class RelayProcess:
    """`Balancer`'s interface, served by `python -m bench.relay` in a child process."""

    name = "relay"

    def __init__(self) -> None:
        self.port = 0
        self.backends: list[int] = []
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """Start the child and learn its port."""
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.relay"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        self.port = int(self._process.stdout.readline())

    def route_to(self, ports: list[int]) -> None:
        """Send new connections to these ports, in turn; cut open ones to any other port."""
        process = self._process
        assert process is not None
        assert process.stdin is not None
        assert process.stdout is not None
        self.backends = list(ports)
        process.stdin.write(",".join(str(port) for port in ports) + "\n")
        process.stdin.flush()
        answer = process.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"the relay did not take the route: {answer!r}")

    def stop(self) -> None:
        """Stop the child: it stops listening and closes every connection it carries."""
        if self._process is not None and self._process.stdin is not None:
            self._process.stdin.close()
            self._process.wait(timeout=20)


def main() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    balancer = Balancer()
    balancer.start()
    print(balancer.port, flush=True)
    for line in sys.stdin:
        ports = [int(port) for port in line.strip().split(",") if port]
        balancer.route_to(ports)
        print("ok", flush=True)
    balancer.stop()


if __name__ == "__main__":
    main()
