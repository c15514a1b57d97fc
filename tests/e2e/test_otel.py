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

from tests.daemon.harness import RunningDaemon
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
    links: tuple[str, ...]   # the traceparents (flags left out) of the spans it links to


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
                           {a.key: _value(a.value) for a in s.attributes},
                           tuple(f"00-{k.trace_id.hex()}-{k.span_id.hex()}" for k in s.links))


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

    by_name = await _chain(spans, TRACE_ID)
    chain = [by_name[h] for h in HOPS]
    assert chain[0].parent_id == CLIENT[36:52]
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

    # A send that names no trace: its daemon's accept span starts one, and the chain follows.
    async with a.session() as s, s.post("/v1/send", json={"to": "topic:ops", "body": "two"}) as r:
        assert r.status == 202, await r.text()
    await wait_for(lambda: _count(b, 2))
    made = next(m for m in await inbox(b) if m["body"] == "two")["traceparent"]
    second = await _chain(spans, made[3:35])
    assert second["tidemesh.daemon.accept"].parent_id == ""

    # A batch is one accept span, a root linked to each of its sends' traces.
    traces = ["00-" + c * 32 + "-" + c * 16 + "-01" for c in "ab"]
    async with a.session() as s, s.post("/v1/send_batch", json={"sends": [
            {"to": "topic:ops", "body": f"batch {i}", "traceparent": t}
            for i, t in enumerate(traces)]}) as r:
        assert r.status == 200, await r.text()

    def batch_accept() -> Span | None:
        return next((s for s in spans if s.name == "tidemesh.daemon.accept"
                     and s.attributes.get("tidemesh.batch_size") == 2), None)

    await wait_for(lambda: batch_accept() is not None)
    span = batch_accept()
    assert span is not None and span.parent_id == ""
    assert span.trace_id not in (traces[0][3:35], traces[1][3:35])
    assert span.links == tuple(t[:-3] for t in traces)


async def _count(d: RunningDaemon, n: int) -> bool:
    return len(await inbox(d)) >= n


async def _chain(spans: list[Span], trace_id: str) -> dict[str, Span]:
    """The six hops of one message's trace, once all are exported, checked to be one causal
    chain: each a child of the one before, started after it."""
    def traced() -> dict[str, Span]:
        return {s.name: s for s in spans if s.trace_id == trace_id}

    await wait_for(lambda: set(HOPS) <= set(traced()))
    by_name = traced()
    for parent, child in itertools.pairwise(by_name[h] for h in HOPS):
        assert child.parent_id == parent.span_id, (parent.name, child.name)
        assert child.start_ns >= parent.start_ns, (parent.name, child.name)
    return by_name
