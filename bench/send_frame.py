"""bench/send_frame: the sender's CPU per row to turn claimed outbox rows into the frame text
it writes, from the bytes the outbox stored (``linkstate._spliced``) against parsing each
row and encoding the frame again (the sender before it kept the bytes, and still what it
does with tracing on).

In one process, rounds interleaved, ``time.process_time`` (so other load on the machine
does not count): for frames of ``--rows`` rows like bench/e2e's (a 200-byte body, one-key
meta, a traceparent) and of one row, ``LinkState.send_batch`` then the frame's encoding
(``link._send``), either way. Prints the best round in µs per row and the ratio.

    .venv/bin/python bench/send_frame.py [--rows 256] [--number 200] [--rounds 7]
"""

from __future__ import annotations

import argparse
import time
import timeit
from collections.abc import Callable

import orjson
from nacl.signing import SigningKey

from tidemesh.core import features
from tidemesh.core.send import Destination, Priority, SendRequest
from tidemesh.core.trace import new_traceparent
from tidemesh.core.wire import encode
from tidemesh.daemon.link.linkstate import LinkState, Phase, Send


def _machine() -> LinkState[None]:
    m: LinkState[None] = LinkState("01J0000000000000000000000A", SigningKey.generate(), 0.0)
    m.phase = Phase.READY
    m.supported = dict(features.advertise("retention_scoped", 7, 1 << 20))
    return m


def _wire(sent: Send) -> str:
    """What ``link._send`` writes."""
    return encode(sent.frame) if sent.wire is None else sent.wire.decode()


def _stored(n: int) -> list[tuple[str, bytes]]:
    return [(f"01JBENCH{i:018d}", orjson.dumps(SendRequest(
        Destination.parse("topic:bench"), b"x" * 200, "utf8", Priority.NEXT, {"n": 1}, None,
        None, traceparent=new_traceparent()).to_payload())) for i in range(n)]


def _ways(rows: list[tuple[str, bytes]]) -> dict[str, Callable[[], object]]:
    # The same frame either way (two machines, so the ids match too).
    assert (_wire(_machine().send_batch(list(rows), 0.0, None))
            == _wire(_machine().send_batch([(c, orjson.loads(p)) for c, p in rows], 0.0, None)))
    m = _machine()

    def spliced() -> str:
        out = _wire(m.send_batch(list(rows), 0.0, None))
        m.pending.clear()
        return out

    def parsed() -> str:
        out = _wire(m.send_batch([(c, orjson.loads(p)) for c, p in rows], 0.0, None))
        m.pending.clear()
        return out

    return {"stored bytes": spliced, "parsed again": parsed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--number", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    for size, number in ((args.rows, args.number), (1, args.number * args.rows)):
        ways = _ways(_stored(size))
        best = {name: float("inf") for name in ways}
        for _ in range(args.rounds):
            for name, fn in ways.items():
                t = timeit.timeit(fn, number=number, timer=time.process_time)
                best[name] = min(best[name], t / number / size * 1e6)
        base = best["parsed again"]
        print(f"frames of {size} row{'s' if size > 1 else ''}: "
              + ", ".join(f"{name} {us:.2f} µs/row ({us / base:.0%})"
                          for name, us in best.items()), flush=True)


if __name__ == "__main__":
    main()
