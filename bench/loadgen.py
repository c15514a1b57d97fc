"""A closed-loop HTTP/1.1 load generator over a Unix socket: raw keep-alive connections, one
request in flight per connection, unique Idempotency-Key per request. Run as its own process
so the client's CPU does not share the server's event loop. With BATCH > 0 each request is a
POST /v1/send_batch of BATCH sends, each under its own client_message_id. With RATE > 0 the
load is open loop instead: requests start on a fixed schedule of RATE per second in all
(spread over the connections), whether or not earlier ones were answered quickly.

    python bench/loadgen.py SOCKET CONCURRENCY SECONDS WARMUP TAG [TOPIC [BATCH [RATE]]]
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


def body_for(topic: str) -> bytes:
    return (b'{"to":{"kind":"topic","ref":"' + topic.encode() + b'"},"body":"'
            + b"x" * 200 + b'","meta":{"n":1}}')


def _single(body: bytes, key: bytes) -> bytes:
    return (b"POST /v1/send HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
            b"application/json\r\nIdempotency-Key: " + key + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def _batch(body: bytes, key: bytes, size: int) -> bytes:
    # Each send is the single body with its own id spliced in before the closing brace.
    sends = b",".join(body[:-1] + b',"client_message_id":"' + key + b"." + str(j).encode()
                      + b'"}' for j in range(size))
    payload = b'{"sends":[' + sends + b"]}"
    return (b"POST /v1/send_batch HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
            b"application/json\r\nContent-Length: " + str(len(payload)).encode()
            + b"\r\n\r\n" + payload)


async def _conn_loop(path: str, prefix: str, body: bytes, stop_at: float, warm_until: float,
                     lat: list[float], counts: list[int], batch: int,
                     schedule: tuple[float, float] | None = None) -> None:
    """``schedule`` (first start, interval): this connection's share of an open-loop rate."""
    reader, writer = await asyncio.open_unix_connection(path)
    i = 0
    while True:
        if schedule is not None:
            due = schedule[0] + i * schedule[1]
            if due >= stop_at:
                break
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
        now = time.perf_counter()
        if now >= stop_at:
            break
        key = f"{prefix}-{i}".encode()
        i += 1
        writer.write(_batch(body, key, batch) if batch else _single(body, key))
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        answer = await reader.readexactly(length)
        done = time.perf_counter()
        # A batch is 200 with one result per send; a send counts when its result is 202.
        sent = answer.count(b'{"status":202') if batch else int(status in (200, 202))
        counts[2] += sent
        if now >= warm_until:
            lat.append(done - now)
            counts[0] += sent
            counts[1] += (batch or 1) - sent
            counts[3] += status in (200, 202)
    writer.close()


async def run(path: str, conc: int, seconds: float, warmup: float, tag: str,
              topic: str = "bench", batch: int = 0, rate: float = 0.0) -> dict[str, float]:
    lat: list[float] = []
    # After the warm-up: sends accepted, sends refused; sends accepted in all; requests answered
    # 2xx after the warm-up.
    counts = [0, 0, 0, 0]
    body = body_for(topic)
    start = time.perf_counter()
    warm_until, stop_at = start + warmup, start + warmup + seconds
    # Open loop: connection c starts requests c, c+conc, c+2·conc … of one schedule.
    def schedule(c: int) -> tuple[float, float] | None:
        return (start + c / rate, conc / rate) if rate > 0 else None

    await asyncio.gather(*(_conn_loop(path, f"{tag}-{c}", body, stop_at, warm_until, lat, counts,
                                      batch, schedule(c)) for c in range(conc)))
    lat.sort()
    return {"ok": counts[0], "errors": counts[1], "all_ok": counts[2],
            "rps": counts[3] / seconds, "mps": counts[0] / seconds,
            "p50_ms": 1000 * lat[len(lat) // 2] if lat else 0.0,
            "p99_ms": 1000 * lat[int(len(lat) * 0.99)] if lat else 0.0}


if __name__ == "__main__":
    import uvloop

    sock, conc, secs, warm, tag = sys.argv[1:6]
    topic = sys.argv[6] if len(sys.argv) > 6 else "bench"
    batch = int(sys.argv[7]) if len(sys.argv) > 7 else 0
    rate = float(sys.argv[8]) if len(sys.argv) > 8 else 0.0
    print(json.dumps(uvloop.run(run(sock, int(conc), float(secs), float(warm), tag, topic,
                                    batch, rate))))
