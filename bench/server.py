"""The servers under test, each run as its own process: gpuadm, and the bare ceiling.

`python -m bench.server gpuadm|bare PORT CERT KEY [CPU]`
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import orjson
from aiohttp import web

from certs import server_ssl_context
from tests.builders import POLICY_YAML
from webhook.config.snapshot import ConfigHolder, snapshot_from_text
from webhook.observe.audit_log import AuditLog
from webhook.quota.ledger import QuotaLedger
from webhook.quota.reservations import MemoryStore
from webhook.quota.usage import UsageIndex
from webhook.server.app import create_app
from webhook.server.settings import Settings


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


def gpuadm_app(audit_file: str | None = None) -> web.Application:
    """gpuadm as `gpuadm serve` builds it standalone, audit log included (no quota limits in
    the bench namespace: judgement is measured on its own)."""
    snapshot = snapshot_from_text(POLICY_YAML, "", policy_source="p", quotas_source="q")
    ledger = QuotaLedger(UsageIndex(), MemoryStore(), pods_visible=False)
    audit = AuditLog(audit_file) if audit_file else None
    return create_app(Settings(), ConfigHolder(snapshot), quota=ledger, audit=audit)


def main() -> None:
    kind, port, cert, key = sys.argv[1:5]
    if len(sys.argv) > 5 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(sys.argv[5])})
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    app = gpuadm_app(str(Path(cert).parent / "audit.log")) if kind == "gpuadm" else bare_app()
    context = server_ssl_context(Path(cert), Path(key))
    web.run_app(
        app, host="127.0.0.1", port=int(port), ssl_context=context, print=None, access_log=None
    )


if __name__ == "__main__":
    main()
