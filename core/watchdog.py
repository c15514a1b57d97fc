"""A watchdog that shows where a stuck event loop stands, for the daemon and the broker.

The loop beats (a callback every ``interval``); a thread of its own looks at the last beat.
When the loop has not turned for ``stall_s`` the thread logs every thread's stack once for
that stall and counts it; past ``exit_after_s`` it exits the process with its own code, so
that the service manager restarts it (every commit is atomic: nothing accepted is lost).
The same thread enforces a stop deadline (``arm_deadline``): a process asked to stop that is
still here when it passes logs what every thread was doing and exits anyway, whatever its
loop or its tasks are waiting for.

``StallTracker`` is the decision, pure and driven by the times it is given; ``LoopWatchdog``
is the thread and the loop callback around it. Stacks come from ``sys._current_frames`` and
go into one structured log line: ``faulthandler`` writes raw text to a file descriptor,
which would break the JSON lines of the log (it stays enabled for fatal signals).
"""

from __future__ import annotations

import asyncio
import enum
import faulthandler
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger("tidemesh.watchdog")


@dataclass(frozen=True, slots=True)
class StallPolicy:
    stall_s: float = 5.0
    exit_after_s: float = 60.0   # 0: never exit for a stall

    @property
    def interval(self) -> float:
        """How often the loop beats and the thread looks: a stall is seen within a quarter
        of ``stall_s`` of its limit."""
        return max(0.01, min(0.5, self.stall_s / 4))


class Action(enum.Enum):
    NONE = "none"
    STALL_STARTED = "stall_started"
    EXIT = "exit"


class StallTracker:
    """What the loop's beats say, at the times given (monotonic seconds)."""

    def __init__(self, policy: StallPolicy, now: float) -> None:
        self.policy = policy
        self.last_beat = now
        self.in_stall = False
        self.stalls = 0
        self.last_stall_s = 0.0
        self.last_stall_end: float | None = None

    def beat(self, now: float) -> float | None:
        """The loop turned; returns how long the stall it ends lasted, if one did."""
        ended = None
        if self.in_stall:
            ended = now - self.last_beat
            self.in_stall = False
            self.last_stall_s = ended
            self.last_stall_end = now
        self.last_beat = now
        return ended

    def check(self, now: float) -> Action:
        quiet = now - self.last_beat
        if self.policy.exit_after_s > 0 and quiet >= self.policy.exit_after_s:
            return Action.EXIT
        if quiet >= self.policy.stall_s and not self.in_stall:
            self.in_stall = True
            self.stalls += 1
            return Action.STALL_STARTED
        return Action.NONE

    def state(self, now: float) -> str:
        """``stalled`` while a stall lasts and for ``stall_s`` after it: requests that waited
        through it are answered only once it has ended, and must still see it."""
        if self.in_stall or now - self.last_beat >= self.policy.stall_s:
            return "stalled"
        if self.last_stall_end is not None and now - self.last_stall_end < self.policy.stall_s:
            return "stalled"
        return "ok"


def thread_stacks() -> dict[str, str]:
    """Every thread's Python stack, by thread name."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return {f"{names.get(ident, 'thread')}-{ident}": "".join(traceback.format_stack(frame))
            for ident, frame in sys._current_frames().items()}


def awaiting(task: asyncio.Task[Any]) -> list[str]:
    """Where ``task`` waits: each coroutine of its await chain, outermost first, as
    ``file:line function``, then what the innermost awaits (a future, a sleep). A task's own
    ``get_stack`` gives only its outermost coroutine's frame."""
    chain: list[str] = []
    step: Any = task.get_coro()
    while step is not None:
        frame = (getattr(step, "cr_frame", None) or getattr(step, "gi_frame", None)
                 or getattr(step, "ag_frame", None))
        if frame is None:   # a future, or an awaitable that is not a coroutine
            chain.append(f"awaits {step!r:.200}")
            break
        chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        step = (getattr(step, "cr_await", None) or getattr(step, "gi_yieldfrom", None)
                or getattr(step, "ag_await", None))
    return chain


def log_tasks() -> None:
    """Log every task of the running loop and where it waits (SIGUSR1, daemon and broker):
    for a process that turns its loop but seems stuck, where the watchdog has nothing to
    show. One ``task_waiting`` line per task, then ``tasks_logged``."""
    tasks = asyncio.all_tasks()
    for task in sorted(tasks, key=lambda t: t.get_name()):
        log.warning("task_waiting", task=task.get_name(), awaiting=awaiting(task))
    log.warning("tasks_logged", count=len(tasks))


class LoopWatchdog:
    """Watches one event loop from a daemon thread; ``exit_code`` is the process's code for a
    loop stalled past the limit, ``counted`` is called once per stall (a metric)."""

    def __init__(self, policy: StallPolicy, exit_code: int, counted: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic,
                 exit: Callable[[int], Any] = os._exit) -> None:
        self.policy = policy
        self.exit_code = exit_code
        self.counted = counted
        self.clock = clock
        self._exit = exit
        self.tracker = StallTracker(policy, clock())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline: tuple[float, int, str] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)

    def start(self) -> None:
        """Start beating on the running loop and watching from the thread."""
        faulthandler.enable()   # a fatal signal still leaves its stacks on stderr
        self._loop = asyncio.get_running_loop()
        with self._lock:
            self.tracker.beat(self.clock())
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()

    def arm_deadline(self, seconds: float, code: int, reason: str) -> None:
        """Exit with ``code`` if the process is still running ``seconds`` from now; from
        then on stalls are no longer reported (a stopping loop stops beating)."""
        with self._lock:
            self._deadline = (self.clock() + seconds, code, reason)

    def view(self) -> dict[str, Any]:
        """For the health route: the loop's state and its stall figures."""
        with self._lock:
            t = self.tracker
            return {"state": t.state(self.clock()), "stalls": t.stalls,
                    "last_stall_s": round(t.last_stall_s, 3)}

    @property
    def stalled(self) -> bool:
        return bool(self.view()["state"] == "stalled")

    def _beat(self) -> None:
        with self._lock:
            ended = self.tracker.beat(self.clock())
        if ended is not None:
            log.warning("loop_stall_ended", stalled_s=round(ended, 3))
        assert self._loop is not None
        if not self._stop.is_set():
            self._handle = self._loop.call_later(self.policy.interval, self._beat)

    def _watch(self) -> None:
        while not self._stop.wait(self.policy.interval):
            now = self.clock()
            with self._lock:
                action = self.tracker.check(now)
                quiet = now - self.tracker.last_beat
                deadline = self._deadline
            if deadline is not None:
                # Stopping: the loop winds down and stops beating; only the deadline counts.
                if now >= deadline[0]:
                    log.error("process_stop_overran", reason=deadline[2],
                              exit_code=deadline[1], stacks=thread_stacks())
                    self._exit(deadline[1])
                    return
                continue
            if action is Action.STALL_STARTED:
                self.counted()
                log.error("loop_stalled", stalled_s=round(quiet, 3),
                          limit_s=self.policy.stall_s, stacks=thread_stacks())
            elif action is Action.EXIT:
                log.critical("loop_stall_limit_passed", stalled_s=round(quiet, 3),
                             exit_after_s=self.policy.exit_after_s, exit_code=self.exit_code)
                self._exit(self.exit_code)
                return
