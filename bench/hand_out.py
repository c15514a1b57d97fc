"""bench/hand_out: the hand-out decision's CPU per member (``broker/topiclog.py``), the
one-topic path beside the general merge, for a lone message and a run of 32.

    .venv/bin/python bench/hand_out.py
"""

from __future__ import annotations

import timeit

from tidemesh.broker.topiclog import Entry, Lag, _merged, hand_out


def main() -> None:
    for n in (1, 32):
        lags = [Lag("all", 100, 100 + n)]
        entries = {"all": [Entry(100 + p, "sender", 1, 7 + p) for p in range(1, n + 1)]}
        for name, fn in (
                ("one topic", lambda lags=lags, entries=entries: hand_out(
                    "me", 500, 0, lags, entries)),
                ("merged", lambda lags=lags, entries=entries: _merged(
                    "me", 500, 0, lags, entries, ()))):
            runs = 20_000 if n == 1 else 2_000
            us = min(timeit.repeat(fn, number=runs, repeat=5)) / runs * 1e6
            print(f"{n:3d} position(s)  {name:10s} {us:7.2f} µs a member")


if __name__ == "__main__":
    main()
