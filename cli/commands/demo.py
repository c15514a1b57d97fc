"""``tidemesh demo``: the main job on the embedded default, end to end, narrated.

A broker on an SQLite file, a mesh, two daemons (two TIDEMESH_HOMEs) joined by invite, a
topic message and a DM from alice to bob, a retry that changes nothing, bob's inbox and
event stream showing each message exactly once, and where everything lives. Every step is
the same ``tidemesh`` command a user would type, run as a child process.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import click

from tidemesh.client import Client, Event
from tidemesh.core.paths import daemon_paths

MESH = "demo"


def _step(text: str) -> None:
    click.echo(click.style("==> ", fg="cyan", bold=True) + text)


def _tidemesh(home: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "tidemesh", *args], capture_output=True,
                         text=True, env={**os.environ, "TIDEMESH_HOME": str(home)}, check=False)
    if res.returncode != 0:
        raise click.ClickException(f"`tidemesh {' '.join(args[:3])}` failed "
                                   f"({res.returncode}): {res.stderr.strip() or res.stdout}")
    return res.stdout.strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _broker(home: Path, store: str, port: int) -> Iterator[subprocess.Popen[bytes]]:
    with open(home / "broker.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidemesh", "broker", "up", "--store", store,
             "--listen", f"127.0.0.1:{port}"],
            stdout=subprocess.PIPE, stderr=log, env={**os.environ, "TIDEMESH_HOME": str(home)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if b"broker_ready" not in line:
            raise click.ClickException(f"the broker did not start; see {home / 'broker.log'}")
        yield proc
    finally:
        proc.terminate()
        with suppress(subprocess.TimeoutExpired):
            proc.wait(15)


def _client(home: Path) -> Client:
    return Client.for_mesh(MESH, environ={"TIDEMESH_HOME": str(home)})


def _wait(what: str, check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise click.ClickException(f"timed out waiting for {what}")


@click.command("demo")
@click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to keep everything (default: a fresh folder under /tmp); a folder "
                   "an earlier demo used is cleared and used again.")
def demo_cmd(home: Path | None) -> None:
    """Run the whole thing locally: broker, two daemons, a topic message and a DM."""
    base = home or Path(tempfile.mkdtemp(prefix="tidemesh-demo-"))
    homes = {name: base / name for name in ("broker", "alice", "bob")}
    _afresh(base, homes)
    store = f"sqlite://{(homes['broker'] / 'broker.db').resolve()}"
    port = _free_port()
    _step(f"everything lives under {base}")
    _step(f"broker: mesh '{MESH}' in {store}, listening on ws://127.0.0.1:{port}")
    _tidemesh(homes["broker"], "broker", "mesh", "create", MESH, "--store", store)
    with _broker(homes["broker"], store, port):
        try:
            _run(homes, store, port)
        finally:
            _step("stopping both daemons gracefully, then the broker")
            for name in ("alice", "bob"):
                with suppress(click.ClickException):
                    _tidemesh(homes[name], "daemon", "down", "--mesh", MESH)
    _where(homes, store)
    _leave_word(base, chosen=home is not None)


def _leave_word(base: Path, *, chosen: bool) -> None:
    """Say what stays behind: a folder the user did not name would otherwise sit unnoticed."""
    if chosen:
        _step(f"the files stay under {base}; the next `tidemesh demo --home {base}` clears them")
    else:
        _step(f"the files stay under {base} (a folder the demo made): remove it with "
              f"`rm -r {base}`, or give `--home DIR` to keep the demo in one folder")


# Marks a folder as the demo's own, so that a second run may clear what the first left.
MARKER = ".tidemesh-demo"


def _afresh(base: Path, homes: dict[str, Path]) -> None:
    """Start from nothing: a second run in the same --home would find its mesh and members
    already there. Only a folder the demo made (it holds the marker) is cleared."""
    if (base / MARKER).exists():
        for h in homes.values():
            shutil.rmtree(h, ignore_errors=True)
        _step(f"cleared the previous demo's files under {base}")
    elif base.exists() and any(base.iterdir()):
        raise click.UsageError(f"{base} holds files the demo did not make; give --home a new "
                               "or empty folder (or one an earlier demo used)")
    base.mkdir(parents=True, exist_ok=True)
    (base / MARKER).write_text("made by `tidemesh demo`; it clears this folder's broker, "
                               "alice and bob at its next run\n", encoding="utf-8")
    for h in homes.values():
        h.mkdir(parents=True, exist_ok=True)


def _run(homes: dict[str, Path], store: str, port: int) -> None:
    keys = {}
    for name in ("alice", "bob"):
        invite = _tidemesh(homes["broker"], "broker", "invite", "create", "--mesh", MESH,
                           "--url", f"ws://127.0.0.1:{port}", "--store", store)
        _tidemesh(homes[name], "daemon", "join", invite, "--mesh", MESH, "--name", name)
        _tidemesh(homes[name], "daemon", "up", "--mesh", MESH)
        client = _client(homes[name])
        _wait(f"{name}'s daemon to connect", lambda c=client: c.health()["connected"])
        keys[name] = client.health()["member_pubkey"]
        _step(f"{name} joined by invite and is connected; member key {keys[name][:16]}…")
    alice, bob = _client(homes["alice"]), _client(homes["bob"])
    bob.membership("topic", "subscribe", "general", create=True)
    _step("bob subscribed to topic 'general'")
    sent = [
        alice.send({"to": "topic:general", "body": "hello, mesh"}, "demo-topic-1"),
        alice.send({"to": f"dm:{keys['bob']}", "body": "hi bob, this one is sealed for you"},
                   "demo-dm-1"),
        alice.send({"to": "topic:general", "body": "hello, mesh"}, "demo-topic-1"),
    ]
    _step("alice sent a topic message and a DM, then retried the topic message with the "
          "same id: " + ", ".join(f"{r['client_message_id']} → {r['status']}" for r in sent))
    _wait("bob's inbox to hold both messages", lambda: len(bob.inbox()["items"]) >= 2)
    _wait("alice's outbox to be delivered",
          lambda: alice.outbox_list()["counts"]["done"] == 2)
    time.sleep(0.5)
    _step("bob's inbox (each message exactly once)")
    for e in bob.inbox()["items"]:
        click.echo(f"    #{e['seq']} {e['to']['kind']}:{e['to']['ref'][:16]} from "
                   f"{e['from'][:16]}… id {e['client_message_id']}: {e['body']!r}")
    _step("bob's event stream (GET /v1/events, resumable by id)")
    for ev in bob.events(since=0, idle_timeout=1.0):
        detail = ev.data.get("body") or ev.data.get("state")
        ev_id = ev.id if isinstance(ev, Event) else "-"
        click.echo(f"    id {ev_id:>3}  {ev.type:14} {detail!r}")
    counts = alice.outbox_list()["counts"]
    _step("alice's outbox: " + ", ".join(f"{k}={v}" for k, v in counts.items()))


def _where(homes: dict[str, Path], store: str) -> None:
    _step("where everything lives")
    click.echo(f"    broker store   {store}")
    for name in ("alice", "bob"):
        p = daemon_paths(MESH, {"TIDEMESH_HOME": str(homes[name])})
        click.echo(f"    {name:5} outbox  {p.outbox_db}")
        click.echo(f"    {name:5} inbox   {p.inbox_db}")
        click.echo(f"    {name:5} socket  {p.socket} (removed on stop)")
        click.echo(f"    {name:5} log     {p.log_file}")
