"""Hook decisions without processes: which hooks fire, hooks.toml, stdin, retries, scopes."""

from __future__ import annotations

import json
import random

import pytest

from tidemesh.core import hooks
from tidemesh.core.hooks import HookConfig, NetworkPolicy, ReplyScope
from tidemesh.core.settings import ConfigError

DM = {"to": {"kind": "dm", "ref": "cd" * 32}, "from": "ab" * 32}
TOPIC = {"to": {"kind": "topic", "ref": "ops"}, "from": "ab" * 32}
QUEUE = {"to": {"kind": "queue", "ref": "jobs"}, "from": "ab" * 32}


def test_fired_by_message_kinds_and_broker_transitions() -> None:
    assert hooks.fired_by("message", DM) == ("on-message", "on-dm")
    assert hooks.fired_by("message", TOPIC) == ("on-message", "on-topic-ops")
    assert hooks.fired_by("message", QUEUE) == ("on-message",)
    assert hooks.fired_by("broker_status", {"state": "connected"}) == ("on-reconnect",)
    assert hooks.fired_by("broker_status", {"state": "disconnected"}) == ("on-disconnect",)
    assert hooks.fired_by("broker_status", {"state": "reconnecting"}) == ()
    assert hooks.fired_by("hook_failed", {}) == (), "a failure never fires more hooks"


def test_plan_runs_only_enabled_hooks_that_have_a_file() -> None:
    configs = hooks.parse_config({"on-message": {}, "on-dm": {"enabled": False},
                                  "on-topic-ops": {}})
    plan = hooks.plan_of(configs, ["on-message", "on-dm", "pre-send"])
    assert plan.for_event("message", DM) == ("on-message",)
    assert plan.for_message("topic", "ops") == ("on-message",), "on-topic-ops has no file"
    assert plan.runnable("pre-send") is None, "a file without a table does not run"
    assert hooks.plan_of(configs, ["on-message"], enabled=False).for_event("message", DM) == ()


def test_parse_table_defaults_and_values() -> None:
    cfg = hooks.parse_table("on-dm", {"timeout_s": 2, "allow_reply": True,
                                      "network_policy": "allow",
                                      "redact_payload": ["$.body.secret"]})
    assert cfg == HookConfig("on-dm", timeout_s=2, allow_reply=True,
                             network_policy=NetworkPolicy.ALLOW,
                             redact_payload=("$.body.secret",))
    assert hooks.parse_table("on-message", {}) == HookConfig(
        "on-message", True, 30.0, 65536, (), False, NetworkPolicy.DENY, True)


@pytest.mark.parametrize(("name", "table"), [
    ("on-everything", {}),
    ("on-dm", {"timeout": 3}),
    ("on-dm", {"enabled": "yes"}),
    ("on-dm", {"network_policy": "allowlist"}),
    ("on-dm", {"redact_payload": ["body.secret"]}),
    ("on-dm", {"timeout_s": 0}),
    ("on-dm", "not a table"),
])
def test_parse_table_refuses_what_it_cannot_trust(name: str, table: object) -> None:
    with pytest.raises(ConfigError):
        hooks.parse_table(name, table)


def test_redact_reaches_into_fields_lists_and_json_bodies() -> None:
    doc = {"body": json.dumps({"secret": "s", "keep": 1}), "meta": {"tokens": ["a", "b"]},
           "from": "x"}
    out = hooks.redact(doc, ["$.body.secret", "$.meta.tokens[1]", "$.from", "$.absent.x"])
    assert json.loads(out["body"]) == {"secret": "[redacted]", "keep": 1}
    assert out["meta"] == {"tokens": ["a", "[redacted]"]}
    assert out["from"] == "[redacted]"
    assert doc["from"] == "x", "the event itself is not changed"


def test_redact_leaves_a_plain_text_body_alone() -> None:
    assert hooks.redact({"body": "just words"}, ["$.body.secret"]) == {"body": "just words"}


def test_encode_capped_keeps_small_events_whole() -> None:
    doc = {"event_id": "e", "body": "hi"}
    assert json.loads(hooks.encode_capped(doc)) == doc


def test_encode_capped_cuts_the_longest_strings_and_says_so() -> None:
    doc = {"event_id": "e", "type": "message", "body": "x" * 300_000, "sender_name": "al"}
    raw = hooks.encode_capped(doc)
    out = json.loads(raw)
    assert len(raw) <= hooks.STDIN_LIMIT
    assert out["_truncated"] is True and out["event_id"] == "e" and out["sender_name"] == "al"
    assert out["body"] == "x" * len(out["body"]) and len(out["body"]) > 200_000


def test_encode_capped_falls_back_to_the_ids_when_nothing_can_be_cut() -> None:
    doc = {"event_id": "e", "type": "message", "n": list(range(100_000))}
    out = json.loads(hooks.encode_capped(doc, limit=1000))
    assert out == {"event_id": "e", "type": "message", "_truncated": True}


def test_after_failure_backs_off_then_gives_up() -> None:
    rng = random.Random(1)
    first, second = hooks.after_failure(1, rng, 3), hooks.after_failure(2, rng, 3)
    assert first.retry and second.retry and 0 < first.delay_s < second.delay_s
    assert hooks.after_failure(3, rng, 3) == hooks.RetryDecision(False)


def test_reply_scope_is_the_topic_or_the_sender() -> None:
    assert hooks.reply_scope("e", "message", TOPIC) == ReplyScope("topic", "ops", "e")
    assert hooks.reply_scope("e", "message", DM) == ReplyScope("dm", "ab" * 32, "e")
    assert hooks.reply_scope("e", "message", QUEUE) == ReplyScope("dm", "ab" * 32, "e")
    assert hooks.reply_scope("e", "broker_status", {"state": "connected"}) is None


def test_capability_allows_one_send_to_its_target_only() -> None:
    scope = ReplyScope("dm", "ab" * 32, "e")
    assert hooks.capability_allows(scope, "POST", "/v1/send", ("dm", "ab" * 32))
    assert not hooks.capability_allows(scope, "POST", "/v1/send", ("dm", "cd" * 32))
    assert not hooks.capability_allows(scope, "POST", "/v1/send", ("topic", "ab" * 32))
    assert not hooks.capability_allows(scope, "POST", "/v1/send", None)
    assert not hooks.capability_allows(scope, "GET", "/v1/inbox", ("dm", "ab" * 32))
    # A batch could carry any target: a reply token never opens it.
    assert not hooks.capability_allows(scope, "POST", "/v1/send_batch", ("dm", "ab" * 32))


def test_sample_events_fire_their_own_hook() -> None:
    for name in ("on-message", "on-dm", "on-topic-ops", "on-reconnect", "on-disconnect"):
        doc = hooks.sample_event(name, 0)
        assert name in hooks.fired_by(doc["type"], doc), name
