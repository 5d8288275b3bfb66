"""Fuzzing below the review: encodings, truncated and oversized bodies, and config files with
odd keys, each met with a 4xx, a clean hang-up or a `ConfigError`, never a 5xx, a traceback
or another exception. Cases come from a fixed seed, so every run tries the same ones.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies import load_policy
from policies.loading import ConfigError, load_quotas
from tests.builders import pod, review
from tests.webhook.server.test_budget import Served, served
from tests.webhook.server.test_server import snapshot
from webhook.config.snapshot import ConfigHolder
from webhook.server.app import create_app
from webhook.server.budget import RequestBudget
from webhook.server.settings import Settings

FUZZ = settings(
    max_examples=300,
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
REVIEW = orjson.dumps(review(pod({"gpuadm.io/h100": "1"}), uid="fuzz"))
ENCODINGS = ["gzip", "deflate", "br", "zstd", "identity", "", "GZIP", "x-gzip", "gzip, br", "*"]


def _encoded(encoding: str, body: bytes) -> bytes:
    if encoding.lower() in ("gzip", "x-gzip"):
        return gzip.compress(body)
    if encoding == "deflate":
        return zlib.compress(body)
    return body


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bytes, int | None]:
    """An encoding header, the bytes sent, and the length announced (None: the real one)."""
    encoding = draw(st.sampled_from(ENCODINGS))
    payload = draw(st.sampled_from([REVIEW, b"", b"{", b"\x1f\x8b\x08\x00garbage"]))
    if draw(st.booleans()):
        payload = _encoded(encoding, payload)
    cut = draw(st.integers(min_value=0, max_value=len(payload)))
    announced = draw(st.sampled_from([None, len(payload) + 1_000, 2**40]))
    return encoding, payload[:cut] if announced is not None else payload, announced


@pytest.fixture
async def server() -> AsyncIterator[Served]:
    budget = RequestBudget(read_seconds=0.2)
    async with served(create_app(Settings(), ConfigHolder(snapshot()), budget=budget)) as running:
        yield running


async def _raw_post(port: int, encoding: str, sent: bytes, announced: int | None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    length = len(sent) if announced is None else announced
    head = "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if encoding:
        head += f"Content-Encoding: {encoding}\r\n"
    head += f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
    writer.write(head.encode() + sent)
    await writer.drain()
    if announced is not None and len(sent) % 2:
        writer.transport.abort()  # the caller hangs up mid-body
        return b""
    try:
        # The answer's head and body; the connection may stay open a while after it, as
        # aiohttp lingers to read what is left of a body it refused unread.
        head_read = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
    except asyncio.IncompleteReadError as closed:
        head_read = closed.partial
    length = 0
    for line in head_read.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    answer = head_read + await asyncio.wait_for(reader.readexactly(length), timeout=10)
    writer.close()
    return answer


@FUZZ
@given(case=bodies())
async def test_every_body_gets_a_clean_answer_or_a_clean_hang_up(
    server: Served, caplog: pytest.LogCaptureFixture, case: tuple[str, bytes, int | None]
) -> None:
    caplog.clear()
    answer = await _raw_post(server.port, *case)
    if answer:
        status = int(answer.split(b" ", 2)[1])
        assert status < 500 or status == 503, answer[:200]
        if status == 200:
            assert b'"uid":"fuzz"' in answer
        elif status >= 400:
            assert b'"error":"' in answer or status in (400, 413), answer[:200]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == [], [r.getMessage() for r in errors]


# Keys and values of every YAML type, nested: what a careless edit can put in a config file.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["a100", "t4", "*", "mode", "namespaces", "default", "queue", "1.5Gi"]),
)
KEYS = st.one_of(SCALARS, st.tuples(st.integers(), st.text(max_size=3)))
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=30,
)
FIELDS = st.sampled_from(["namespaces", "default", "classes", "guard", "mode", None])


def _document(field: str | None, value: Any) -> str:
    data = value if field is None else {field: value}
    return yaml.dump(data, Dumper=yaml.Dumper)


@settings(max_examples=500, derandomize=True, deadline=None, database=None)
@given(field=FIELDS, value=DOCUMENTS)
def test_config_files_with_odd_keys_are_config_errors(field: str | None, value: Any) -> None:
    text = _document(field, value)
    for load in (load_quotas, load_policy):
        try:
            load(text)
        except ConfigError as error:
            problem = str(error)
        else:
            continue
        assert problem, "a refusal names its reason"
