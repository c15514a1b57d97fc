"""Broker fixtures: a real store on each adapter (SQLite file, PostgreSQL database per test)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nacl.signing import SigningKey

from tidemesh.broker.accept import AcceptInput, Limits, prepare
from tidemesh.broker.store import open_store
from tidemesh.broker.store.base import Store
from tidemesh.core import handshake
from tidemesh.core.wire import decode, encode

LIMITS = Limits(inline_bytes=1 << 20, dedupe_mode="retention_scoped", dedupe_retention_days=7)


def now_ms() -> int:
    return int(time.time() * 1000)


def new_pubkey() -> str:
    return bytes(SigningKey.generate().verify_key).hex()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'broker.db'}"
    url: str = request.getfixturevalue("pg_database")
    return url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = await open_store(store_url)
    try:
        yield s
    finally:
        await s.close()


def send_frame(cmid: str, kind: str = "topic", ref: str = "ops", body: str = "hello",
               **extra: Any) -> dict[str, Any]:
    frame: dict[str, Any] = {"type": "send", "id": "r1", "client_message_id": cmid,
                             "to": {"kind": kind, "ref": ref}, "body": body,
                             "body_encoding": "utf8", "priority": "next"}
    frame.update(extra)
    return frame


def accept_input(mesh_id: str, sender: str, cmid: str, limits: Limits = LIMITS,
                 at: int | None = None, **kw: Any) -> AcceptInput:
    return prepare(send_frame(cmid, **kw), mesh_id, sender, limits, at or now_ms())


async def say_hello(ws: Any, mesh_id: str, key: SigningKey, *, acked: bool = True) -> None:
    """A member's hello on a fresh connection: the challenge read, the hello signed and sent,
    and (``acked``) its ``hello_ack`` read."""
    nonce = decode(await ws.recv())["nonce"]
    pk, sig = handshake.sign(key, mesh_id, nonce)
    await ws.send(encode({"type": "hello", "mesh_id": mesh_id, "pubkey": pk, "nonce": nonce,
                          "signature": sig}))
    if acked:
        assert decode(await ws.recv())["type"] == "hello_ack"
