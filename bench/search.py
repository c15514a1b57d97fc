"""bench/search: inbox search over a million entries, and what the index costs the receive path.

Fills one inbox.db with N entries through the store's own batch op (``inbox.store_frame``,
straight into the file, no broker), text bodies of ~12 words drawn from a 50,000-word Zipf
vocabulary, with the search index on. Then:

* search latency: the page query as GET /v1/inbox?q= runs it (``search.page``, limit 100, on
  a read-only connection with the daemon's PRAGMAs), per query kind, p50/p99/max in ms;
* rebuild: the whole index again from the inbox (a start with the setting turned on);
* receive rate: frames stored as the receiver stores them (``store_frame``, one transaction
  each), with the index on and off in interleaved rounds on the same file (off: the flag the
  triggers read is cleared for that round only), in deliveries/s.

    .venv/bin/python bench/search.py [--rows 1000000] [--queries 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tidemesh.daemon.records import Page
from tidemesh.daemon.store import inbox, search
from tidemesh.daemon.store.db import INBOX_MIGRATIONS
from tidemesh.storage.sqlite import connect

VOCAB = 50_000
WORDS_PER_BODY = 12
TOPICS = [f"t{i}" for i in range(10)]
SENDER = "ab" * 32
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "xe", "zu", "ba", "do", "fe",
             "gi", "ho", "ju"]


def _vocabulary(rng: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < VOCAB:
        words.add("".join(rng.choices(SYLLABLES, k=rng.randint(2, 5))))
    return sorted(words, key=lambda w: rng.random())   # rank 0 is the most frequent


class Bodies:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.words = _vocabulary(rng)
        self.cum = list(itertools.accumulate(1 / (r + 1) for r in range(VOCAB)))

    def make(self) -> str:
        return " ".join(self.rng.choices(self.words, cum_weights=self.cum, k=WORDS_PER_BODY))


def _deliveries(bodies: Bodies, start: int, n: int, now: int) -> list[inbox.Delivery]:
    return [inbox.Delivery(
        id=f"e{i}", mesh="bench", sender_pubkey=SENDER, sender_name="bench",
        client_message_id=f"c{i}", broker_message_id=f"b{i}", dest_kind="topic",
        dest_ref=TOPICS[i % len(TOPICS)], body=bodies.make().encode(), body_encoding="utf8",
        priority="next", meta=None, reply_to=None, epoch=1, seq=i, sent_at=now,
        received_at=now) for i in range(start, start + n)]


def _fill(path: Path, bodies: Bodies, rows: int) -> float:
    conn = connect(path)
    INBOX_MIGRATIONS.apply_sqlite(conn)
    conn.execute("BEGIN IMMEDIATE")
    search.configure(conn, True, 0)
    conn.execute("COMMIT")
    started, now = time.perf_counter(), int(time.time() * 1000)
    for base in range(1, rows + 1, 10_000):   # 20 frames of 500 a transaction
        conn.execute("BEGIN IMMEDIATE")
        for f in range(base, min(base + 10_000, rows + 1), 500):
            inbox.store_frame(conn, _deliveries(bodies, f, min(500, rows + 1 - f), now))
        conn.execute("COMMIT")
        print(f"\r  filled {min(base + 9_999, rows):,} / {rows:,}", end="", file=sys.stderr)
    print(file=sys.stderr)
    conn.close()
    return time.perf_counter() - started


def _queries(bodies: Bodies, rng: random.Random, rows: int) -> dict[str, Callable[[], Page]]:
    w = bodies.words

    def phrase() -> Page:
        text = bodies.make().split()
        i = rng.randrange(len(text) - 1)
        return Page(q=f'"{text[i]} {text[i + 1]}"')

    return {
        "rare word": lambda: Page(q=w[rng.randrange(1000, VOCAB)]),
        "mid word": lambda: Page(q=w[rng.randrange(20, 1000)]),
        "common word": lambda: Page(q=w[rng.randrange(20)]),
        "common word, deep page": lambda: Page(after=rng.randrange(rows), q=w[rng.randrange(20)]),
        "common word, one topic": lambda: Page(topic=rng.choice(TOPICS), q=w[rng.randrange(20)]),
        # The worst case: every match is read and joined, and none is kept.
        "common word, no such sender": lambda: Page(sender="cd" * 32, q=w[rng.randrange(20)]),
        "two mid words AND": lambda: Page(q=f"{w[rng.randrange(20, 1000)]} "
                                            f"{w[rng.randrange(20, 1000)]}"),
        "common OR rare": lambda: Page(q=f"{w[rng.randrange(20)]} OR "
                                         f"{w[rng.randrange(1000, VOCAB)]}"),
        "phrase": phrase,
        "prefix": lambda: Page(q=w[rng.randrange(20, 5000)][:4] + "*"),
        "no match": lambda: Page(q="zzzqqq"),
    }


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def _search(path: Path, kinds: dict[str, Callable[[], Page]], n: int) -> None:
    conn = connect(path, readonly=True)
    every: list[float] = []
    print(f"\nsearch, limit 100 ({n} queries per kind), ms:")
    print(f"  {'kind':<28} {'p50':>7} {'p99':>7} {'max':>7} {'rows/q':>7}")
    for name, make in kinds.items():
        took, found = [], 0
        for _ in range(n):
            p = make()
            t = time.perf_counter()
            found += len(search.page(conn, p))
            took.append((time.perf_counter() - t) * 1000)
        every += took
        print(f"  {name:<28} {_pct(took, 50):7.2f} {_pct(took, 99):7.2f} {max(took):7.2f}"
              f" {found / n:7.1f}")
    print(f"  {'all kinds':<28} {_pct(every, 50):7.2f} {_pct(every, 99):7.2f}"
          f" {max(every):7.2f}")
    conn.close()


def _receive(path: Path, bodies: Bodies, start: int, rounds: int) -> None:
    conn = connect(path)
    seq = start
    rates: dict[tuple[int, bool], list[float]] = {}
    for _, frame, on in itertools.product(range(rounds), (1, 50), (True, False)):
        conn.execute("UPDATE inbox_meta SET value = ? WHERE key = 'fts_enabled'", (int(on),))
        frames, now = 2000 // frame, int(time.time() * 1000)   # 2,000 deliveries a round
        batches = [_deliveries(bodies, seq + i * frame, frame, now) for i in range(frames)]
        seq += frames * frame
        t = time.perf_counter()
        for b in batches:
            conn.execute("BEGIN IMMEDIATE")
            inbox.store_frame(conn, b)
            conn.execute("COMMIT")
        rates.setdefault((frame, on), []).append(frames * frame / (time.perf_counter() - t))
    conn.execute("UPDATE inbox_meta SET value = 1 WHERE key = 'fts_enabled'")
    conn.close()
    print(f"\nreceive (store_frame, one transaction a frame; median of {rounds} interleaved"
          " rounds), deliveries/s:")
    for frame in (1, 50):
        on, off = (statistics.median(rates[(frame, x)]) for x in (True, False))
        print(f"  frames of {frame:>2}: index on {on:9,.0f}   off {off:9,.0f}"
              f"   on/off {on / off:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where inbox.db goes (default tmp)")
    args = ap.parse_args()
    rng = random.Random(7)
    bodies = Bodies(rng)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "inbox.db"
        took = _fill(path, bodies, args.rows)
        size = sum(f.stat().st_size for f in Path(tmp).iterdir()) / 2**20
        conn = connect(path, readonly=True)
        index = conn.execute("SELECT SUM(pgsize) FROM dbstat WHERE name LIKE 'inbox_fts%'"
                             ).fetchone()[0] if _has_dbstat(conn) else None
        conn.close()
        print(f"filled {args.rows:,} entries in {took:.0f} s; inbox.db {size:,.0f} MiB"
              + (f", of which the index {index / 2**20:,.0f} MiB" if index else ""))
        _search(path, _queries(bodies, rng, args.rows), args.queries)
        _receive(path, bodies, args.rows + 1, args.rounds)
        _rebuild(path)


def _rebuild(path: Path) -> None:
    """What turning the setting on (or ``recover``) costs at start: the whole index again."""
    conn = connect(path)
    t = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    search.rebuild(conn)
    conn.execute("COMMIT")
    print(f"\nrebuild of the whole index: {time.perf_counter() - t:.1f} s")
    conn.close()


def _has_dbstat(conn: object) -> bool:
    try:
        conn.execute("SELECT 1 FROM dbstat LIMIT 1")  # type: ignore[attr-defined]
        return True
    except Exception:   # SQLite built without SQLITE_ENABLE_DBSTAT_VTAB
        return False


if __name__ == "__main__":
    main()
