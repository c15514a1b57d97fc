"""schemathesis against the IPC's OpenAPI document, on a real daemon's TCP port.

Every operation gets generated requests, valid and not; the daemon must answer each with a
status and body its document allows (never a 5xx), and a refused request must leave no
outbox row behind. ``/v1/events`` is left out: it is a stream that never ends.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.daemon.harness import RunningDaemon, start_daemon
from tests.e2e.harness import Broker, connected, wait_for

# The committed document as a user gets it: self-contained, no resolver needed.
schema = schemathesis.openapi.from_path(Path(__file__).resolve().parents[2] / "schemas"
                                        / "openapi.json")


@pytest.fixture(scope="module")
def tcp_daemon(joined: tuple[Broker, Path]) -> Iterator[RunningDaemon]:
    """A daemon joined to a real broker, so routes that reach the broker get real answers.
    Its request budget is off: the fuzzer sends faster than 100/s, and a 429 for every case
    past the burst would test the budget instead of the routes (tests/daemon/test_rate_limit)."""
    d = start_daemon(joined[1], extra_env={"TIDEMESH_IPC_RATE_PER_S": "0"})
    try:
        asyncio.run(wait_for(lambda: connected(d)))
        yield d
        assert d.stop() == 0, "the daemon did not survive the fuzzing"
    finally:
        d.kill()


def _outbox_rows(d: RunningDaemon) -> int:
    conn = sqlite3.connect(f"file:{d.paths.outbox_db}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
    finally:
        conn.close()


@schema.exclude(path="/v1/events").parametrize()
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_ipc_answers_every_request_as_documented(case: schemathesis.Case,
                                                 tcp_daemon: RunningDaemon) -> None:
    before = _outbox_rows(tcp_daemon)
    response = case.call(base_url=f"http://127.0.0.1:{tcp_daemon.port}",
                         headers={"Authorization": f"Bearer {tcp_daemon.token}"}, timeout=10)
    assert response.status_code < 500, (response.status_code, response.text)
    # Each case sends the token the daemon holds now (``token`` reads its file), so that a
    # generated POST /v1/token/rotate cannot leave every later case testing only the 401.
    assert response.status_code != 401, response.text
    # A schema-valid request can still get a 400 where JSON Schema cannot say the rule: a DM
    # key of 64 hex digits that is no curve point, a base64 body that does not decode, meta
    # integers outside RFC 8785's range. Everything else is checked.
    case.validate_response(response, excluded_checks=[positive_data_acceptance])
    if response.status_code >= 400:
        assert _outbox_rows(tcp_daemon) == before, "a refused request left an outbox row"


async def test_405_names_the_allowed_methods(tcp_daemon: RunningDaemon) -> None:
    """Found by schemathesis (ST204): RFC 9110 requires ``Allow`` on every 405."""
    async with tcp_daemon.session() as s, s.request("TRACE", "/v1/version") as r:
        assert r.status == 405
        assert set(r.headers["Allow"].replace(" ", "").split(",")) >= {"GET"}
        assert (await r.json())["error"]["code"] == "method_not_allowed"
