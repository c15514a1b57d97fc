"""The operator flow through real processes: broker up, mesh create, invite, daemon join."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tidemesh.broker import running
from tidemesh.core import invite as invites
from tidemesh.core.paths import daemon_paths


def _tm(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIDEMESH_HOME": str(home), "TIDEMESH_LOG_FORMAT": "json"}
    return subprocess.run([sys.executable, "-m", "tidemesh", *args], env=env, text=True,
                          capture_output=True, timeout=60, check=False)


@contextmanager
def _broker_up(home: Path, *args: str) -> Iterator[str]:
    """``broker up`` on a free port until the block ends; yields the URL it says it serves."""
    env = {**os.environ, "TIDEMESH_HOME": str(home), "TIDEMESH_LOG_FORMAT": "json"}
    broker = subprocess.Popen([sys.executable, "-m", "tidemesh", "broker", "up", "--listen",
                               "127.0.0.1:0", *args], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        assert broker.stdout is not None
        yield str(json.loads(broker.stdout.readline())["url"])
    finally:
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(20) == 0
        assert broker.stdout is not None
        broker.stdout.close()


@pytest.mark.slow
def test_invite_then_join_then_list(tmp_path: Path) -> None:
    ops, host = tmp_path / "ops", tmp_path / "host"
    assert _tm(ops, "broker", "mesh", "create", "team").returncode == 0
    env = {**os.environ, "TIDEMESH_HOME": str(ops), "TIDEMESH_LOG_FORMAT": "json"}
    broker = subprocess.Popen([sys.executable, "-m", "tidemesh", "broker", "up", "--listen",
                               "127.0.0.1:0"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        assert broker.stdout is not None
        url = json.loads(broker.stdout.readline())["url"]
        invite = _tm(ops, "broker", "invite", "create", "--mesh", "team", "--url", url)
        assert invite.returncode == 0, invite.stderr
        joined = _tm(host, "daemon", "join", invite.stdout.strip(), "--name", "laptop")
        assert joined.returncode == 0, joined.stderr
        config = json.loads(daemon_paths("team", {"TIDEMESH_HOME": str(host)})
                            .mesh_file.read_text())
        assert config["broker_url"] == url and config["mesh"] == "team"
        again = _tm(tmp_path / "other", "daemon", "join", invite.stdout.strip())
        assert again.returncode == 8 and "invite_invalid" in again.stderr
    finally:
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(20) == 0
        assert broker.stdout is not None
        broker.stdout.close()
    members = json.loads(_tm(ops, "broker", "member", "list", "--mesh", "team", "--json").stdout)
    assert [(m["pubkey"], m["display_name"]) for m in members] == [
        (config["member_pubkey"], "laptop")]
    assert isinstance(members[0]["joined_at"], int), "--json keeps epoch milliseconds"
    human = _tm(ops, "broker", "member", "list", "--mesh", "team").stdout.splitlines()
    assert human[0].split() == ["PUBKEY", "DISPLAY_NAME", "JOINED_AT", "REVOKED_AT"]
    row = human[1].split()
    assert row[:2] == [config["member_pubkey"], "laptop"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", row[2]) and re.fullmatch(r"[\d:]+Z", row[3]), row
    assert row[4] == "-", "not revoked"



@pytest.mark.slow
def test_join_says_why_an_invite_is_refused(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    assert _tm(ops, "broker", "mesh", "create", "team").returncode == 0
    with _broker_up(ops) as url:

        def invite(*args: str) -> str:
            made = _tm(ops, "broker", "invite", "create", "--mesh", "team", "--url", url, *args)
            assert made.returncode == 0, made.stderr
            return made.stdout.strip()

        once, short = invite("--uses", "1"), invite("--expires", "1s")
        real = invites.decode(once)
        forged = invites.Invite(real.url, real.mesh_id, real.mesh, invites.new_token()).encode()
        assert _tm(tmp_path / "first", "daemon", "join", once).returncode == 0
        time.sleep(1.2)
        for label, text, words in [("used", once, "used up"), ("late", short, "expired"),
                                   ("forged", forged, "unknown")]:
            res = _tm(tmp_path / label, "daemon", "join", text)
            assert res.returncode == 8, res.stderr
            assert "invite_invalid" in res.stderr and words in res.stderr, res.stderr


@pytest.mark.slow
def test_the_embedded_store_folder_and_files_are_private(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    assert _tm(ops, "broker", "mesh", "create", "team").returncode == 0
    with _broker_up(ops):
        folder = ops / "broker"
        assert oct(stat.S_IMODE(folder.stat().st_mode)) == oct(0o700)
        files = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in folder.glob("broker.db*")}
        assert {"broker.db", "broker.db-wal"} <= files.keys()
        assert files == {name: oct(0o600) for name in files}


@pytest.mark.slow
def test_invites_carry_the_address_the_running_broker_serves(tmp_path: Path) -> None:
    ops = tmp_path / "ops"
    assert _tm(ops, "broker", "mesh", "create", "team").returncode == 0
    with _broker_up(ops) as url:
        assert not url.endswith(":7800")
        made = _tm(ops, "broker", "invite", "create", "--mesh", "team")
        assert made.returncode == 0, made.stderr
        assert invites.decode(made.stdout).url == url
        joined = _tm(tmp_path / "host", "daemon", "join", made.stdout.strip())
        assert joined.returncode == 0, joined.stderr
        override = _tm(ops, "broker", "invite", "create", "--mesh", "team",
                       "--url", "wss://override.example")
        assert invites.decode(override.stdout).url == "wss://override.example"
    with _broker_up(ops, "--public-url", "wss://broker.example:7443"):
        made = _tm(ops, "broker", "invite", "create", "--mesh", "team")
        assert invites.decode(made.stdout).url == "wss://broker.example:7443"


@pytest.mark.slow
def test_operator_commands_use_the_running_brokers_store(tmp_path: Path,
                                                         pg_database: str) -> None:
    ops = tmp_path / "ops"
    with _broker_up(ops, "--store", pg_database):
        made = _tm(ops, "broker", "mesh", "create", "team")
        assert made.returncode == 0, made.stderr
        invite = _tm(ops, "broker", "invite", "create", "--mesh", "team")
        assert invite.returncode == 0, invite.stderr
        joined = _tm(tmp_path / "host", "daemon", "join", invite.stdout.strip())
        assert joined.returncode == 0, joined.stderr
        assert "store of the broker running as pid" in made.stderr
        record = ops / "broker" / "running.json"
        assert oct(stat.S_IMODE(record.stat().st_mode)) == oct(0o600), "it may hold a password"
    assert not record.exists(), "a clean stop removes the record"
    # The broker is down: its store is still the one meant, never a new embedded one.
    listed = _tm(ops, "broker", "member", "list", "--mesh", "team")
    assert listed.returncode == 0, listed.stderr
    assert "last ran on" in listed.stderr and "(none)" not in listed.stdout
    assert not (ops / "broker" / "broker.db").exists()


def test_a_record_left_by_a_dead_broker_names_the_store_it_last_ran_on(tmp_path: Path
                                                                       ) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    env = {"TIDEMESH_HOME": str(tmp_path)}
    running.write(running.record_path(env),
                  running.RunningBroker(int(gone.stdout), "postgresql://elsewhere/x", "h:1"))
    assert running.find(env) is None
    chosen = running.operator_store(None, env)
    assert chosen.url == "postgresql://elsewhere/x" and "last ran on" in (chosen.note or "")


def test_operator_commands_never_create_a_store_behind_a_down_broker(tmp_path: Path) -> None:
    ops, store = tmp_path / "ops", f"sqlite://{tmp_path}/kept.db"
    assert _tm(ops, "broker", "mesh", "create", "team", "--store", store).returncode == 0
    with _broker_up(ops, "--store", store):
        pass
    embedded = ops / "broker" / "broker.db"
    for args in (("member", "list", "--mesh", "team"), ("topic", "create", "--mesh", "team",
                                                        "ops")):
        res = _tm(ops, "broker", *args)
        assert res.returncode == 0 and "last ran on" in res.stderr, res.stderr
    assert not embedded.exists()
    # Nothing ever ran from this home and nothing is named: say so, create nothing.
    fresh = tmp_path / "fresh"
    res = _tm(fresh, "broker", "member", "list", "--mesh", "team")
    assert res.returncode != 0 and "--store" in res.stderr and "Traceback" not in res.stderr
    assert not (fresh / "broker" / "broker.db").exists()
    # Setting a store up is what may create it.
    assert _tm(fresh, "broker", "mesh", "create", "team").returncode == 0
    assert (fresh / "broker" / "broker.db").exists()


@pytest.mark.slow
def test_an_invite_names_the_broker_whose_store_the_command_used(tmp_path: Path,
                                                                 pg_database: str) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    assert _tm(one, "broker", "mesh", "create", "team", "--store", pg_database).returncode == 0
    with _broker_up(one, "--store", pg_database) as first, \
            _broker_up(two, "--store", pg_database) as second:
        assert first != second
        made = _tm(one, "broker", "invite", "create", "--mesh", "team")
        assert made.returncode == 0, made.stderr
        assert first in made.stderr, "stderr names the broker whose store it used"
        assert invites.decode(made.stdout).url == first
