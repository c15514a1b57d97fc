"""OpenTelemetry export end to end: one message through a real sender daemon, broker and
recipient daemon with a hook is one trace, its spans exported over OTLP/HTTP by the three
processes to a receiver in this test, each hop a child of the one before."""

from __future__ import annotations

import gzip
import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.e2e.harness import Broker, Mesh, connected, inbox, sqlite_broker_with_team, wait_for
from tests.e2e.test_hooks import add_with_hooks

pytestmark = pytest.mark.slow

CLIENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE_ID = CLIENT[3:35]
HOPS = ("tidemesh.daemon.accept", "tidemesh.daemon.send", "tidemesh.broker.accept",
        "tidemesh.broker.deliver", "tidemesh.daemon.store", "tidemesh.daemon.hook")


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    service: str
    pid: int
    attributes: dict[str, Any]


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value"))


def _spans(body: bytes) -> Iterator[Span]:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    for rs in req.resource_spans:
        res = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield Span(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                           s.start_time_unix_nano, res["service.name"], res["process.pid"],
                           {a.key: _value(a.value) for a in s.attributes})


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[str, list[Span]]]:
    """An OTLP/HTTP traces receiver on a free loopback port: its URL and the spans so far."""
    got: list[Span] = []

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        got.extend(_spans(body))
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", got
    finally:
        await runner.cleanup()


@pytest.fixture
def traced_mesh(receiver: tuple[str, list[Span]], short_tmp: Path) -> Iterator[Mesh]:
    broker: Broker = sqlite_broker_with_team(short_tmp)
    broker.env = {"TIDEMESH_METRICS_OTEL_ENDPOINT": receiver[0],
                  "TIDEMESH_METRICS_OTEL_EXPORT_DELAY_MS": "50"}
    broker.start()
    mesh = Mesh(broker, "team")
    try:
        yield mesh
    finally:
        mesh.stop()


async def test_one_message_is_one_trace_across_three_processes(
    traced_mesh: Mesh, receiver: tuple[str, list[Span]], short_tmp: Path
) -> None:
    env, spans = traced_mesh.broker.env, receiver[1]
    env_log = short_tmp / "env.log"
    hook = f'#!/bin/sh\necho "${{TRACEPARENT:-none}}" >> {env_log}\n'
    a = traced_mesh.add("a", short_tmp, env)
    b = add_with_hooks(traced_mesh, "b", short_tmp, {"on-topic-ops": hook}, "[on-topic-ops]\n",
                       env)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    async with b.session() as s, s.post("/v1/topics/subscribe",
                                        json={"name": "ops", "create": True}) as r:
        assert r.status == 200, await r.text()

    async with a.session() as s, s.post("/v1/send", json={
            "to": "topic:ops", "body": "secret body", "client_message_id": "c1"},
            headers={"traceparent": CLIENT}) as r:
        assert r.status == 202, await r.text()

    def traced() -> dict[str, Span]:
        return {s.name: s for s in spans if s.trace_id == TRACE_ID}

    await wait_for(lambda: set(HOPS) <= set(traced()))
    by_name = traced()
    chain = [by_name[h] for h in HOPS]
    # Causal order: each hop is the child of the one before, the first of the caller's span.
    assert chain[0].parent_id == CLIENT[36:52]
    for parent, child in itertools.pairwise(chain):
        assert child.parent_id == parent.span_id, (parent.name, child.name)
        assert child.start_ns >= parent.start_ns, (parent.name, child.name)
    # Three processes: the sender's daemon, the broker, the recipient's daemon.
    assert [(s.service, s.pid) for s in chain] == [
        ("tidemesh-daemon", a.proc.pid), ("tidemesh-daemon", a.proc.pid),
        ("tidemesh-broker", traced_mesh.broker.proc.pid),
        ("tidemesh-broker", traced_mesh.broker.proc.pid),
        ("tidemesh-daemon", b.proc.pid), ("tidemesh-daemon", b.proc.pid)]
    # What the recipient sees names the store span; the hook's TRACEPARENT names its run.
    (item,) = await inbox(b)
    assert item["traceparent"] == f"00-{TRACE_ID}-{by_name['tidemesh.daemon.store'].span_id}-01"
    assert env_log.read_text().split() == [f"00-{TRACE_ID}-{chain[-1].span_id}-01"]
    broker_accept = by_name["tidemesh.broker.accept"].attributes
    assert broker_accept["tidemesh.client_message_id"] == "c1"
    assert broker_accept["tidemesh.broker_message_id"] == item["broker_message_id"]
    assert all("secret body" not in str(s.attributes) for s in spans)
