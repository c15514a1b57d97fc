"""Hook decisions (spec §6, DESIGN §10), without I/O: which hooks an event fires, a hook's
settings from hooks.toml, what its stdin holds (redacted, capped), whether a failed run is
tried again, and what a reply capability allows.

The daemon's ``hooks/`` package runs the processes and keeps the ledger; everything it
decides is decided here, so it is tested without processes or sockets.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from tidemesh.core.backoff import Backoff
from tidemesh.core.jsonbounds import MAX_DEPTH, deeper_than
from tidemesh.core.settings import ConfigError

ON_MESSAGE = "on-message"
ON_DM = "on-dm"
ON_DISCONNECT = "on-disconnect"
ON_RECONNECT = "on-reconnect"
ON_STARTUP = "on-startup"
PRE_SEND = "pre-send"
ON_FILE_SHARE = "on-file-share"
TOPIC_PREFIX = "on-topic-"
FIXED_NAMES = (ON_MESSAGE, ON_DM, ON_DISCONNECT, ON_RECONNECT, ON_STARTUP, PRE_SEND,
               ON_FILE_SHARE)
_TOPIC = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

STDIN_LIMIT = 256 * 1024
REDACTED = "[redacted]"
REPLY_TTL_S = 300.0
# How many times a failing run is tried before it becomes a hook_failed event.
MAX_ATTEMPTS = 5
RETRY_BACKOFF = Backoff(initial_s=1.0, maximum_s=60.0, multiplier=2.0, jitter=0.25)


class NetworkPolicy(StrEnum):
    DENY = "deny"
    ALLOW = "allow"


@dataclass(frozen=True, slots=True)
class HookConfig:
    """One table of hooks.toml; the defaults are the spec's."""

    name: str
    enabled: bool = True
    timeout_s: float = 30.0
    output_size_limit: int = 65536
    redact_payload: tuple[str, ...] = ()
    allow_reply: bool = False
    network_policy: NetworkPolicy = NetworkPolicy.DENY
    killpg_on_timeout: bool = True


_KEYS: dict[str, tuple[type, ...]] = {
    "enabled": (bool,), "timeout_s": (int, float), "output_size_limit": (int,),
    "redact_payload": (list,), "allow_reply": (bool,), "network_policy": (str,),
    "killpg_on_timeout": (bool,),
}


def is_hook_name(name: str) -> bool:
    if name in FIXED_NAMES:
        return True
    return name.startswith(TOPIC_PREFIX) and bool(_TOPIC.fullmatch(name[len(TOPIC_PREFIX):]))


def parse_table(name: str, table: Any) -> HookConfig:
    """One hook's table of hooks.toml, checked; raises ConfigError naming the field."""
    if not is_hook_name(name):
        raise ConfigError(f"hooks.toml: [{name}] is not a hook name", field=name)
    if not isinstance(table, Mapping):
        raise ConfigError(f"hooks.toml: [{name}] must be a table", field=name)
    for key, value in table.items():
        types = _KEYS.get(key)
        if types is None:
            raise ConfigError(f"hooks.toml: unknown key {name}.{key}", field=f"{name}.{key}")
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ConfigError(f"hooks.toml: {name}.{key} has the wrong type",
                              field=f"{name}.{key}")
    cfg = HookConfig(name)
    values = dict(table)
    if "network_policy" in values:
        if values["network_policy"] not in NetworkPolicy.__members__.values():
            raise ConfigError(f"hooks.toml: {name}.network_policy must be deny or allow",
                              field=f"{name}.network_policy")
        values["network_policy"] = NetworkPolicy(values["network_policy"])
    if "redact_payload" in values:
        paths = values["redact_payload"]
        if not all(isinstance(p, str) and parse_path(p) is not None for p in paths):
            raise ConfigError(f"hooks.toml: {name}.redact_payload takes paths like "
                              "$.body.secret", field=f"{name}.redact_payload")
        values["redact_payload"] = tuple(paths)
    cfg = replace(cfg, **values)
    if cfg.timeout_s <= 0 or cfg.output_size_limit < 0:
        raise ConfigError(f"hooks.toml: {name}.timeout_s must be positive and "
                          "output_size_limit not negative", field=name)
    return cfg


def parse_config(doc: Mapping[str, Any]) -> dict[str, HookConfig]:
    """Every table of hooks.toml; a hook without a table never runs (opt-in)."""
    return {name: parse_table(name, table) for name, table in doc.items()}


# -- which hooks an event fires ------------------------------------------------------------


def fired_by(event_type: str, data: Mapping[str, Any]) -> tuple[str, ...]:
    """The hook names an event of the log fires, before asking which exist and are enabled."""
    if event_type == "message":
        to = data.get("to") or {}
        names = [ON_MESSAGE]
        if to.get("kind") == "dm":
            names.append(ON_DM)
        elif to.get("kind") == "topic":
            names.append(TOPIC_PREFIX + str(to.get("ref")))
        return tuple(names)
    if event_type == "file_shared":
        return (ON_FILE_SHARE,)
    if event_type == "broker_status":
        # Failed attempts ("reconnecting") fire nothing: a hook hears each real transition.
        return {"connected": (ON_RECONNECT,), "disconnected": (ON_DISCONNECT,)}.get(
            str(data.get("state")), ())
    return ()


def message_hooks(dest_kind: str, dest_ref: str) -> tuple[str, ...]:
    return fired_by("message", {"to": {"kind": dest_kind, "ref": dest_ref}})


@dataclass(frozen=True, slots=True)
class HookPlan:
    """The hooks that can run: enabled in hooks.toml and present as executables."""

    hooks: Mapping[str, HookConfig]
    enabled: bool = True

    def runnable(self, name: str) -> HookConfig | None:
        cfg = self.hooks.get(name)
        return cfg if self.enabled and cfg is not None and cfg.enabled else None

    def select(self, names: Iterable[str]) -> tuple[str, ...]:
        return tuple(n for n in names if self.runnable(n) is not None)

    def for_event(self, event_type: str, data: Mapping[str, Any]) -> tuple[str, ...]:
        return self.select(fired_by(event_type, data))

    def for_message(self, dest_kind: str, dest_ref: str) -> tuple[str, ...]:
        return self.select(message_hooks(dest_kind, dest_ref))


def plan_of(configs: Mapping[str, HookConfig], executables: Iterable[str],
            enabled: bool = True) -> HookPlan:
    present = set(executables)
    return HookPlan({n: c for n, c in configs.items() if n in present}, enabled)


# -- stdin: the event, redacted and capped ------------------------------------------------


def parse_path(path: str) -> tuple[str | int, ...] | None:
    """``$.a.b[0].c`` -> ("a", "b", 0, "c"); None when it is not such a path."""
    if not path.startswith("$") or path == "$":
        return None
    steps: list[str | int] = []
    for m in re.finditer(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]|(.)", path[1:]):
        if m.group(3) is not None:
            return None
        steps.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
    return tuple(steps)


def _redact_at(node: Any, steps: tuple[str | int, ...]) -> Any:
    if not steps:
        return REDACTED
    if isinstance(node, str):
        # A string holding JSON (a message body) is redacted inside and written back.
        try:
            inner = json.loads(node)
        except RecursionError:
            return REDACTED  # too deep to look inside: none of it reaches the hook
        except ValueError:
            return node
        if deeper_than(inner, MAX_DEPTH):
            return REDACTED
        if isinstance(inner, dict | list):
            return json.dumps(_redact_at(inner, steps), separators=(",", ":"))
        return node
    head, rest = steps[0], steps[1:]
    if isinstance(node, dict) and isinstance(head, str) and head in node:
        return {**node, head: _redact_at(node[head], rest)}
    if isinstance(node, list) and isinstance(head, int) and head < len(node):
        return [_redact_at(v, rest) if i == head else v for i, v in enumerate(node)]
    return node


def redact(doc: dict[str, Any], paths: Iterable[str]) -> dict[str, Any]:
    """``doc`` with the value at each path replaced by "[redacted]"; absent paths are no-ops."""
    out: Any = doc
    for p in paths:
        steps = parse_path(p)
        if steps is not None:
            out = _redact_at(out, steps)
    return dict(out)


def _longest_string(node: Any, at: tuple[str | int, ...] = ()) -> tuple[int, tuple[str | int, ...]]:
    best: tuple[int, tuple[str | int, ...]] = (-1, ())
    items: Iterable[tuple[str | int, Any]] = (
        node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list)
        else ())
    for key, value in items:
        cand = ((len(value.encode()), (*at, key)) if isinstance(value, str)
                else _longest_string(value, (*at, key)))
        best = max(best, cand, key=lambda c: c[0])
    return best


def _set(node: Any, steps: tuple[str | int, ...], value: Any) -> Any:
    if not steps:
        return value
    head, rest = steps[0], steps[1:]
    if isinstance(node, dict):
        return {**node, head: _set(node[head], rest, value)}
    return [_set(v, rest, value) if i == head else v for i, v in enumerate(node)]


def _get(node: Any, steps: tuple[str | int, ...]) -> Any:
    for s in steps:
        node = node[s]
    return node


def encode_capped(doc: dict[str, Any], limit: int = STDIN_LIMIT) -> bytes:
    """``doc`` as JSON in at most ``limit`` bytes: the longest strings are cut until it fits,
    and then ``"_truncated": true`` says so. Always valid JSON."""
    raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    if len(raw) <= limit:
        return raw
    out: Any = {**doc, "_truncated": True}
    for _ in range(64):
        raw = json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode()
        if len(raw) <= limit:
            return raw
        size, where = _longest_string(out)
        if size <= 0:
            break
        keep = max(0, size - (len(raw) - limit) - 16)
        text = _get(out, where).encode()[:keep].decode(errors="ignore")
        out = _set(out, where, text)
    fallback = {k: doc[k] for k in ("event_id", "type", "hook") if k in doc}
    return json.dumps({**fallback, "_truncated": True}).encode()


# -- retries -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryDecision:
    retry: bool
    delay_s: float = 0.0


def after_failure(failures: int, rng: random.Random, max_attempts: int = MAX_ATTEMPTS,
                  backoff: Backoff = RETRY_BACKOFF) -> RetryDecision:
    """After the ``failures``-th failed run: wait and try again, or give up (hook_failed)."""
    if failures >= max_attempts:
        return RetryDecision(False)
    return RetryDecision(True, backoff.delay(failures, rng))


# -- reply capability -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplyScope:
    """What a hook's token allows: one send, to its event's sender (dm) or topic."""

    kind: str      # "dm" | "topic"
    ref: str
    event_id: str

    @property
    def label(self) -> str:
        return f"dm:send:{self.ref}" if self.kind == "dm" else f"topic:{self.ref}:post"


def reply_scope(event_id: str, event_type: str, data: Mapping[str, Any]) -> ReplyScope | None:
    """A topic message is answered on its topic, anything else with a DM to its sender."""
    if event_type != "message":
        return None
    to = data.get("to") or {}
    if to.get("kind") == "topic":
        return ReplyScope("topic", str(to.get("ref")), event_id)
    sender = data.get("from")
    return ReplyScope("dm", str(sender), event_id) if sender else None


def capability_allows(scope: ReplyScope, method: str, path: str,
                      to: tuple[str, str] | None) -> bool:
    """Only POST /v1/send to the scope's own target; never a read."""
    return method == "POST" and path == "/v1/send" and to == (scope.kind, scope.ref)


# -- what a hook reads ----------------------------------------------------------------------


def stdin_doc(event_key: str, hook: str, event_type: str, data: Mapping[str, Any],
              created_at: int) -> dict[str, Any]:
    """The event as a hook reads it: the event's fields at the top (so ``$.body`` is a
    message's body), with its id, type and the hook's name."""
    return {**data, "event_id": event_key, "type": event_type, "hook": hook,
            "created_at": created_at}


def sample_event(hook: str, now_ms: int) -> dict[str, Any]:
    """A made-up event for ``tidemesh daemon hooks test`` when none is given."""
    sender = "ab" * 32
    if hook in (ON_DISCONNECT, ON_RECONNECT):
        state = "connected" if hook == ON_RECONNECT else "disconnected"
        return stdin_doc("event-0", hook, "broker_status", {"state": state}, now_ms)
    if hook == ON_STARTUP:
        return stdin_doc("startup-0", hook, "daemon_started", {}, now_ms)
    if hook == ON_FILE_SHARE:
        return stdin_doc("event-0", hook, "file_shared", {
            "id": "f" * 32, "name": "report.pdf", "size": 1024, "sha256": "0" * 64,
            "chunk_size": 262144, "chunks": 1, "persistent": False, "sealed": False,
            "direction": "received", "from": sender, "to": {"kind": "topic", "ref": "ops"},
            "message": "the report", "created_at": now_ms}, now_ms)
    to = ({"kind": "topic", "ref": hook[len(TOPIC_PREFIX):]} if hook.startswith(TOPIC_PREFIX)
          else {"kind": "dm", "ref": "cd" * 32})
    sample_id = "01SAMPLE0000000000000000000"
    message: dict[str, Any] = {"id": sample_id, "from": sender, "sender_name": "sample",
               "to": to, "body": '{"text": "hello", "secret": "s3cret"}',
               "body_encoding": "utf8", "priority": "next", "meta": None, "reply_to": None}
    if hook == PRE_SEND:
        return stdin_doc(sample_id, hook, "pre_send", message, now_ms)
    return stdin_doc(sample_id, hook, "message", message, now_ms)
