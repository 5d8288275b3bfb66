"""The benchmark's balancer in the kernel, as a Service's is with kube-proxy in iptables mode.

The relay (`bench.relay`) copies every byte through Python, in a process of its own: on
two cores its CPU comes out of the apiserver's and gpuadm's, and a burst through three
replicas measured the relay with them. A cluster's Service forwards in the kernel. With
root and iptables, the benchmark does too, as kube-proxy does: the balancer's address is a
port nobody listens on, and a chain of NAT rules sends each new connection to it on to one
replica's port, each rule taking a connection with the probability that spreads them
evenly. Once a connection is made, no byte of it leaves the kernel.

Taking a replica out of the route cuts its connections (`ss -K`, the kernel's socket
destroy, on the replica's end of each), so that the apiserver gets a reset, dials again and
lands where the route now says, as when a replica behind a Service goes away. Destroying
the apiserver's end instead left its client a moment in which a call still went to the
dead connection and failed. The kernel's record of where those connections went is deleted
too (`conntrack -D`): a new connection that happened to reuse one's addresses was sent on
to the old port. Where the rules cannot be made (not root; no iptables, ss or conntrack),
the benchmark uses the relay, and its results say which balancer it ran behind.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

TABLE = ("iptables", "-w", "-t", "nat")
CUT = ("ss", "-K", "-t", "state", "established")
FORGET = ("conntrack", "-D", "-p", "tcp", "--orig-dst", "127.0.0.1")
TOOLS = ("iptables", "ss", "conntrack")


class KernelBalancer:
    """`Balancer`'s interface, served by NAT rules on loopback."""

    name = "kernel"

    def __init__(self) -> None:
        # Held bound (never listening) so that no other socket takes the port while the
        # rules route it: a connection the rules do not redirect is refused.
        self._reserved = socket.socket()
        self._reserved.bind(("127.0.0.1", 0))
        self.port: int = self._reserved.getsockname()[1]
        self.backends: list[int] = []
        self.chain = _chain(self.port)

    @staticmethod
    def available() -> bool:
        """Tell whether this machine lets the benchmark make NAT rules and cut and forget
        connections (root, iptables, ss and conntrack)."""
        return KernelBalancer.missing() is None

    @staticmethod
    def missing() -> str | None:
        """Say what this machine lacks for the balancer in the kernel; None: nothing."""
        if os.geteuid() != 0:
            return "root"
        for tool in TOOLS:
            if shutil.which(tool) is None:
                return tool
        probe = subprocess.run([*TABLE, "-L", "OUTPUT", "-n"], capture_output=True, check=False)
        return None if probe.returncode == 0 else "the nat table of iptables"

    def start(self) -> None:
        """Make the balancer's chain, and send connections to its port through it; leave
        nothing behind if that fails."""
        try:
            _iptables("-N", self.chain)
            _iptables("-A", *_jump(self.port))
        except BaseException:
            self._remove()
            raise

    def route_to(self, ports: list[int]) -> None:
        """Send new connections to these ports, evenly at random; cut the open ones to a
        port that left the route (their clients dial again, and are routed anew)."""
        removed = set(self.backends) - set(ports)
        _iptables("-F", self.chain)
        for index, port in enumerate(ports):
            # Each rule takes its share of what the rules before it left: 1/n, 1/(n-1)...
            left = len(ports) - index
            random = ("-m", "statistic", "--mode", "random", "--probability", f"{1 / left:.8f}")
            chance = random if left > 1 else ()
            _iptables(
                "-A", self.chain, "-p", "tcp", *chance, "-j", "REDIRECT", "--to-ports", str(port)
            )
        self.backends = list(ports)
        for port in sorted(removed):
            # The replica's end of each: the apiserver gets a reset, and dials again.
            subprocess.run(
                [*CUT, "src", "127.0.0.1", "sport", "=", f":{port}"],
                check=True,
                capture_output=True,
            )
            # And the kernel forgets where it sent them: a new connection that reuses one's
            # addresses would otherwise be sent to the old port. (None found: exit 1.)
            subprocess.run(
                [*FORGET, "--orig-port-dst", str(self.port), "--reply-port-src", str(port)],
                check=False,
                capture_output=True,
            )

    def stop(self) -> None:
        """Cut every connection, and remove the rules."""
        try:
            self.route_to([])
        finally:
            self._remove()

    def _remove(self) -> None:
        _remove_chain(self.port)
        self._reserved.close()


def remove_stale_chains() -> None:
    """Remove the chains of balancers whose benchmark ended without removing them (killed):
    their port is free again, so nothing of theirs is still routed."""
    listed = subprocess.run([*TABLE, "-S"], capture_output=True, text=True, check=False).stdout
    for port in sorted(set(re.findall(r"^-N GPUADM-BENCH-(\d+)$", listed, re.MULTILINE))):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", int(port)))
            except OSError:
                continue  # still held by a running benchmark
        _remove_chain(int(port))


def _chain(port: int) -> str:
    return f"GPUADM-BENCH-{port}"


def _jump(port: int) -> tuple[str, ...]:
    """The rule that sends connections to the balancer's port through its chain."""
    return ("OUTPUT", "-p", "tcp", "-d", "127.0.0.1", "--dport", str(port), "-j", _chain(port))


def _remove_chain(port: int) -> None:
    """Remove a balancer's rules, whatever of them is there."""
    for args in (("-D", *_jump(port)), ("-F", _chain(port)), ("-X", _chain(port))):
        subprocess.run([*TABLE, *args], check=False, capture_output=True)


def _iptables(*args: str) -> None:
    done = subprocess.run([*TABLE, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"iptables {' '.join(args)}: {done.stderr.strip()}")
