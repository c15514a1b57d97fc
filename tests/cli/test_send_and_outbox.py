"""The CLI as a user runs it: a real ``tidemesh`` process against a real daemon."""

from __future__ import annotations

import json
from pathlib import Path

from tests.daemon.harness import RunningDaemon, run_cli, start_daemon
from tidemesh.core.exitcodes import Exit
from tidemesh.core.trace import traceparent_problem


def _json(res: object) -> dict[str, object]:
    out = res.stdout
    return json.loads(out)  # type: ignore[no-any-return]


def test_send_from_argument_file_and_stdin(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        a = run_cli(short_tmp, "send", "--mesh", "t", "--to", "topic:ops", "from arg", "--json")
        assert a.returncode == 0, a.stderr
        assert _json(a)["status"] == "queued" and _json(a)["path"] == "daemon"
        f = short_tmp / "msg.bin"
        f.write_bytes(bytes(range(256)))
        b = run_cli(short_tmp, "send", "--mesh", "t", "--to", "queue:jobs", "--file", str(f),
                    "--id", "bin-1", "--json")
        assert b.returncode == 0, b.stderr
        c = run_cli(short_tmp, "send", "--mesh", "t", "--to", "topic:ops", "--meta", '{"k": 1}',
                    "--priority", "now", stdin=b"from stdin")
        assert c.returncode == 0, c.stderr
        assert "queued" in c.stdout
        payloads = {r["client_message_id"]: json.loads(r["payload"]) for r in d.outbox_rows()}
        assert payloads["bin-1"]["body_encoding"] == "base64"
        texts = sorted(p["body"] for p in payloads.values() if p["body_encoding"] == "utf8")
        assert texts == ["from arg", "from stdin"]
    finally:
        assert d.stop() == 0


def test_send_retry_and_conflict_exit_codes(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        args = ("send", "--mesh", "t", "--to", "topic:ops", "--id", "job-7")
        assert run_cli(short_tmp, *args, "one").returncode == 0
        assert run_cli(short_tmp, *args, "one").returncode == 0
        clash = run_cli(short_tmp, *args, "two", "--json")
        assert clash.returncode == Exit.CONFLICT
        assert _json(clash)["error"]["conflict"] == "outbox_pending_fingerprint_mismatch"  # type: ignore[index]
        bad = run_cli(short_tmp, "send", "--mesh", "t", "--to", "mail:x", "hi")
        assert bad.returncode == Exit.REJECTED and "destination" in bad.stderr
        assert len(d.outbox_rows()) == 1
    finally:
        assert d.stop() == 0


def test_send_without_a_daemon_says_so(short_tmp: Path) -> None:
    res = run_cli(short_tmp, "send", "--mesh", "t", "--to", "topic:ops", "hi")
    assert res.returncode == Exit.NOT_RUNNING
    assert "daemon up" in res.stderr


def _dead_row(d: RunningDaemon, cid: str) -> str:
    d.client.send({"to": "topic:ops", "body": "will die"}, cid)
    d.sql("UPDATE outbox SET status='dead', last_error='idempotency_key_reused' "
          "WHERE client_message_id=?", cid)
    return str(d.outbox_rows()[-1]["id"])


def _requeue_chain_checks(home: Path, old_id: str, online: bool) -> None:
    listed = run_cli(home, "daemon", "outbox", "list", "--mesh", "t", "--failed", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in _json(listed)["items"]] == [old_id]  # type: ignore[union-attr]
    first = run_cli(home, "daemon", "outbox", "requeue", old_id, "--mesh", "t", "--json")
    assert first.returncode == 0, first.stderr
    new_id = str(_json(first)["new_row_id"])
    again = run_cli(home, "daemon", "outbox", "requeue", old_id, "--mesh", "t")
    assert again.returncode == Exit.CONFLICT, "an aborted row cannot be requeued twice"
    second = run_cli(home, "daemon", "outbox", "requeue", new_id, "--mesh", "t",
                     "--new-client-id", "manual-2", "--json")
    assert second.returncode == 0, second.stderr
    last = str(_json(second)["new_row_id"])
    shown = run_cli(home, "daemon", "outbox", "inspect", new_id, "--mesh", "t", "--json")
    row = _json(shown)
    assert row["chain"] == [old_id, new_id, last]
    assert row["status"] == "aborted" and row["superseded_by"] == last
    assert row["aborted_by"] == "operator" and row["supersedes"] == old_id
    human = run_cli(home, "daemon", "outbox", "inspect", last, "--mesh", "t")
    assert f"[{last}]" in human.stdout


def test_requeue_over_ipc_builds_the_superseded_chain(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        _requeue_chain_checks(short_tmp, _dead_row(d, "doomed"), online=True)
        rows = d.outbox_rows()
        assert [r["status"] for r in rows] == ["aborted", "aborted", "pending"]
        assert rows[2]["client_message_id"] == "manual-2"
        assert rows[0]["request_fingerprint"] == rows[2]["request_fingerprint"]
    finally:
        assert d.stop() == 0


def test_requeue_works_with_the_daemon_down(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    old = _dead_row(d, "doomed-offline")
    assert d.stop() == 0
    _requeue_chain_checks(short_tmp, old, online=False)
    assert [r["status"] for r in d.outbox_rows()] == ["aborted", "aborted", "pending"]


def test_requeue_with_patched_payload_refingerprints(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        old = _dead_row(d, "to-patch")
        patch = short_tmp / "patch.json"
        patch.write_text(json.dumps({"to": "topic:ops-fixed", "body": "corrected"}))
        res = run_cli(short_tmp, "daemon", "outbox", "requeue", old, "--mesh", "t",
                      "--patch-payload", str(patch), "--json")
        assert res.returncode == 0, res.stderr
        rows = d.outbox_rows()
        assert rows[1]["dest_ref"] == "ops-fixed"
        assert rows[1]["request_fingerprint"] != rows[0]["request_fingerprint"]
        bad = short_tmp / "bad.json"
        bad.write_text(json.dumps({"to": "topic:ops", "body": "x", "client_message_id": "no"}))
        refused = run_cli(short_tmp, "daemon", "outbox", "requeue", str(rows[1]["id"]),
                          "--mesh", "t", "--patch-payload", str(bad))
        assert refused.returncode == Exit.REJECTED
    finally:
        assert d.stop() == 0


def test_requeue_refuses_done_and_unknown_rows(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        d.client.send({"to": "topic:ops", "body": "ok"}, "delivered")
        d.sql("UPDATE outbox SET status='done' WHERE client_message_id='delivered'")
        row_id = str(d.outbox_rows()[0]["id"])
        done = run_cli(short_tmp, "daemon", "outbox", "requeue", row_id, "--mesh", "t")
        assert done.returncode == Exit.CONFLICT and "done" in done.stderr
        missing = run_cli(short_tmp, "daemon", "outbox", "requeue", "NOPE", "--mesh", "t")
        assert missing.returncode == Exit.REJECTED
        assert len(d.outbox_rows()) == 1
    finally:
        assert d.stop() == 0


def test_send_with_a_missing_file_is_a_usage_error(short_tmp: Path) -> None:
    res = run_cli(short_tmp, "send", "--mesh", "t", "--to", "topic:ops",
                  "--file", str(short_tmp / "nonexistent"))
    assert res.returncode == Exit.USAGE, res.stderr
    assert "does not exist" in res.stderr and "Traceback" not in res.stderr




def test_send_refuses_empty_stdin_and_untrimmed_ids_and_sends_nothing(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        send = ("send", "--mesh", "t", "--to", "topic:ops")
        empty = run_cli(short_tmp, *send, stdin=b"")
        assert empty.returncode == Exit.USAGE, empty.stdout
        assert "stdin was empty" in empty.stderr
        for bad in (" bad", "bad ", ""):
            res = run_cli(short_tmp, *send, "--id", bad, "hi")
            assert res.returncode == Exit.USAGE, (bad, res.stdout)
            assert "--id" in res.stderr and "client_message_id" in res.stderr
        assert d.outbox_rows() == []
    finally:
        assert d.stop() == 0


def _no_python_reprs(text: str) -> None:
    assert "{'" not in text and "['" not in text, text
    assert not any(w in text.split() for w in ("None", "True", "False")), text


def test_status_and_inspect_read_as_text_and_inspect_shows_the_request(short_tmp: Path) -> None:
    down = run_cli(short_tmp, "daemon", "status", "--mesh", "t")
    assert down.returncode == Exit.NOT_RUNNING
    _no_python_reprs(down.stdout)
    d = start_daemon(short_tmp)
    try:
        run_cli(short_tmp, "send", "--mesh", "t", "--to", "topic:ops", "--id", "look-1",
                "--meta", '{"job": 7}', "the body to look at")
        up = run_cli(short_tmp, "daemon", "status", "--mesh", "t")
        _no_python_reprs(up.stdout)
        assert "pending=1" in up.stdout, up.stdout
        row_id = str(d.outbox_rows()[0]["id"])
        shown = run_cli(short_tmp, "daemon", "outbox", "inspect", row_id, "--mesh", "t")
        assert shown.returncode == 0, shown.stderr
        _no_python_reprs(shown.stdout)
        assert "topic:ops" in shown.stdout and "the body to look at" in shown.stdout
        raw = _json(run_cli(short_tmp, "daemon", "outbox", "inspect", row_id, "--mesh", "t",
                            "--json"))
        request = dict(raw["request"])  # type: ignore[index]
        # The daemon made a trace context for the send (none was given): any valid one.
        assert traceparent_problem(request.pop("traceparent")) is None
        assert request == {"to": {"kind": "topic", "ref": "ops"},
                           "body": "the body to look at", "body_encoding": "utf8",
                           "priority": "next", "meta": {"job": 7}, "reply_to": None}
        assert raw["to"] == {"kind": "topic", "ref": "ops"}, "--json stays as it was"
    finally:
        assert d.stop() == 0


def test_a_patched_requeue_with_the_daemon_down_waits_for_the_pre_send_hook(
        short_tmp: Path) -> None:
    # The veto's last path: offline, nothing runs the hook, so the new body is not queued.
    d = start_daemon(short_tmp)
    old = _dead_row(d, "veto-offline")
    assert d.stop() == 0
    d.paths.hooks_dir.mkdir(parents=True, exist_ok=True)
    hook = d.paths.hooks_dir / "pre-send"
    hook.write_text("#!/bin/sh\nexit 1\n")
    hook.chmod(0o700)
    patch = short_tmp / "patch.json"
    patch.write_text(json.dumps({"to": "topic:ops", "body": "the hook would refuse this"}))
    res = run_cli(short_tmp, "daemon", "outbox", "requeue", old, "--mesh", "t",
                  "--patch-payload", str(patch))
    assert res.returncode == Exit.NOT_RUNNING, res.stdout + res.stderr
    assert "pre-send hook" in res.stderr and "nothing was requeued" in res.stderr
    assert [r["status"] for r in d.outbox_rows()] == ["dead"]
    plain = run_cli(short_tmp, "daemon", "outbox", "requeue", old, "--mesh", "t")
    assert plain.returncode == 0, "the same body again needs no new verdict"
