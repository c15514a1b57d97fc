"""The conformance scenario (sdk/conformance/scenario.json) run through ``tidemesh.client``.

The TypeScript and Go SDKs run the same file with their own runners; sdk/conformance/README.md
defines the steps, the matchers and how a result is observed. A runner only carries steps to
its SDK and reports what came back: what counts as right is in the scenario, once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidemesh.client import Client, Event, Notice
from tidemesh.core.errors import TidemeshError, from_body

SCENARIO = Path(__file__).resolve().parents[2] / "sdk" / "conformance" / "scenario.json"
WAIT_S = 30.0


def load() -> dict[str, Any]:
    return dict(json.loads(SCENARIO.read_text()))


def observed_error(exc: TidemeshError, status: int | None = None) -> dict[str, Any]:
    return {"kind": type(exc).__name__, "code": exc.code,
            "status": status if status is not None else exc.http_status,
            "details": dict(exc.details)}


# -- matching ---------------------------------------------------------------------------------


def mismatch(expect: Any, got: Any, saved: dict[str, Any], at: str = "$") -> str | None:
    """Why ``got`` does not match ``expect`` (None: it does)."""
    if isinstance(expect, dict) and len(expect) == 1 and next(iter(expect)).startswith("$"):
        op, arg = next(iter(expect.items()))
        return _matcher(op, arg, got, saved, at)
    if isinstance(expect, dict):
        if not isinstance(got, dict):
            return f"{at}: expected an object, got {got!r}"
        whys = (mismatch(want, got.get(key), saved, f"{at}.{key}") for key, want in expect.items())
        return next((why for why in whys if why), None)
    if isinstance(expect, list):
        if not isinstance(got, list) or len(got) != len(expect):
            return f"{at}: expected {len(expect)} items, got {got!r}"
        whys = (mismatch(want, item, saved, f"{at}[{i}]")
                for i, (want, item) in enumerate(zip(expect, got, strict=True)))
        return next((why for why in whys if why), None)
    return None if expect == got else f"{at}: expected {expect!r}, got {got!r}"


def _matcher(op: str, arg: Any, got: Any, saved: dict[str, Any], at: str) -> str | None:
    if op == "$ref":
        return mismatch(saved[arg], got, saved, at)
    if op == "$in":
        return None if got in arg else f"{at}: {got!r} is not one of {arg!r}"
    if op == "$present":
        return None if (got is not None) == bool(arg) else f"{at}: presence is not {arg}"
    if op == "$len":
        return None if isinstance(got, list) and len(got) == arg else (
            f"{at}: {got!r} has not {arg} items")
    raise ValueError(f"unknown matcher {op}")


def resolve(value: Any, saved: dict[str, Any]) -> Any:
    if isinstance(value, dict) and set(value) == {"$ref"}:
        return saved[value["$ref"]]
    return value


def pick(result: Any, path: str) -> Any:
    """The value at a dotted path; None when it is not there (the step's expect then says
    what came back)."""
    for part in path.split("."):
        if isinstance(result, list) and part.isdigit() and int(part) < len(result):
            result = result[int(part)]
        elif isinstance(result, dict):
            result = result.get(part)
        else:
            return None
    return result


# -- running ------------------------------------------------------------------------------------


@dataclass
class Stream:
    items: Iterator[Event | Notice]
    last_id: int


@dataclass
class Runner:
    """Runs the steps; ``clients`` maps a daemon's label to its SDK client, ``restart``
    restarts one (running ``while_down`` while it is stopped)."""

    clients: dict[str, Client]
    restart: Callable[[str, bool, Callable[[], None]], None]
    saved: dict[str, Any] = field(default_factory=dict)
    streams: dict[str, Stream] = field(default_factory=dict)

    def run(self, steps: list[dict[str, Any]]) -> None:
        for step in steps:
            try:
                got = self.observe(step)
            except TidemeshError as exc:
                got = {"error": observed_error(exc)}
            for name, path in step.get("save", {}).items():
                self.saved[name] = pick(got, path)
            if "expect" in step:
                why = mismatch(step["expect"], got, self.saved)
                assert why is None, f"step {step['name']!r}: {why}\n got: {got!r}"

    def observe(self, step: dict[str, Any]) -> Any:
        c = self.clients[step["on"]]
        arg = lambda key, default=None: resolve(step.get(key, default), self.saved)  # noqa: E731
        do = step["do"]
        if do in _CALLS:
            return _CALLS[do](c, arg)
        if do == "consume":
            return self.consume(c, arg("consumer"), arg("hold_at"), arg("idle_timeout_ms"))
        if do == "events_open":
            since = arg("since")
            self.streams[arg("stream")] = Stream(c.events(since=since, idle_timeout=WAIT_S), since)
            return None
        if do == "events_take":
            return self.take(self.streams[arg("stream")], arg("messages"))
        if do == "events_close":
            self.streams.pop(arg("stream")).items.close()  # type: ignore[attr-defined]
            return None
        if do == "restart":
            self.restart(step["on"], bool(arg("kill", False)),
                         lambda: self.run(arg("while_down", [])))
            return None
        raise ValueError(f"unknown step {do!r}")

    @staticmethod
    def consume(c: Client, name: str, hold_at: int | None,
                idle_timeout_ms: int | None) -> dict[str, Any]:
        bodies, seqs = [], []
        idle = idle_timeout_ms / 1000 if idle_timeout_ms is not None else WAIT_S
        for entry in c.consume(name, idle_timeout=idle):
            bodies.append(entry["body"])
            seqs.append(entry["seq"])
            if len(bodies) == hold_at:
                break  # stop while holding this entry: it was never moved past
        return {"bodies": bodies, "seqs": seqs}

    @staticmethod
    def take(stream: Stream, messages: int) -> dict[str, Any]:
        got: list[str] = []
        notices: list[str] = []
        gapless = True
        while len(got) < messages:
            item = next(stream.items)
            if isinstance(item, Notice):
                notices.append(item.type)
                stream.last_id = _replay_from(item) - 1
                continue
            gapless = gapless and item.id == stream.last_id + 1
            stream.last_id = item.id
            if item.type == "message":
                got.append(item.data["body"])
        return {"messages": got, "gapless": gapless, "notices": notices}


Arg = Callable[..., Any]


def _outbox_wait(c: Client, arg: Arg) -> Any:
    cid, status = arg("client_message_id"), arg("status")
    return _wait(lambda: next((r for r in c.outbox_list(status=status)["items"]
                               if r["client_message_id"] == cid), None))


def _inbox_wait(c: Client, arg: Arg) -> Any:
    count = arg("count")
    items = _wait(lambda: i if len(i := c.inbox(limit=1000)["items"]) >= count else None)
    return {"bodies": [e["body"] for e in items]}


# The steps that are one SDK call (or a poll of one), by name.
_CALLS: dict[str, Callable[[Client, Arg], Any]] = {
    "wait_connected": lambda c, _: _wait(lambda: True if c.health()["connected"] else None),
    "version": lambda c, _: c.version(),
    "subscribe": lambda c, arg: c.membership("topic", "subscribe", arg("topic"),
                                             create=bool(arg("create", False))),
    "send": lambda c, arg: c.send(arg("message"), arg("idempotency_key")),
    "send_many": lambda c, arg: [_batch_item(r) for r in c.send_many(arg("messages"))],
    "outbox_inspect": lambda c, arg: c.outbox_inspect(arg("id")),
    "outbox_wait": _outbox_wait,
    "outbox_requeue": lambda c, arg: c.outbox_requeue(arg("id"), arg("new_client_message_id"),
                                                      arg("patch_payload")),
    "check_compatible": lambda c, arg: c.check_compatible(version=arg("version")),
    "backup": lambda c, arg: {"magic": c.backup(arg("passphrase")).split(b"\n", 1)[0].decode()},
    "rotate_token": lambda c, _: c.rotate_token(),
    "inbox": lambda c, arg: c.inbox(consumer=arg("consumer"), q=arg("q")),
    "inbox_wait": _inbox_wait,
}


def _replay_from(notice: Notice) -> int:
    """Where the replay after a notice starts (docs/ipc.md, "Events")."""
    key = "replay_from" if notice.type == "cursor_ahead" else "oldest_available"
    return int(notice.data[key])


def _batch_item(r: Any) -> dict[str, Any]:
    if r["status"] >= 400:
        return {"status": r["status"], "error": observed_error(from_body(r["status"], r["body"]),
                                                               r["status"])}
    return {"status": r["status"], "body": r["body"]}


def _wait(probe: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {WAIT_S} s")
        time.sleep(0.05)
