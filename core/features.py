"""Feature negotiation (spec §15.1-15.2, §15.5): what the broker advertises, and the daemon's check.

``validate`` is pure: it takes the broker's ``supported`` map and returns None when every
required feature is usable, or the structured ``close_reason`` the daemon closes with (4010).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DEDUPE = "client_message_id_dedupe"
MIN_RETENTION_DAYS = 3
REQUIRED: tuple[str, ...] = (DEDUPE,)
# Optional: a daemon that asks for it gets a recipient's due deliveries as ``deliver_batch``
# frames of at most this many deliveries and this many encoded bytes (one delivery larger
# than the byte cap still goes, alone). The count matches the broker's page of due
# deliveries. The byte cap keeps what a stalled daemon holds in memory near what single
# frames cost (websockets buffers a few frames before it stops reading, and the kernel's
# receive window grows with what the reader takes at once).
DELIVER_BATCH = "deliver_batch"
DELIVER_BATCH_MAX_COUNT = 256
DELIVER_BATCH_MAX_BYTES = 256 << 10
# Optional: ``traceparent`` in send and deliver frames (W3C trace context). A broker or
# daemon from before it refuses the field (its frame schemas allow no other), so a daemon
# sends it only to a broker that advertises this, and a broker delivers it only to a daemon
# that asked for it.
TRACE_CONTEXT = "trace_context"
# Optional: presence as ``presence_batch`` frames, the changes of a short window about many
# members in one frame (the same encoded frame for every listener of the mesh), instead of one
# ``peer_join`` / ``peer_leave`` frame per member per listener (issue #30: a connect storm of
# N members was N² frames).
PRESENCE_BATCH = "presence_batch"
PRESENCE_BATCH_MAX_COUNT = 4096
# Optional, with ``presence_batch``: after the negotiation the broker sends one
# ``presence_snapshot`` (who is present now), then numbered batches (``seq``) that may also
# hold ``peer_update`` events (a present member's profile or connections changed), so that
# the daemon keeps the mesh's presence itself and answers ``peers`` without asking (issue
# #30: a thousand members each asking the broker to walk its registry).
PRESENCE_SNAPSHOT = "presence_snapshot"
# A snapshot larger than this goes as several frames (``more: true`` on all but the last), so
# that a mesh of large profiles never needs one frame past the link's size limit.
PRESENCE_SNAPSHOT_MAX_BYTES = 256 << 10
# Optional: the ``key_rotate`` frame (a member moves to a new key in one signed step) and the
# ``peer_key_rotated`` events it causes. A broker from before it refuses the frame type, so
# ``daemon rotate-keypair`` checks the advertisement first and names the missing feature; a
# broker tells the event only to daemons that asked for it.
KEY_ROTATION = "key_rotation"
# Asked for instead of the two above by a daemon whose ``presence.feed`` is off: the broker
# sends it no presence at all (no snapshot, no batches, no single events), and it asks
# ``peers`` when it needs them. In a mesh of N members each one that keeps presence reads
# every change of the N, N² entries for a connect storm (issue #30); a member that never
# shows who is present need not read any. Not in OPTIONAL: a daemon asks for it only when
# its setting says so.
PRESENCE_ON_DEMAND = "presence_on_demand"
OPTIONAL: tuple[str, ...] = (DELIVER_BATCH, TRACE_CONTEXT, PRESENCE_BATCH, KEY_ROTATION,
                             PRESENCE_SNAPSHOT)
# What a daemon asks for with its presence feed off.
OPTIONAL_ON_DEMAND: tuple[str, ...] = (DELIVER_BATCH, TRACE_CONTEXT, KEY_ROTATION,
                                       PRESENCE_ON_DEMAND)


def optional_for(presence_feed: bool) -> tuple[str, ...]:
    """The optional features a daemon asks for, by its ``presence.feed`` setting."""
    return OPTIONAL if presence_feed else OPTIONAL_ON_DEMAND


MODES = ("retention_scoped", "permanent")


@dataclass(frozen=True, slots=True)
class CloseReason:
    kind: str        # feature_unavailable | feature_param_invalid | feature_param_below_floor
    feature: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "feature": self.feature, "detail": self.detail}


def advertise(mode: str, retention_days: int, inline_bytes: int) -> dict[str, Any]:
    """The broker's ``supported`` map."""
    dedupe: dict[str, Any] = {"version": 1, "mode": mode, "request_fingerprint": True}
    if mode == "retention_scoped":
        dedupe["dedupe_retention_days"] = retention_days
    return {
        DEDUPE: {"params": dedupe},
        "max_payload": {"params": {"version": 1, "inline_bytes": inline_bytes,
                                   "blob_bytes": inline_bytes}},
        DELIVER_BATCH: {"params": {"version": 1, "max_count": DELIVER_BATCH_MAX_COUNT,
                                   "max_bytes": DELIVER_BATCH_MAX_BYTES}},
        TRACE_CONTEXT: {"params": {"version": 1}},
        PRESENCE_BATCH: {"params": {"version": 1, "max_count": PRESENCE_BATCH_MAX_COUNT}},
        KEY_ROTATION: {"params": {"version": 1}},
        PRESENCE_SNAPSHOT: {"params": {"version": 1}},
        PRESENCE_ON_DEMAND: {"params": {"version": 1}},
    }


def validate(supported: Any, required: tuple[str, ...] = REQUIRED) -> CloseReason | None:
    """Check the broker's advertisement; the first problem found becomes the close reason."""
    if not isinstance(supported, dict):
        return CloseReason("feature_param_invalid", required[0], "supported is not an object")
    for feature in required:
        entry = supported.get(feature)
        if entry is None:
            return CloseReason("feature_unavailable", feature, "not in the broker's supported set")
        params = entry.get("params") if isinstance(entry, dict) else None
        if not isinstance(params, dict):
            return CloseReason("feature_param_invalid", feature, "params missing")
        problem = _CHECKS.get(feature, _version_only)(params)
        if problem is not None:
            return CloseReason(problem[0], feature, problem[1])
    return None


def _version_only(params: dict[str, Any]) -> tuple[str, str] | None:
    if params.get("version") != 1:
        return "feature_param_invalid", f"unknown params.version {params.get('version')!r}"
    return None


def _dedupe(params: dict[str, Any]) -> tuple[str, str] | None:
    bad = _version_only(params)
    if bad is not None:
        return bad
    if params.get("request_fingerprint") is not True:
        return "feature_param_invalid", "request_fingerprint must be true"
    mode = params.get("mode")
    if mode not in MODES:
        return "feature_param_invalid", f"unknown mode {mode!r}"
    if mode == "permanent":
        return None
    days = params.get("dedupe_retention_days")
    if not isinstance(days, int) or isinstance(days, bool):
        return "feature_param_invalid", "dedupe_retention_days missing or not an integer"
    if days < MIN_RETENTION_DAYS:
        return ("feature_param_below_floor",
                f"dedupe_retention_days={days} is below the floor of {MIN_RETENTION_DAYS}")
    return None


_CHECKS = {DEDUPE: _dedupe}


def negotiated(supported: dict[str, Any], asked: tuple[str, ...]) -> dict[str, list[str]]:
    """What a handshake settled, for the log and ``/v1/version``: the features asked for that
    the broker advertises with usable params (``taken``), those it does not advertise
    (``missing``), and those it advertises with params this daemon cannot use
    (``param_invalid``: treated as missing; an optional one is logged, never fatal)."""
    out: dict[str, list[str]] = {"taken": [], "missing": [], "param_invalid": []}
    for name in asked:
        entry = supported.get(name)
        params = entry.get("params") if isinstance(entry, dict) else None
        if entry is None:
            out["missing"].append(name)
        elif not isinstance(params, dict) or _CHECKS.get(name, _version_only)(params):
            out["param_invalid"].append(name)
        else:
            out["taken"].append(name)
    return out


def deliver_batch_count(supported: dict[str, Any]) -> int | None:
    """The most deliveries one ``deliver_batch`` frame may hold, or None when the broker
    does not send them (it sends one ``deliver`` frame per delivery then)."""
    entry = supported.get(DELIVER_BATCH)
    params = entry.get("params") if isinstance(entry, dict) else None
    if not isinstance(params, dict) or params.get("version") != 1:
        return None
    count = params.get("max_count")
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None


def presence_snapshot(supported: dict[str, Any], asked: tuple[str, ...]) -> bool:
    """Whether the broker sends this link a presence snapshot and numbered batches: it
    advertises both features and the daemon asked for both."""
    wanted = (PRESENCE_BATCH, PRESENCE_SNAPSHOT)
    return all(f in asked for f in wanted) and all(
        isinstance(supported.get(f), dict) and (supported[f].get("params") or {}).get("version")
        == 1 for f in wanted)


def dedupe_retention_days(supported: dict[str, Any]) -> int | None:
    """The broker's dedupe window in days from a validated advertisement; None = permanent.

    The daemon refuses to start when its outbox max age is not below this (DESIGN §5.3).
    """
    params = supported[DEDUPE]["params"]
    return None if params["mode"] == "permanent" else int(params["dedupe_retention_days"])


def close_reason_text(reason: CloseReason, limit: int = 123) -> str:
    """The close frame's reason: compact JSON, detail cut so it fits the 123-byte limit."""
    detail = reason.detail
    while True:
        text = json.dumps({"kind": reason.kind, "feature": reason.feature, "detail": detail},
                          separators=(",", ":"))
        if len(text.encode()) <= limit or not detail:
            return text
        detail = detail[:-1]
