"""Giving the C heap's free pages back to the system after a burst.

A burst to many members makes many short-lived objects at once (each pump's page, its frames,
the records it was read from); freed, their memory stays with the process: glibc keeps the
pages on its free lists and pymalloc keeps arenas that a few longer-lived objects still use.
``malloc_trim(0)`` returns glibc's share (bench/members.py, N=1,000, a 200-message burst:
RSS +25 % after the burst, +8 % after a trim; docs/broker.md, "Many members"). It costs a few
milliseconds and is pointless while the burst lasts (the memory is reused), so it runs once
the work that made the garbage has gone quiet: ``TrimPolicy`` decides (pure), ``trim`` acts.
Where the C library has no ``malloc_trim`` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class TrimPolicy:
    """Fed a running total of work (deliveries sent) at each check: due once at least
    ``threshold`` was done since the last trim and at most ``quiet`` since the last check."""

    threshold: int = 10_000
    quiet: int = 1_000
    busy: int = 0
    last: int = 0

    def due(self, total: int) -> bool:
        done, self.last = total - self.last, total
        self.busy += done
        if done <= self.quiet and self.busy >= self.threshold:
            self.busy = 0
            return True
        return False


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        fn: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return fn


_TRIM = _malloc_trim()


def trim() -> bool | None:
    """Hand the heap's free pages back; True if any was, None where there is no
    ``malloc_trim``."""
    return None if _TRIM is None else bool(_TRIM(0))
