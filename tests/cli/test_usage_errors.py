"""A flag the CLI cannot use is a usage error, exit 2 as docs/cli.md's table says, found
before anything is opened or sent."""

from __future__ import annotations

from pathlib import Path

from tests.daemon.harness import run_cli, start_daemon
from tidemesh.core.exitcodes import Exit


def test_meta_that_is_not_json_is_a_usage_error(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    try:
        res = run_cli(short_tmp, "send", "--mesh", "t", "--to", "topic:ops", "--meta", "{bad",
                      "hi")
        assert res.returncode == Exit.USAGE, res.stdout + res.stderr
        assert "--meta" in res.stderr and "not valid JSON" in res.stderr
        assert "Traceback" not in res.stderr and d.outbox_rows() == []
    finally:
        assert d.stop() == 0


def test_a_malformed_invite_expiry_is_a_usage_error_and_opens_no_store(short_tmp: Path) -> None:
    res = run_cli(short_tmp, "broker", "invite", "create", "--mesh", "team", "--expires", "1x")
    assert res.returncode == Exit.USAGE, res.stdout + res.stderr
    assert "--expires" in res.stderr and "30m, 12h, 7d or 2w" in res.stderr
    assert not (short_tmp / "broker").exists(), "nothing was opened or created"
