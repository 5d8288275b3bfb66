"""The benchmark's kernel balancer (`bench.kernel`), on this machine's own NAT rules: it
spreads new connections over its ports, cuts those open to a port that leaves the route
(and only those), and leaves no rule behind."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from bench.kernel import TABLE, KernelBalancer

pytestmark = pytest.mark.skipif(
    KernelBalancer.missing() is not None,
    reason=f"the balancer in the kernel needs {KernelBalancer.missing()} (make node installs it)",
)


class SaysItsPort(socketserver.BaseRequestHandler):
    """Answer each connection with the server's port, then hold it open until cut."""

    def handle(self) -> None:
        port = self.request.getsockname()[1]  # the server's own, past the NAT
        self.request.sendall(f"{port}\n".encode())
        with contextlib.suppress(ConnectionResetError, ConnectionAbortedError):  # cut
            self.request.recv(1)


class Servers(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def servers() -> Iterator[list[int]]:
    started = [Servers(("127.0.0.1", 0), SaysItsPort) for _ in range(3)]
    for server in started:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield [server.server_address[1] for server in started]
    for server in started:
        server.shutdown()
        server.server_close()


def connect(port: int) -> tuple[socket.socket, int]:
    """Connect to the balancer; return the connection and the port that answered."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=5)
    return connection, int(connection.makefile().readline())


def test_spreads_connections_cuts_them_when_a_port_leaves_and_cleans_up(
    servers: list[int],
) -> None:
    balancer = KernelBalancer()
    balancer.start()
    try:
        balancer.route_to(servers)
        reached: Counter[int] = Counter()
        for _ in range(60):
            connection, port = connect(balancer.port)
            reached[port] += 1
            connection.close()
        assert set(reached) == set(servers)
        assert min(reached.values()) >= 5, reached  # 1/3 each, at random

        held = [connect(balancer.port) for _ in range(30)]
        balancer.route_to(servers[:1])
        for connection, port in held:
            if port == servers[0]:  # still routed: left open
                connection.settimeout(0.2)
                with pytest.raises(TimeoutError):
                    connection.recv(1)
            else:  # its port left the route: reset, as the apiserver sees it
                with pytest.raises(ConnectionResetError):
                    connection.recv(1)
            connection.close()
        assert {port for _, port in held} == set(servers)
        later = [connect(balancer.port) for _ in range(10)]
        assert {port for _, port in later} == {servers[0]}
        for connection, _ in later:
            connection.close()

        balancer.route_to([])
        with pytest.raises(ConnectionRefusedError):
            connect(balancer.port)
    finally:
        balancer.stop()
    listed = subprocess.run([*TABLE, "-S"], capture_output=True, text=True, check=True).stdout
    assert balancer.chain not in listed
