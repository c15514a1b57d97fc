"""``tidemesh`` with two probes for ``bench/members.py``, run by it when one is asked for:

* SIGUSR1: ``malloc_trim(0)`` (glibc hands its free pages back to the system), so that the
  RSS read next tells memory the C heap kept free from memory in use (``--trim-probe``);
* SIGUSR2, with BENCH_TRACEMALLOC=PREFIX (tracemalloc on from the start): a snapshot to
  PREFIX-K.snap (K = 1, 2, …); compare two with
  ``tracemalloc.Snapshot.load(b).compare_to(tracemalloc.Snapshot.load(a), "traceback")``.
  Tracing every allocation slows the process several times over.

A bench tool only. (gdb could not call into the process on this machine kind: "Couldn't
write extended state status".)"""

from __future__ import annotations

import ctypes
import itertools
import os
import signal
import sys
import tracemalloc
from types import FrameType

from tidemesh.cli.main import main

_stats = itertools.count(1)   # each probe numbers its own files
_snapshots = itertools.count(1)


def _trim(signum: int, frame: FrameType | None) -> None:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    stats = os.environ.get("BENCH_MALLOCSTATS")
    if stats:   # pymalloc's arenas and pools, as sys._debugmallocstats writes them (to fd 2)
        saved = os.dup(2)
        with open(f"{stats}-{next(_stats)}.txt", "w") as f:
            os.dup2(f.fileno(), 2)
            try:
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)


def _dump(signum: int, frame: FrameType | None) -> None:
    tracemalloc.take_snapshot().dump(f"{os.environ['BENCH_TRACEMALLOC']}-{next(_snapshots)}.snap")


if __name__ == "__main__":
    if os.environ.get("BENCH_TRACEMALLOC"):
        tracemalloc.start(10)
        signal.signal(signal.SIGUSR2, _dump)
    signal.signal(signal.SIGUSR1, _trim)
    sys.argv[0] = "tidemesh"
    main()
