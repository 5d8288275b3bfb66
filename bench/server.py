"""The two servers under test, each in its own process: gpuadm, and the bare ceiling.

gpuadm is `gpuadm serve` standalone, as `tests.support.ServeProcess` starts it: the example
test policy, no quota limits (judgement is measured on its own, in bench.quota), and its
audit records on stdout. The bare ceiling is this module run as
`python -m bench.server PORT CERT KEY`: an aiohttp handler that decodes the review and allows
it, with no patch. It is also the webhook that does nothing in the apiserver figures. Both
run on the CPUs they inherit, which the caller pins.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiohttp import web

from certs import server_ssl_context
from tests.builders import POLICY_YAML
from tests.e2e.gpuadm import make_tls
from tests.support import ROOT, ServeProcess, free_port, wait_until_listening


@dataclass(frozen=True)
class Served:
    """A server under test: where it listens, and the CA that signed its certificate; with
    several processes, `url` is the first's and `ports` are all of theirs."""

    url: str
    ca_file: Path
    ports: tuple[int, ...] = ()


@contextlib.contextmanager
def serving_gpuadm(workdir: Path) -> Iterator[Served]:
    """Run `gpuadm serve` standalone in `workdir` until the block ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy, quotas = workdir / "policy.yaml", workdir / "quotas.yaml"
    policy.write_text(POLICY_YAML)
    quotas.write_text("namespaces: {}\n")  # no quotas: an empty file is a broken config
    server = ServeProcess(workdir, policy, quotas)
    try:
        yield Served(f"https://127.0.0.1:{server.port}", server.tls_dir / "ca.crt")
    finally:
        server.stop()


@contextlib.contextmanager
def serving_bare(workdir: Path, *, processes: int = 1) -> Iterator[Served]:
    """Run the bare handler in `workdir`, in `processes` processes that serve one certificate,
    until the block ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    tls = make_tls(workdir / "tls")
    started: list[tuple[subprocess.Popen[bytes], int]] = []
    try:
        for index in range(processes):
            port = free_port()
            log_path = workdir / f"bare-{index}.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.server",
                        str(port),
                        str(tls.cert_file),
                        str(tls.key_file),
                    ],
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            started.append((process, port))
            wait_until_listening(process, port, log_path.read_text)
        ports = tuple(port for _, port in started)
        yield Served(f"https://127.0.0.1:{ports[0]}", tls.ca_file, ports)
    finally:
        for process, _ in started:
            process.terminate()
        for process, _ in started:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def bare_app() -> web.Application:
    """Decode the review and answer "allowed": what any webhook on aiohttp must at least do."""

    async def allow(request: web.Request) -> web.Response:
        review = orjson.loads(await request.read())
        answer = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": review["request"]["uid"], "allowed": True},
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    app = web.Application()
    app.router.add_post("/mutate", allow)
    app.router.add_post("/validate", allow)
    return app


def main() -> None:
    """Serve the bare handler over TLS, on uvloop as `gpuadm serve` does."""
    port, cert, key = sys.argv[1:4]
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    context = server_ssl_context(Path(cert), Path(key))
    web.run_app(
        bare_app(),
        host="127.0.0.1",
        port=int(port),
        ssl_context=context,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
