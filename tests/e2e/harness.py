"""Real processes for end-to-end tests: a broker (SQLite or PostgreSQL) and joined daemons."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.daemon.harness import RunningDaemon, daemon_env, run_cli, start_daemon


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Broker:
    home: Path
    store: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    launcher: tuple[str, ...] = (sys.executable, "-m", "tidemesh")
    # Each mesh's shared invite, made on first use: one CLI process per mesh, not one per
    # joined daemon (each costs ~0.7 s of CPU, and the suite starts hundreds).
    _invites: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        log = open(self.home / "broker.out", "ab")  # noqa: SIM115 - lives with the process
        self.proc = subprocess.Popen(
            [*self.launcher, "broker", "up", "--store", self.store,
             "--listen", f"127.0.0.1:{self.port}"],
            stdout=subprocess.PIPE, stderr=log, env=daemon_env(self.home, self.env))
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                log = (self.home / "broker.out").read_text()[-2000:]
                raise RuntimeError(f"broker exited: {log}")
            if b"broker_ready" in line:
                return
        raise RuntimeError("broker did not become ready")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(20)

    def cli(self, *args: str) -> str:
        res = run_cli(self.home, "broker", *args, "--store", self.store)
        assert res.returncode == 0, res.stderr + res.stdout
        return res.stdout.strip()

    def invite(self, mesh: str, uses: int | None = None) -> str:
        """A fresh invite to ``mesh`` with ``uses``; without, the mesh's shared one (64 uses)."""
        if uses is not None:
            return self._create_invite(mesh, uses)
        if mesh not in self._invites:
            self._invites[mesh] = self._create_invite(mesh, 64)
        return self._invites[mesh]

    def _create_invite(self, mesh: str, uses: int) -> str:
        return self.cli("invite", "create", "--mesh", mesh, "--uses", str(uses), "--url", self.url)


def sqlite_broker_with_team(root: Path) -> Broker:
    """A broker on an embedded store under ``root``, with mesh ``team``, not started."""
    home = root / "broker"
    home.mkdir()
    b = Broker(home, f"sqlite://{home}/broker.db")
    b.cli("mesh", "create", "team")
    return b


@dataclass
class Mesh:
    broker: Broker
    name: str
    daemons: dict[str, RunningDaemon] = field(default_factory=dict)

    def add(self, label: str, root: Path,
            extra_env: dict[str, str] | None = None) -> RunningDaemon:
        home = root / label
        home.mkdir()
        res = run_cli(home, "daemon", "join", self.broker.invite(self.name), "--mesh", "m",
                      "--name", label)
        assert res.returncode == 0, res.stderr + res.stdout
        d = start_daemon(home, "m", extra_env)
        self.daemons[label] = d
        return d

    def restart(self, label: str) -> RunningDaemon:
        old = self.daemons[label]
        d = start_daemon(old.home, "m", old.extra_env or None)
        self.daemons[label] = d
        return d

    def stop(self) -> None:
        """Stop every daemon, then the broker (a test's teardown)."""
        for d in self.daemons.values():
            d.stop()
        self.broker.stop()


@contextmanager
def team_on(store_kind: str, request: Any, root: Path) -> Iterator[Mesh]:
    """Mesh ``team`` on a started broker of ``store_kind`` (sqlite, or postgres through the
    ``pg_database`` fixture), stopped after."""
    home = root / "broker"
    home.mkdir()
    store = (f"sqlite://{home}/broker.db" if store_kind == "sqlite"
             else request.getfixturevalue("pg_database"))
    broker = Broker(home, store)
    broker.cli("mesh", "create", "team")
    broker.start()
    m = Mesh(broker, "team")
    try:
        yield m
    finally:
        m.stop()


async def two_on_topic(mesh: Mesh, root: Path, topic: str = "ops"
                       ) -> tuple[RunningDaemon, RunningDaemon]:
    """Daemons ``a`` and ``b``, both connected, ``b`` subscribed to ``topic``."""
    a, b = mesh.add("a", root), mesh.add("b", root)
    await wait_for(lambda: connected(a))
    await wait_for(lambda: connected(b))
    async with b.session() as s, s.post("/v1/topics/subscribe",
                                        json={"name": topic, "create": True}) as r:
        assert r.status == 200, await r.text()
    return a, b


def pubkey(d: RunningDaemon) -> str:
    return str(json.loads(d.paths.keypair.read_text())["ed25519_public"])


async def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> None:
    """Poll an (async or sync) predicate until it holds; fail with what it last saw."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last: {last!r})")


async def connected(d: RunningDaemon) -> bool:
    async with d.session() as s, s.get("/v1/health") as r:
        return bool((await r.json())["connected"])


async def send_keyed(d: RunningDaemon, to: str, cid: str, body: str) -> None:
    """POST /v1/send under Idempotency-Key ``cid``; accepted, or the test fails."""
    async with d.session() as s, s.post("/v1/send", json={"to": to, "body": body},
                                        headers={"Idempotency-Key": cid}) as r:
        assert r.status == 202, await r.text()


async def outbox_done(d: RunningDaemon, n: int) -> bool:
    """Whether exactly ``n`` of the daemon's outbox rows reached the broker."""
    async with d.session() as s, s.get("/v1/outbox", params={"status": "done"}) as r:
        return len((await r.json())["items"]) == n


async def inbox(d: RunningDaemon, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    after = 0
    async with d.session() as s:
        while True:
            async with s.get("/v1/inbox", params={"after": after, "limit": 1000,
                                                  **params}) as r:
                page = await r.json()
            items += page["items"]
            if len(page["items"]) < 1000 and not page.get("more"):   # more: cut by bytes
                return items
            after = page["next_after"]
