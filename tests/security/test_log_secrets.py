"""What the daemon's and the broker's logs may carry (issue 31 item 2; core/logfilters).

A traceback carries no frame locals; tokens, keys and signatures never reach the log, under
whatever key or inside whatever string; one connection's repeated event is written a bounded
number of times.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest
import structlog

from tests.daemon.harness import start_daemon
from tidemesh.broker import log as broker_log
from tidemesh.core import logfilters
from tidemesh.daemon.process import log as daemon_log

TOKEN = "tok-9f8e7d6c5b4a39281706"


def _broker(stream: TextIO) -> None:
    broker_log.configure("info", "json", stream)


def _daemon(stream: TextIO) -> None:
    daemon_log.configure("info", "json", stream)


CONFIGURES = [pytest.param(_daemon, id="daemon"), pytest.param(_broker, id="broker")]


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    logfilters.redact.secrets.clear()


def _lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def _handler_that_fails(local_token: str, body: dict[str, Any]) -> None:
    raise ValueError("could not serialise")


@pytest.mark.parametrize("configure", CONFIGURES)
def test_a_logged_traceback_carries_no_locals_and_no_token(
    configure: Callable[[TextIO], None],
) -> None:
    out = io.StringIO()
    configure(out)
    try:
        _handler_that_fails(TOKEN, {"meta": {"a": {"b": 1}}})
    except ValueError:
        structlog.get_logger("t").exception("ipc_handler_crashed", path="/v1/send")
    text = out.getvalue()
    assert "could not serialise" in text  # the traceback is there ...
    assert TOKEN not in text               # ... without the locals that held the token
    assert '"locals"' not in text


@pytest.mark.parametrize("configure", CONFIGURES)
def test_secret_keys_registered_secrets_and_bearer_values_are_redacted(
    configure: Callable[[TextIO], None],
) -> None:
    out = io.StringIO()
    configure(out)
    logfilters.redact.add_secret(TOKEN)
    log = structlog.get_logger("t")
    log.warning("x", local_token=TOKEN, headers={"Authorization": f"Bearer {TOKEN}"},
                invite_token="inv", private_key="pk", signature="sig", pubkey="abc123")
    log.warning("y", error=f"request with token {TOKEN} failed", note="Bearer abcdefgh")
    text = out.getvalue()
    assert TOKEN not in text
    for secret in ('"inv"', '"pk"', '"sig"', "abcdefgh"):
        assert secret not in text
    first, second = _lines(out)
    assert first["pubkey"] == "abc123"  # public values stay
    assert first["headers"]["Authorization"] == logfilters.REDACTED
    assert second["error"] == f"request with token {logfilters.REDACTED} failed"


@pytest.mark.parametrize("configure", CONFIGURES)
def test_one_connections_repeated_warning_is_written_a_bounded_number_of_times(
    configure: Callable[[TextIO], None],
) -> None:
    out = io.StringIO()
    configure(out)
    log = structlog.get_logger("t")
    structlog.contextvars.bind_contextvars(conn="c1")
    for _ in range(1000):
        log.warning("broker_frame_invalid", error="bad")
    structlog.contextvars.bind_contextvars(conn="c2")
    log.warning("broker_frame_invalid", error="bad")
    lines = _lines(out)
    mine = [entry for entry in lines if entry["conn"] == "c1"]
    assert len(mine) == 5 + 7  # five, then at the 8th, 16th, ... 512th
    assert mine[-1]["repeated"] == 512
    assert [entry["conn"] for entry in lines].count("c2") == 1  # another connection is its own


def test_a_long_string_is_cut() -> None:
    event = logfilters.redact(None, "info", {"event": "x", "error": "e" * 100_000})
    assert len(event["error"]) < logfilters.MAX_STRING + 100


async def test_one_ipc_connections_repeated_warning_is_logged_a_bounded_number_of_times(
    short_tmp: Path,
) -> None:
    d = start_daemon(short_tmp)
    try:
        async with d.session() as s:  # one keep-alive connection
            for _ in range(200):
                async with s.get("/v1/inbox", params={"token": "guess"}) as r:
                    assert r.status == 400
    finally:
        assert d.stop() == 0
    lines = [x for x in d.log.read_text().splitlines() if "ipc_token_in_query_refused" in x]
    assert len(lines) == 5 + 5  # five, then at the 8th, 16th, 32nd, 64th and 128th
    assert json.loads(lines[-1])["repeated"] == 128
