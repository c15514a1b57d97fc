"""bench/otel_sink: an OTLP/HTTP traces receiver that counts what it is sent, for benching a
process with tracing on (``[metrics] otel_endpoint``) without a collector. Prints its URL
when ready and, on SIGTERM or SIGINT, the requests and spans it took. With ``--dump FILE`` it
also writes each span as a JSON line (name, service, ids, start and end in ns since the epoch),
which ``bench/latency.py --spans`` reads to split a message's path into its hops.

    .venv/bin/python bench/otel_sink.py [--port 4318] [--dump spans.jsonl] &
    TIDEMESH_METRICS_OTEL_ENDPOINT=http://127.0.0.1:4318 .venv/bin/python bench/accept.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

ANSWER = ExportTraceServiceResponse().SerializeToString()


def _span_lines(req: ExportTraceServiceRequest) -> list[bytes]:
    out = []
    for rs in req.resource_spans:
        service = next((a.value.string_value for a in rs.resource.attributes
                        if a.key == "service.name"), "")
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out.append(json.dumps({
                    "name": sp.name, "service": service, "trace_id": sp.trace_id.hex(),
                    "span_id": sp.span_id.hex(), "parent_span_id": sp.parent_span_id.hex(),
                    "start_ns": sp.start_time_unix_nano, "end_ns": sp.end_time_unix_nano,
                    "links": len(sp.links)}).encode() + b"\n")
    return out


async def serve(port: int, dump: str | None) -> None:
    counts = {"requests": 0, "spans": 0, "bytes": 0}
    sink = open(dump, "ab") if dump else None  # noqa: SIM115 - open for the whole run

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        counts["requests"] += 1
        counts["bytes"] += len(body)
        counts["spans"] += sum(len(ss.spans) for rs in req.resource_spans
                               for ss in rs.scope_spans)
        if sink is not None:
            sink.writelines(_span_lines(req))
            sink.flush()
        return web.Response(body=ANSWER, content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(json.dumps({"url": f"http://127.0.0.1:{runner.addresses[0][1]}"}), flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    if sink is not None:
        sink.close()
    print(json.dumps(counts), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=4318)
    ap.add_argument("--dump", help="write each span to this file as a JSON line")
    args = ap.parse_args()
    asyncio.run(serve(args.port, args.dump))


if __name__ == "__main__":
    main()
