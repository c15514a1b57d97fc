"""The loop watchdog's decisions, at given times, and its thread on a real loop."""

from __future__ import annotations

import asyncio
import time

from tidemesh.core.watchdog import Action, LoopWatchdog, StallPolicy, StallTracker, awaiting

POLICY = StallPolicy(stall_s=5.0, exit_after_s=60.0)


def test_a_stall_is_reported_once_and_ends_with_the_next_beat() -> None:
    t = StallTracker(POLICY, now=0.0)
    assert t.check(4.9) is Action.NONE and t.state(4.9) == "ok"
    assert t.check(5.0) is Action.STALL_STARTED and t.stalls == 1
    assert t.check(30.0) is Action.NONE, "one report per stall"
    assert t.state(30.0) == "stalled"
    assert t.beat(31.0) == 31.0
    # Requests that waited through it are answered now and must still see it.
    assert t.state(31.5) == "stalled"
    t.beat(35.0)
    assert t.state(35.5) == "stalled"
    t.beat(36.0)
    assert t.state(36.1) == "ok"
    assert t.check(37.0) is Action.NONE


def test_a_stall_past_the_limit_asks_for_the_exit() -> None:
    t = StallTracker(POLICY, now=0.0)
    t.check(6.0)
    assert t.check(60.0) is Action.EXIT
    never = StallTracker(StallPolicy(5.0, 0.0), now=0.0)
    never.check(6.0)
    assert never.check(10_000.0) is Action.NONE


def test_a_beating_loop_is_never_stalled() -> None:
    t = StallTracker(POLICY, now=0.0)
    for now in range(1, 100):
        t.beat(float(now))
        assert t.check(now + 0.5) is Action.NONE
    assert t.stalls == 0


async def test_the_thread_sees_a_blocked_loop_and_an_overrun_stop() -> None:
    counted: list[int] = []
    exits: list[int] = []
    dog = LoopWatchdog(StallPolicy(stall_s=0.2, exit_after_s=0.0), 15,
                       lambda: counted.append(1), exit=exits.append)
    dog.start()
    try:
        await asyncio.sleep(0.3)
        assert dog.view()["stalls"] == 0
        time.sleep(0.6)   # the loop does not turn
        assert counted == [1]
        await asyncio.sleep(0.05)
        view = dog.view()
        assert view["state"] == "stalled" and view["last_stall_s"] >= 0.2
        await asyncio.sleep(0.5)
        assert dog.view()["state"] == "ok"
        dog.arm_deadline(0.2, 1, "test")
        await asyncio.sleep(0.6)
        assert exits == [1]
    finally:
        dog.stop()


async def test_a_waiting_task_shows_its_whole_await_chain_and_what_it_waits_on() -> None:
    gate = asyncio.Event()

    async def inner() -> None:
        await gate.wait()

    async def outer() -> None:
        await inner()

    task = asyncio.create_task(outer(), name="stuck-one")
    await asyncio.sleep(0)
    try:
        chain = awaiting(task)
        names = [step.rsplit(" ", 1)[-1] for step in chain[:-1]]
        # outer → inner → Event.wait, then the future the event's wait is parked on
        assert names == ["outer", "inner", "wait"], chain
        assert chain[-1].startswith("awaits "), chain
    finally:
        gate.set()
        await task
