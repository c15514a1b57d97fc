"""bench/ids: minting a ULID string, ``tidemesh.core.ids.new_ulid`` against python-ulid.

timeit, in one run, rounds interleaved: each way of minting an id as the accept path does
(with the clock's milliseconds, and with the time read inside), in bulk as the broker's B1
does (``new_ulids``), and the daemon's ordered row ids one at a time (python-ulid's monotonic
generator, ``ordered_ulid``) and a batch's at once (``ordered_ulids``). ``--file`` adds
another version of core/ids.py (``git show REV:core/ids.py > old_ids.py``) as the peer.
Prints the best of the rounds in ns per id and each one's ratio to python-ulid's
``str(ULID())``.

    .venv/bin/python bench/ids.py [--number 200000] [--rounds 7] [--file old_ids.py]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import timeit
from collections.abc import Callable
from typing import Any

from ulid import ULID, LaxMonotonicPolicy, ULIDGenerator

from tidemesh.core import ids

# The broker mints a B1 slice's ids in one call: two per send, 32 sends a slice.
BULK = 64
# The daemon mints a send_batch's row ids in one call (100 in bench/accept).
BATCH = 100
_MONOTONIC = ULIDGenerator(policy=LaxMonotonicPolicy())


def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("bench_ids_from_file", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--file", help="another core/ids.py, measured as 'file'")
    args = ap.parse_args()

    now = int(time.time() * 1000)
    # name -> (a call, the ids it mints)
    cases: dict[str, tuple[Callable[[], object], int]] = {
        "python-ulid str(ULID())": (lambda: str(ULID()), 1),
        "python-ulid str(ULID.from_timestamp(ms))": (lambda: str(ULID.from_timestamp(now)), 1),
        "new_ulid()": (ids.new_ulid, 1),
        "new_ulid(now_ms)": (lambda: ids.new_ulid(now), 1),
        f"new_ulids({BULK}, now_ms), per id": (lambda: ids.new_ulids(BULK, now), BULK),
        # The daemon's outbox rows: counting up within a millisecond, 100 a send_batch.
        "python-ulid monotonic generate(ms)": (lambda: str(_MONOTONIC.generate(now)), 1),
        "ordered_ulid(now_ms)": (lambda: ids.ordered_ulid(now), 1),
        f"ordered_ulids({BATCH}, now_ms), per id": (lambda: ids.ordered_ulids(BATCH, now), BATCH),
    }
    if args.file:
        old = _load(args.file)
        cases["file new_ulid()"] = (old.new_ulid, 1)
        cases["file new_ulid(now_ms)"] = (lambda: old.new_ulid(now), 1)
        if hasattr(old, "new_ulids"):
            cases[f"file new_ulids({BULK}, now_ms), per id"] = (
                lambda: old.new_ulids(BULK, now), BULK)
    best = {name: float("inf") for name in cases}
    for _ in range(args.rounds):
        for name, (fn, per_call) in cases.items():
            calls = max(1, args.number // per_call)
            took = timeit.timeit(fn, number=calls)
            best[name] = min(best[name], took / (calls * per_call) * 1e9)
    base = best["python-ulid str(ULID())"]
    print(f"best of {args.rounds} rounds x {args.number:,} ids, ns per id")
    for name, ns in best.items():
        print(f"  {name:42} {ns:8.0f} ns  {ns / base:5.2f}x")


if __name__ == "__main__":
    main()
